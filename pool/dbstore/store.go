// Package dbstore is the pool.Store of database isolation: templates and
// test databases inside one PostgreSQL server, reached over an admin
// connection pool; template state and the oids of test databases live in
// tables of its admin database. It owns the SQL of `pgfork serve`; the
// pool package has none.
package dbstore

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgfork/pgfork/dbclone"
	"github.com/pgfork/pgfork/internal/errs"
	"github.com/pgfork/pgfork/pool"
)

// adminStore keeps templates and test databases in one server, reached
// over an admin connection pool; template state lives in a table of its
// admin database.
type adminStore struct {
	pool.Creator
	admin  *pgxpool.Pool
	prefix string // set by Recover when test databases are tracked (tracked.go)
}

// New returns the pool.Store of database isolation: templates and
// test databases inside the server of admin, test databases made by creator.
func New(admin *pgxpool.Pool, creator pool.Creator) pool.Store {
	return &adminStore{Creator: creator, admin: admin}
}

// stateTable keeps template state across restarts, in the admin database.
const stateTable = "pgfork_serve_templates"

// epochTable counts the starts of the server, per prefix.
const epochTable = "pgfork_serve_epochs"

// Sessions forwards to the creator's SessionCounter, so that pools of
// database isolation reclaim only databases seen without sessions.
func (s *adminStore) Sessions(ctx context.Context, names []string) (map[string]pool.Sessions, error) {
	sc, ok := s.Creator.(pool.SessionCounter)
	if !ok {
		return nil, errs.New(errs.Unsupported, "the creator cannot count sessions")
	}
	return sc.Sessions(ctx, names)
}

// SharesBlocks forwards to the creator's pool.BlockSharer (false without
// one).
func (s *adminStore) SharesBlocks() bool {
	b, ok := s.Creator.(pool.BlockSharer)
	return ok && b.SharesBlocks()
}

// Prewarm forwards to the creator's pool.Prewarmer (nothing without one).
func (s *adminStore) Prewarm(ctx context.Context, name, strategy string) {
	if p, ok := s.Creator.(pool.Prewarmer); ok {
		p.Prewarm(ctx, name, strategy)
	}
}

// Flush forwards to the creator's pool.Flusher, so that pools of database
// isolation write their new copies to disk between runs.
func (s *adminStore) Flush(ctx context.Context) error {
	f, ok := s.Creator.(pool.Flusher)
	if !ok {
		return errs.New(errs.Unsupported, "the creator cannot flush")
	}
	return f.Flush(ctx)
}

// Rename forwards to the creator's pool.Retirer, so that pools of database
// isolation recreate by renaming the used copy away.
func (s *adminStore) Rename(ctx context.Context, from, to string) error {
	r, ok := s.Creator.(pool.Retirer)
	if !ok {
		return errs.New(errs.Unsupported, "the creator cannot rename databases")
	}
	return r.Rename(ctx, from, to)
}

