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

// RecoverySettings returns the settings an online clone must start with to
// replay its source's WAL: the values pg_control records for
// max_connections, max_prepared_transactions, max_locks_per_transaction,
// max_worker_processes and max_wal_senders.
func RecoverySettings(ctl *pgdata.ControlData) map[string]string { return recoverySettings(ctl) }
