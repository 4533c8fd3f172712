package upgrade

import (
	"context"

	"github.com/jackc/pgx/v5"

	"github.com/pgfork/pgfork/pgdata"
)

// Small helpers exported for upgrade/logical, which builds on this
// package's reading of catalogs and clones.

// Fingerprint returns the catalog fingerprint of the database conn is
// connected to: an md5 of its user relations with their kinds, functions
// with their signatures, types and extensions (what the upgrade compares
// between the rehearsal and the stop).
func Fingerprint(ctx context.Context, conn *pgx.Conn) (string, error) {
	var in dbInfo
	err := conn.QueryRow(ctx, inspectSQL).Scan(&in.relations, &in.extensions, &in.fingerprint)
	return in.fingerprint, err
}

// QuoteLiteral quotes s as an SQL string literal, whatever
// standard_conforming_strings says (an escape string, E'…', when s holds a backslash).
func QuoteLiteral(s string) string { return quoteLiteral(s) }

// RecoverySettings returns the settings an online clone must start with to
// replay its source's WAL: the values pg_control records for
// max_connections, max_prepared_transactions, max_locks_per_transaction,
// max_worker_processes and max_wal_senders.
func RecoverySettings(ctl *pgdata.ControlData) map[string]string { return recoverySettings(ctl) }

// HandOver is what the hand-over carries from a running old cluster to the
// new one: its authentication files, port, socket directories, listen
// addresses and SSL settings (see docs/upgrade.md, "What the hand-over
// carries").
type HandOver struct {
	u *upgrader
	c *oldConfig
}

// ReadHandOver reads what a hand-over carries from the running old cluster
// in o.OldDir (o.Old, o.New, o.NewDir, o.User and o.Superuser are used),
// and refuses as the hand-over does: a configuration it cannot read, or
// local trust on a socket directory other OS users can reach.
func ReadHandOver(ctx context.Context, o Options) (*HandOver, error) {
	u := &upgrader{o: o}
	c, err := u.readOldConfig(ctx, true)
	if err != nil {
		return nil, err
	}
	if _, err := u.checkTrust(ctx, c); err != nil {
		return nil, err
	}
	return &HandOver{u: u, c: c}, nil
}

// Carry gives the new cluster (o.NewDir; conn: a superuser's connection to
// it) what h read, by ALTER SYSTEM and copied files; it takes effect at the
// new cluster's next start. It returns what it did, for a summary.
func (h *HandOver) Carry(ctx context.Context, conn *pgx.Conn) ([]string, error) {
	return h.u.carry(ctx, conn, h.c)
}