func (s *adminStore) Recover(ctx context.Context, prefix, testPrefix string, persist bool) ([]pool.Record, int, error) {
	kept := []uint32{}
	if persist {
		var err error
		if kept, err = s.keptOids(ctx, prefix); err != nil {
			return nil, 0, err
		}
		ready, err := s.readyOids(ctx, prefix)
		if err != nil {
			return nil, 0, err
		}
		kept = append(kept, ready...)
	}
	var leftovers []string
	rows, err := s.admin.Query(ctx, "SELECT datname FROM pg_database WHERE starts_with(datname, $1) AND oid <> ALL($2::oid[])", testPrefix, kept)
	if err != nil {
		return nil, 0, errs.Wrap(errs.Internal, err, "cannot list databases")
	}
	for rows.Next() {
		var n string
		if err := rows.Scan(&n); err != nil {
			rows.Close()
			return nil, 0, err
		}
		leftovers = append(leftovers, n)
	}
	rows.Close()
	if err := dropAll(ctx, s.admin, leftovers); err != nil {
		return nil, 0, err
	}
	if !persist {
		return nil, 0, nil
	}
	if err := s.initTracking(ctx, prefix, kept); err != nil {
		return nil, 0, err
	}
	if _, err := s.admin.Exec(ctx, `CREATE TABLE IF NOT EXISTS `+stateTable+` (
		prefix text NOT NULL, hash text NOT NULL, database text NOT NULL,
		state text NOT NULL, updated timestamptz NOT NULL DEFAULT now(),
		PRIMARY KEY (prefix, hash));
		ALTER TABLE `+stateTable+` ADD COLUMN IF NOT EXISTS demand int NOT NULL DEFAULT 0`); err != nil {
		return nil, 0, errs.Wrap(errs.Internal, err, "cannot create the state table %s", stateTable)
	}
	if _, err := s.admin.Exec(ctx, `CREATE TABLE IF NOT EXISTS `+epochTable+` (
		prefix text PRIMARY KEY, epoch int NOT NULL)`); err != nil {
		return nil, 0, errs.Wrap(errs.Internal, err, "cannot create the table %s", epochTable)
	}
	var epoch int
	if err := s.admin.QueryRow(ctx, `INSERT INTO `+epochTable+` (prefix, epoch) VALUES ($1, 1)
		ON CONFLICT (prefix) DO UPDATE SET epoch = `+epochTable+`.epoch + 1 RETURNING epoch`, prefix).Scan(&epoch); err != nil {
		return nil, 0, errs.Wrap(errs.Internal, err, "cannot count server starts")
	}
	var recs []pool.Record
	rows, err = s.admin.Query(ctx, `SELECT hash, database, state, demand FROM `+stateTable+` WHERE prefix = $1`, prefix)
	if err != nil {
		return nil, 0, errs.Wrap(errs.Internal, err, "cannot read template state")
	}
	for rows.Next() {
		var r pool.Record
		if err := rows.Scan(&r.Hash, &r.Name, &r.State, &r.Demand); err != nil {
			rows.Close()
			return nil, 0, err
		}
		recs = append(recs, r)
	}
	rows.Close()
	// The server removes every catalog cache file when it starts (see
	// writeCatalogCache): write the finalized templates' again before their
	// pools copy them, or every copy made after a restart goes without.
	var finalized []string
	for _, r := range recs {
		if r.State == "finalized" {
			finalized = append(finalized, r.Name)
		}
	}
	if len(finalized) == 0 {
		return recs, epoch, nil
	}
	// Only a superuser passes CONNECTION LIMIT 0 (see rewriteCatalogCache).
	var super bool
	if err := s.admin.QueryRow(ctx, "SELECT rolsuper FROM pg_roles WHERE rolname = current_user").Scan(&super); err != nil {
		return nil, 0, errs.Wrap(errs.Internal, err, "cannot read the server role's attributes")
	}
	if !super {
		return recs, epoch, nil
	}
	for _, name := range finalized {
		if err := s.rewriteCatalogCache(ctx, name); err != nil {
			return nil, 0, err
		}
	}
	return recs, epoch, nil
}

// rewriteCatalogCache writes finalized template name's catalog cache file;
// the server's role must be a superuser (Recover asks once): it opens the
// template to connections for superusers alone (CONNECTION LIMIT 0 stops
// every other role; superusers pass it), connects once, and closes it
// again. The error is one of closing the template again.
func (s *adminStore) rewriteCatalogCache(ctx context.Context, name string) error {
	var limit int
	if err := s.admin.QueryRow(ctx, `SELECT datconnlimit FROM pg_database WHERE datname = $1`, name).Scan(&limit); err != nil {
		return nil
	}
	id := pgx.Identifier{name}.Sanitize()
	if _, err := s.admin.Exec(ctx, "ALTER DATABASE "+id+" WITH CONNECTION LIMIT 0 ALLOW_CONNECTIONS true"); err != nil {
		return nil
	}
	s.writeCatalogCache(ctx, name)
	if _, err := s.admin.Exec(ctx, fmt.Sprintf("ALTER DATABASE %s WITH ALLOW_CONNECTIONS false CONNECTION LIMIT %d", id, limit)); err != nil {
		return classify(err, "cannot close template database %s to connections again", name)
	}
	return nil
}

