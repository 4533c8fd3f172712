package logical

import (
	"context"
	"fmt"
	"slices"
	"strings"

	"github.com/jackc/pgx/v5"

	"github.com/pgfork/pgfork/internal/errs"
	"github.com/pgfork/pgfork/pgdata"
)

// Which databases need a subscription is proven from the old cluster's
// WAL: every change to a database's relations, sequences, catalogs and
// large objects is a WAL record with a block reference naming the
// database (shared catalogs name database 0). A database none of whose
// blocks changed after R is on the new cluster as it is on the old one
// (the clone stopped just before R), so it needs no subscription, no WAL
// sender and no apply worker; only its slot, created at R like every
// other, which is what makes the hand-over exact for those that do write.
//
// pg_walinspect (contrib, PostgreSQL 15+) reads the WAL on the server.
// Its functions need an extension, which needs a database: each scan
// creates it in a transaction on the control connection (template1, which
// the run does not replicate) and rolls that transaction back, so nothing
// is left behind on the old cluster, not even after a kill -9 (the server
// aborts the transaction of a lost session). Where the extension is in
// template1 already, that one is used.
//
// A transaction running at R whose commit record comes after R but whose
// changes all came before R is decoded from its slot and applied: the
// first scan starts at the earliest restart_lsn of the run's slots (every
// transaction running at R began after the slot consistent at R started,
// see slots), and a change before R counts when its transaction (or, for
// a subtransaction, its top-level one) did not end before R.
//
// False positives (pruning and hint-bit records a read writes, autovacuum,
// ANALYZE) only subscribe a database more.

// walScan is the state of the WAL scans of one run.
type walScan struct {
	// ok: pg_walinspect is available; otherwise every database is
	// subscribed (as before the scan existed).
	ok bool
	// R is where replication starts; from where the next scan starts.
	R, from pgdata.LSN
}

// scanSchema is where a scan creates pg_walinspect, in its transaction.
const scanSchema = "pgfork_upgrade_walscan"

// blockRef finds the database of each block reference in
// pg_get_wal_records_info's block_ref text ("blkref #0: rel
// TABLESPACE/DATABASE/RELFILENODE …", PostgreSQL 15-18).
const blockRef = `rel [0-9]+/([0-9]+)/[0-9]+`

// scanSQL returns, for the WAL from $1 to $2, the end of the last record
// read and the databases written: a block reference at or after R ($3),
// or before R by a transaction that did not end before R. schema holds
// pg_walinspect.
func scanSQL(schema string) string {
	return `WITH w AS (
  SELECT start_lsn, end_lsn, xid::text AS xid, resource_manager, record_type, description, block_ref
  FROM ` + pgx.Identifier{schema}.Sanitize() + `.pg_get_wal_records_info($1::pg_lsn, $2::pg_lsn)
), b AS (
  SELECT w.start_lsn, w.xid, m[1]::oid AS db
  FROM w, regexp_matches(w.block_ref, '` + blockRef + `', 'g') m
  WHERE w.block_ref IS NOT NULL
), ended AS (
  SELECT w.xid FROM w WHERE w.start_lsn < $3::pg_lsn AND w.resource_manager = 'Transaction'
    AND w.record_type IN ('COMMIT', 'ABORT', 'COMMIT_PREPARED', 'ABORT_PREPARED')
  UNION ALL
  SELECT s FROM w, regexp_split_to_table(substring(w.description FROM 'subxacts: ([0-9 ]+)'), ' ') s
  WHERE w.start_lsn < $3::pg_lsn AND w.resource_manager = 'Transaction'
    AND w.record_type IN ('COMMIT', 'ABORT', 'COMMIT_PREPARED', 'ABORT_PREPARED') AND s <> ''
)
SELECT (SELECT max(end_lsn)::text FROM w),
  coalesce((SELECT array_agg(DISTINCT b.db) FROM b
    WHERE b.start_lsn >= $3::pg_lsn OR (b.xid <> '0' AND b.xid NOT IN (SELECT xid FROM ended))), '{}')`
}

// walInspect is the extension scanAvailable looks for: pg_walinspect
// (tests name one no server offers, to run the path without it).
var walInspect = "pg_walinspect"

// scanAvailable reports whether the old cluster offers pg_walinspect.
func (r *run) scanAvailable(ctx context.Context) (bool, error) {
	if r.o.Old.Major < 15 {
		return false, nil
	}
	var n int
	if err := r.control.QueryRow(ctx, `SELECT count(*) FROM pg_available_extensions WHERE name = $1`, walInspect).Scan(&n); err != nil {
		return false, errs.Wrap(errs.Internal, err, "cannot read the old cluster's available extensions")
	}
	return n > 0, nil
}

