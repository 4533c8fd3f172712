package dbstore

import (
	"context"

	"github.com/jackc/pgx/v5"

	"github.com/pgfork/pgfork/internal/errs"
	"github.com/pgfork/pgfork/pool"
)

// trackTable records the test databases made by a server by oid, which a
// rename does not change: a client that renames its test database cannot
// make it outlive an admin reset or a restart.
const trackTable = "pgfork_serve_databases"

// Create makes the copy and records its oid (when template state is kept).
func (s *adminStore) Create(ctx context.Context, name, template, owner string) (string, error) {
	strategy, err := s.Creator.Create(ctx, name, template, owner)
	if err != nil || s.prefix == "" {
		return strategy, err
	}
	if _, err := s.admin.Exec(ctx, `INSERT INTO `+trackTable+` (prefix, oid)
		SELECT $1, oid FROM pg_database WHERE datname = $2 ON CONFLICT DO NOTHING`, s.prefix, name); err != nil {
		return strategy, errs.Wrap(errs.Internal, err, "cannot record test database %s", name)
	}
	return strategy, nil
}

// Sweep drops every recorded test database that still exists, under
// whatever name it has now (with renamedOnly, only those no longer named
// <prefix>_test_…: the others belong to live pools), and forgets the
// records of those gone.
func (s *adminStore) Sweep(ctx context.Context, renamedOnly bool) error {
	return s.sweep(ctx, renamedOnly, nil)
}

// sweep is Sweep leaving the databases of oids alone (kept ones, at start).
func (s *adminStore) sweep(ctx context.Context, renamedOnly bool, except []uint32) error {
	if s.prefix == "" {
		return nil
	}
	if except == nil {
		except = []uint32{}
	}
	rows, err := s.admin.Query(ctx, `SELECT d.datname FROM `+trackTable+` t JOIN pg_database d ON d.oid = t.oid
		WHERE t.prefix = $1 AND NOT ($2 AND starts_with(d.datname, $3)) AND d.oid <> ALL($4::oid[])`, s.prefix, renamedOnly, s.prefix+"_test_", except)
	if err != nil {
		return errs.Wrap(errs.Internal, err, "cannot list test databases")
	}
	var names []string
	for rows.Next() {
		var n string
		if err := rows.Scan(&n); err != nil {
			rows.Close()
			return err
		}
		names = append(names, n)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return errs.Wrap(errs.Internal, err, "cannot list test databases")
	}
	if err := dropAll(ctx, s.admin, names); err != nil {
		return err
	}
	if _, err := s.admin.Exec(ctx, `DELETE FROM `+trackTable+` t WHERE prefix = $1
		AND NOT EXISTS (SELECT 1 FROM pg_database d WHERE d.oid = t.oid)`, s.prefix); err != nil {
		return errs.Wrap(errs.Internal, err, "cannot forget dropped test databases")
	}
	return nil
}

// initTracking creates the table and sweeps what an earlier run left,
// but the kept databases (oids).
func (s *adminStore) initTracking(ctx context.Context, prefix string, kept []uint32) error {
	if _, err := s.admin.Exec(ctx, `CREATE TABLE IF NOT EXISTS `+trackTable+` (
		prefix text NOT NULL, oid oid NOT NULL, PRIMARY KEY (prefix, oid))`); err != nil {
		return errs.Wrap(errs.Internal, err, "cannot create the table %s", trackTable)
	}
	s.prefix = prefix
	return s.sweep(ctx, false, kept)
}

// keptTable records the test databases clients kept for inspection, by
// oid, so that a restart leaves them (and their pools count them).
const keptTable = "pgfork_serve_kept"

// keptOids creates the kept table, forgets the kept databases gone and
// returns the oids of those left.
func (s *adminStore) keptOids(ctx context.Context, prefix string) ([]uint32, error) {
	// Gone, or renamed by a client: no longer kept (a renamed one is the
	// client's to drop; Sweep drops it with the others).
	return s.liveOids(ctx, prefix, keptTable, "kept timestamptz NOT NULL DEFAULT now()", "kept")
}

// liveOids creates table (prefix, oid, hash, id, database and extra
// columns, by oid) if it is not there, forgets the rows of databases gone
// or renamed, and returns the oids of prefix's rows left; what names them
// in errors.
func (s *adminStore) liveOids(ctx context.Context, prefix, table, extra, what string) ([]uint32, error) {
	if _, err := s.admin.Exec(ctx, `CREATE TABLE IF NOT EXISTS `+table+` (
		prefix text NOT NULL, oid oid NOT NULL, hash text NOT NULL, id int NOT NULL,
		database text NOT NULL, `+extra+`, PRIMARY KEY (prefix, oid))`); err != nil {
		return nil, errs.Wrap(errs.Internal, err, "cannot create the table %s", table)
	}
	if _, err := s.admin.Exec(ctx, `DELETE FROM `+table+` k WHERE prefix = $1 AND NOT EXISTS
		(SELECT 1 FROM pg_database d WHERE d.oid = k.oid AND d.datname = k.database)`, prefix); err != nil {
		return nil, errs.Wrap(errs.Internal, err, "cannot forget %s databases gone", what)
	}
	rows, err := s.admin.Query(ctx, `SELECT oid FROM `+table+` WHERE prefix = $1`, prefix)
	if err != nil {
		return nil, errs.Wrap(errs.Internal, err, "cannot list %s databases", what)
	}
	oids, err := pgx.CollectRows(rows, pgx.RowTo[uint32])
	if err != nil {
		return nil, errs.Wrap(errs.Internal, err, "cannot list %s databases", what)
	}
	return oids, nil
}