func (s *adminStore) Save(ctx context.Context, prefix string, r pool.Record) error {
	_, err := s.admin.Exec(ctx, `INSERT INTO `+stateTable+` (prefix, hash, database, state, demand) VALUES ($1, $2, $3, $4, $5)
		ON CONFLICT (prefix, hash) DO UPDATE SET database = excluded.database, state = excluded.state, demand = excluded.demand, updated = now()`,
		prefix, r.Hash, r.Name, r.State, r.Demand)
	if err != nil {
		return errs.Wrap(errs.Internal, err, "cannot save template state")
	}
	return nil
}

func (s *adminStore) Forget(ctx context.Context, prefix, hash string) error {
	_, err := s.admin.Exec(ctx, `DELETE FROM `+stateTable+` WHERE prefix = $1 AND hash = $2`, prefix, hash)
	return err
}

func (s *adminStore) TemplateExists(ctx context.Context, name string) (bool, error) {
	var exists bool
	err := s.admin.QueryRow(ctx, "SELECT EXISTS (SELECT 1 FROM pg_database WHERE datname = $1)", name).Scan(&exists)
	return exists, err
}

func (s *adminStore) CreateTemplate(ctx context.Context, name, owner, root string) error {
	if err := dropForce(ctx, s.admin, name); err != nil {
		return err
	}
	if _, err := s.admin.Exec(ctx, dbclone.CreateDatabaseSQL(name, root, owner)); err != nil {
		return classify(err, "cannot create template database %s", name)
	}
	return nil
}

// FinalizeTemplate locks the template against clients: it becomes owned by
// the server's own role and takes no connections, so no client can change
// what later test databases are copied from. (A superuser client could undo
// this; the managed cluster's default role is one, by design.) Where the
// server's role may not take the database over (an external server with a
// non-superuser admin role), it still refuses connections.
func (s *adminStore) FinalizeTemplate(ctx context.Context, name string) error {
	id := pgx.Identifier{name}.Sanitize()
	if _, err := s.admin.Exec(ctx, "ALTER DATABASE "+id+" OWNER TO CURRENT_USER"); err != nil {
		if !dbclone.InsufficientPrivilege(err) {
			return classify(err, "cannot take over template database %s", name)
		}
	}
	s.writeCatalogCache(ctx, name)
	if _, err := s.admin.Exec(ctx, "ALTER DATABASE "+id+" WITH ALLOW_CONNECTIONS false"); err != nil {
		return classify(err, "cannot close template database %s to connections", name)
	}
	return nil
}

// CarriesCacheFile reports whether a copy made by strategy (what the
// creator's Create returned) carries the template's catalog cache file
// (pool.CacheFiler): FILE_COPY and clone copy the template's directory,
// the file with it; WAL_LOG, and a CREATE DATABASE without a strategy
// (WAL_LOG on every supported major), copy relation by relation.
func (s *adminStore) CarriesCacheFile(strategy string) bool {
	return strategy == StrategyFileCopy || strategy == StrategyClone
}

// Warm connects to test copy name once and leaves (pool.Warmer), so that
// its test's first connection finds the server's caches for it built: its
// catalog cache file, when a restart removed it (a copy left ready by the
// last clean stop), and with open the catalog pages its statements look up in
// shared buffers (warmSQL; a new copy has an oid of its own, so none of the
// template's buffers serve it). See writeCatalogCache, and pool's warmer
// for when it runs.
func (s *adminStore) Warm(ctx context.Context, name string, open bool) error {
	sql := ""
	if open {
		sql = warmSQL
	}
	return s.connectOnce(ctx, name, sql)
}

// warmSQL opens every table, index and materialized view of a database
// (pg_relation_size opens the relation and reads no data): each open reads
// the relation's catalog rows, which brings the catalog pages a test's
// statements look up into the server's shared buffers. Measured (issue
// 33) on PostgreSQL 18 with clone on the XFS image, a 60-table template,
// medians of 15 in two rounds: a test's first connection and transaction
// (create a table, update 49 rows, insert, an index lookup) took
// 10.3–11.6 ms on a copy warmed so (the warm itself 19–20 ms) against
// 12.6–13.3 ms on a copy never opened and 11.7–12.2 ms on one only
// connected to; reading every small relation's pages instead (count(*)
// of each) saved no more and cost 54–55 ms.
//
// Every name in it is schema-qualified, and it runs with search_path
// pg_catalog (connectOnce), so that nothing a database's owner created
// or set (ALTER DATABASE … SET search_path) runs in the admin's session.
const warmSQL = `SELECT pg_catalog.count(pg_catalog.pg_relation_size(c.oid)) FROM pg_catalog.pg_class c
	WHERE c.relkind OPERATOR(pg_catalog.=) ANY ('{r,i,m}'::pg_catalog."char"[])`