// scanWAL reads the old cluster's WAL from where the last scan ended to
// its current flush position (after a commit that flushes everything
// written before the call) and returns the databases of the run it found
// written that have no subscription yet.
func (r *run) scanWAL(ctx context.Context) ([]*database, error) {
	c := r.control
	// A commit of its own, flushed: every record written before it is
	// flushed too, and read by this scan (local: a synchronous standby's
	// answer is not waited for).
	b := &pgx.Batch{}
	b.Queue("BEGIN")
	b.Queue("SET LOCAL synchronous_commit = local")
	b.Queue("SELECT pg_logical_emit_message(true, 'pgfork', 'upgrade --logical: WAL scan')")
	b.Queue("COMMIT")
	if err := c.SendBatch(ctx, b).Close(); err != nil {
		return nil, errs.Wrap(errs.Internal, err, "cannot write a WAL record for the scan on the old cluster")
	}
	var endText string
	if err := c.QueryRow(ctx, "SELECT pg_current_wal_flush_lsn()::text").Scan(&endText); err != nil {
		return nil, errs.Wrap(errs.Internal, err, "cannot read the old cluster's WAL position")
	}
	end, err := pgdata.ParseLSN(endText)
	if err != nil {
		return nil, errs.Wrap(errs.Internal, err, "bad LSN %q", endText)
	}
	if r.scan.from >= end {
		return nil, nil
	}
	tx, err := c.Begin(ctx)
	if err != nil {
		return nil, errs.Wrap(errs.Internal, err, "cannot scan the old cluster's WAL")
	}
	// Rolled back: the extension, created for this scan, goes with it.
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
	var schema string
	if err := tx.QueryRow(ctx, `SELECT coalesce((SELECT extnamespace::regnamespace::text FROM pg_extension WHERE extname = 'pg_walinspect'), '')`).Scan(&schema); err != nil {
		return nil, errs.Wrap(errs.Internal, err, "cannot read the extensions of template1 on the old cluster")
	}
	if schema == "" {
		schema = scanSchema
		if _, err := tx.Exec(ctx, "CREATE SCHEMA "+pgx.Identifier{schema}.Sanitize()); err != nil {
			return nil, errs.Wrap(errs.Internal, err, "cannot create a schema for pg_walinspect in template1 on the old cluster (rolled back after the scan)")
		}
		if _, err := tx.Exec(ctx, "CREATE EXTENSION pg_walinspect SCHEMA "+pgx.Identifier{schema}.Sanitize()); err != nil {
			return nil, errs.Wrap(errs.Internal, err, "cannot create pg_walinspect in template1 on the old cluster (rolled back after the scan)")
		}
	} else {
		schema = strings.Trim(schema, `"`)
	}
	var last *string
	var oids []uint32
	if err := tx.QueryRow(ctx, scanSQL(schema), r.scan.from.String(), end.String(), r.scan.R.String()).Scan(&last, &oids); err != nil {
		return nil, errs.Wrap(errs.Internal, err, "cannot read the old cluster's WAL from %s to %s with pg_walinspect", r.scan.from, end)
	}
	// The next scan starts where the last record read ended: one that
	// crosses end (flushed in part) is read then.
	if last != nil {
		l, err := pgdata.ParseLSN(*last)
		if err != nil {
			return nil, errs.Wrap(errs.Internal, err, "bad LSN %q", *last)
		}
		r.scan.from = max(r.scan.from, l)
	}
	var found []*database
	for _, d := range r.dbs {
		if !d.sub && slices.Contains(oids, d.oid) {
			found = append(found, d)
		}
	}
	return found, nil
}

// names lists the databases' names, the first few and how many more.
func names(dbs []*database) string {
	var n []string
	for _, d := range dbs[:min(len(dbs), 10)] {
		n = append(n, d.name)
	}
	s := strings.Join(n, ", ")
	if len(dbs) > 10 {
		s += fmt.Sprintf(" and %d more", len(dbs)-10)
	}
	return s
}

// subscribed returns the databases with a subscription.
func (r *run) subscribed() []*database {
	var s []*database
	for _, d := range r.dbs {
		if d.sub {
			s = append(s, d)
		}
	}
	return s
}

// checkSenders refuses to subscribe k more databases when the old cluster
// has fewer free WAL senders (each subscription streams through one; an
// apply worker refused one would fail until the deadline).
func (r *run) checkSenders(ctx context.Context, k int) error {
	var maxSenders, others int
	if err := r.control.QueryRow(ctx, `SELECT current_setting('max_wal_senders')::int,
		(SELECT count(*) FROM pg_stat_replication WHERE application_name NOT LIKE 'pgfork\_upgrade\_%')`).Scan(&maxSenders, &others); err != nil {
		return errs.Wrap(errs.Internal, err, "cannot read the replication settings")
	}
	have := len(r.subscribed())
	if free := maxSenders - others - have; free < k {
		return errs.New(errs.Unsupported, "%d databases of the old cluster were written during the run, one WAL sender each, but it has max_wal_senders = %d with %d used by others: %d free for %d",
			have+k, maxSenders, others, maxSenders-others, have+k).
			WithHint("raise max_wal_senders to at least %d (ALTER SYSTEM, then a restart), then run again", others+have+k)
	}
	return nil
}