// SaveKept records test database k.Name as kept (pool.KeptStore).
func (s *adminStore) SaveKept(ctx context.Context, prefix string, k pool.Kept) error {
	if _, err := s.admin.Exec(ctx, `INSERT INTO `+keptTable+` (prefix, oid, hash, id, database, kept)
		SELECT $1, oid, $2, $3, datname, $5 FROM pg_database WHERE datname = $4 ON CONFLICT DO NOTHING`,
		prefix, k.Hash, k.ID, k.Name, k.At); err != nil {
		return errs.Wrap(errs.Internal, err, "cannot record kept database %s", k.Name)
	}
	return nil
}

// Kept lists the kept databases that still exist under their names
// (pool.KeptStore), oldest first.
func (s *adminStore) Kept(ctx context.Context, prefix string) ([]pool.Kept, error) {
	rows, err := s.admin.Query(ctx, `SELECT k.hash, k.id, k.database, k.kept FROM `+keptTable+` k
		JOIN pg_database d ON d.oid = k.oid AND d.datname = k.database WHERE k.prefix = $1 ORDER BY k.kept`, prefix)
	if err != nil {
		return nil, errs.Wrap(errs.Internal, err, "cannot list kept databases")
	}
	var out []pool.Kept
	for rows.Next() {
		var k pool.Kept
		if err := rows.Scan(&k.Hash, &k.ID, &k.Name, &k.At); err != nil {
			rows.Close()
			return nil, errs.Wrap(errs.Internal, err, "cannot list kept databases")
		}
		out = append(out, k)
	}
	rows.Close()
	return out, rows.Err()
}

// readyTable records the fresh test databases a pool left ready when the
// server stopped cleanly (pool.ReadyStore), by oid: the next start hands
// them out instead of making them again.
const readyTable = "pgfork_serve_ready"

// readyOids creates the ready table, forgets the rows of databases gone
// or renamed and returns the oids of those left, which Recover leaves in
// place.
func (s *adminStore) readyOids(ctx context.Context, prefix string) ([]uint32, error) {
	return s.liveOids(ctx, prefix, readyTable, "at timestamptz NOT NULL DEFAULT now()", "ready")
}

// SaveReady records the fresh test databases ks as left ready by a clean
// stop (pool.ReadyStore), in one statement.
func (s *adminStore) SaveReady(ctx context.Context, prefix string, ks []pool.Kept) error {
	hashes, ids, names := make([]string, len(ks)), make([]int32, len(ks)), make([]string, len(ks))
	for i, k := range ks {
		hashes[i], ids[i], names[i] = k.Hash, int32(k.ID), k.Name
	}
	if _, err := s.admin.Exec(ctx, `INSERT INTO `+readyTable+` (prefix, oid, hash, id, database)
		SELECT $1, d.oid, k.hash, k.id, d.datname FROM unnest($2::text[], $3::int[], $4::text[]) AS k(hash, id, name)
		JOIN pg_database d ON d.datname = k.name ON CONFLICT DO NOTHING`, prefix, hashes, ids, names); err != nil {
		return errs.Wrap(errs.Internal, err, "cannot record %d ready databases", len(ks))
	}
	return nil
}

// TakeReady returns the databases the last clean stop left ready, still
// there under their names (pool.ReadyStore), and forgets them: from now
// on they are test copies like any other, swept after a crash.
func (s *adminStore) TakeReady(ctx context.Context, prefix string) ([]pool.Kept, error) {
	if _, err := s.readyOids(ctx, prefix); err != nil {
		return nil, err
	}
	rows, err := s.admin.Query(ctx, `DELETE FROM `+readyTable+` WHERE prefix = $1 RETURNING hash, id, database`, prefix)
	if err != nil {
		return nil, errs.Wrap(errs.Internal, err, "cannot list ready databases")
	}
	var out []pool.Kept
	for rows.Next() {
		var k pool.Kept
		if err := rows.Scan(&k.Hash, &k.ID, &k.Name); err != nil {
			rows.Close()
			return nil, errs.Wrap(errs.Internal, err, "cannot list ready databases")
		}
		out = append(out, k)
	}
	rows.Close()
	return out, rows.Err()
}