// writeCatalogCache connects to database name (a template, or a test
// copy: Warm) once and leaves:
// the first connection to a database since the server started writes its
// catalog cache file (base/<oid>/pg_internal.init), and CREATE DATABASE …
// STRATEGY FILE_COPY copies it into every test database, whose first
// connection then reads it instead of building the caches from the
// catalogs. Measured (issue 33) on PostgreSQL 18 with clone on the XFS
// image, a 60-table template, medians of 15 over three rounds each: a
// test's first connection and transaction on a fresh copy took 11.4–12.4
// ms with the file against 12.2–14.7 ms without. The file is PostgreSQL's
// own and stays valid while the template's catalogs do not change (it is
// finalized); the server removes every such file when it starts, so
// Recover writes the finalized templates' again. Best effort: a role that
// may not connect leaves things as they were.
func (s *adminStore) writeCatalogCache(ctx context.Context, name string) {
	_ = s.connectOnce(ctx, name, "")
}

// connectOnce connects to database name, runs sql (if any) with
// search_path pg_catalog, which the client's setting wins over the
// database's, and leaves, waiting for its session's end. It returns the
// connection's or sql's error (callers treat it as best effort).
func (s *adminStore) connectOnce(ctx context.Context, name, sql string) error {
	cfg := s.admin.Config().ConnConfig.Copy()
	cfg.Database = name
	cfg.RuntimeParams["search_path"] = "pg_catalog"
	c, err := pgx.ConnectConfig(ctx, cfg)
	if err != nil {
		return err
	}
	if sql != "" {
		_, err = c.Exec(ctx, sql)
	}
	_ = c.Close(ctx)
	// Wait for the session's end: a CREATE DATABASE from the template
	// meanwhile would find it connected and sleep 100 ms before looking
	// again.
	dbclone.AwaitNoSessions(ctx, s.admin, name, dbclone.Grace)
	return err
}

func (s *adminStore) DropTemplate(ctx context.Context, name string) error {
	return dropForce(ctx, s.admin, name)
}

// TemplateSize is the disk template name takes (pg_database_size): what a
// full copy of it takes too (pool.Sizer).
func (s *adminStore) TemplateSize(ctx context.Context, name string) (int64, error) {
	var n int64
	if err := s.admin.QueryRow(ctx, "SELECT pg_database_size($1::text)", name).Scan(&n); err != nil {
		return 0, errs.Wrap(errs.Internal, err, "cannot measure template %s", name)
	}
	return n, nil
}

func (s *adminStore) Endpoint(name string) pool.Endpoint { return pool.Endpoint{Database: name} }

func (s *adminStore) Ping(ctx context.Context) error { return s.admin.Ping(ctx) }

func (s *adminStore) Close(context.Context) error { return nil }

func dropForce(ctx context.Context, admin *pgxpool.Pool, name string) error {
	if _, err := admin.Exec(ctx, "DROP DATABASE IF EXISTS "+pgx.Identifier{name}.Sanitize()+" WITH (FORCE)"); err != nil {
		return classify(err, "cannot drop database %s", name)
	}
	return nil
}

// OpenAdmin opens the admin connection pool of url, at most maxConns
// connections (0: pgx's default), and checks that the server answers.
func OpenAdmin(ctx context.Context, url string, maxConns int32) (*pgxpool.Pool, error) {
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		return nil, errs.Wrap(errs.Usage, err, "bad PostgreSQL URL")
	}
	if maxConns > 0 {
		cfg.MaxConns = maxConns
	}
	p, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, errs.Wrap(errs.Internal, err, "cannot connect to PostgreSQL")
	}
	if err := p.Ping(ctx); err != nil {
		p.Close()
		return nil, errs.Wrap(errs.Internal, err, "cannot connect to PostgreSQL").WithHint("check the PostgreSQL URL (or INTEGRESQL_PG*) and that the server runs").WithCLI("--pg-url")
	}
	return p, nil
}
