package dbstore

import (
	"context"
	"runtime"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgfork/pgfork/dbclone"
	"github.com/pgfork/pgfork/internal/errs"
	"github.com/pgfork/pgfork/internal/fsutil"
	"github.com/pgfork/pgfork/pgdata"
	"github.com/pgfork/pgfork/pool"
)

// Strategies a SQLCreator accepts.
const (
	StrategyAuto     = "auto"      // pick the fastest for the server (see SQLCreator.Create)
	StrategyDefault  = "default"   // no STRATEGY clause: what IntegreSQL and most tools do
	StrategyWALLog   = "wal_log"   // STRATEGY WAL_LOG
	StrategyFileCopy = "file_copy" // STRATEGY FILE_COPY
	StrategyClone    = "clone"     // FILE_COPY with file_copy_method = clone (PostgreSQL 18, CoW filesystem)
)

// ValidStrategy reports whether s is a strategy name SQLCreator accepts.
func ValidStrategy(s string) bool {
	switch s {
	case StrategyAuto, StrategyDefault, StrategyWALLog, StrategyFileCopy, StrategyClone:
		return true
	}
	return false
}

// SQLCreator creates databases over an admin connection pool: with
// dbclone.Create and its strategy advisor ("auto", or a forced strategy),
// or, for StrategyDefault, with a plain CREATE DATABASE … TEMPLATE and no
// STRATEGY clause — what IntegreSQL and most test tools do (the baseline).
type SQLCreator struct {
	Admin    *pgxpool.Pool
	Strategy string // one of the Strategy* constants or "clone"; empty means auto
	// CanClone says the server's data directory is on a filesystem that
	// shares blocks (reflink); the advisor needs it to choose clone.
	CanClone bool
	target   *dbclone.Target
	// learn is what auto's advisor learned from this creator's creations
	// (in memory, for the life of the server).
	learn dbclone.Learning

	// chosen is the strategy last used for each template, with when the
	// advisor chose it: creations within Readvise of that reuse it with a
	// single CREATE DATABASE (see Create).
	mu     sync.Mutex
	chosen map[string]choice

	flushMu sync.Mutex
}

type choice struct {
	strategy dbclone.Strategy
	at       time.Time
}

// Readvise is how long a SQLCreator reuses the strategy the advisor chose
// for a template before it asks again (the advisor reads the template's
// size and the dirty buffers, which change as tests write).
const Readvise = 30 * time.Second

// SharesBlocks reports whether the server's copies share blocks with the
// template (PostgreSQL 18+ and a data directory that reflinks, so the
// advisor can clone): a ready copy then costs almost no disk. It needs
// Probe.
func (c *SQLCreator) SharesBlocks() bool {
	return c.target != nil && c.target.Version >= 18 && c.target.CanClone &&
		(c.Strategy == "" || c.Strategy == StrategyAuto || c.Strategy == StrategyClone) &&
		(c.target.FileCopyMethod == "clone" || c.target.FileCopyMethodContext == "user")
}

// DataDir is the server's data directory when the admin role may read it
// (empty otherwise, or before Probe).
func (c *SQLCreator) DataDir() string {
	if c.target == nil {
		return ""
	}
	return c.target.DataDir
}

// Flush writes the server's dirty pages to disk now (pool.Flusher): one
// syncfs(2) of its data directory's filesystem, which needs the directory
// known (DataDir) and on this machine; elsewhere it fails with an
// errs.Unsupported or the OS error, and the kernel writes them back in its
// own time. Linux only: its write-back is what was measured. A remote
// server whose data_directory names a directory here too flushes this
// machine's filesystem for nothing, and does no harm.
func (c *SQLCreator) Flush(ctx context.Context) error {
	dir := c.DataDir()
	if dir == "" || runtime.GOOS != "linux" {
		return errs.New(errs.Unsupported, "the server's data directory is not known here")
	}
	c.flushMu.Lock() // one at a time: the pools of one server flush one filesystem
	defer c.flushMu.Unlock()
	if err := ctx.Err(); err != nil {
		return err
	}
	return errs.FromOS(fsutil.SyncFS(dir), dir, "cannot flush the server's data directory")
}

// Probe inspects the server once for the advisor.
func (c *SQLCreator) Probe(ctx context.Context) error {
	conn, err := c.Admin.Acquire(ctx)
	if err != nil {
		return errs.Wrap(errs.Internal, err, "cannot connect to the server")
	}
	defer conn.Release()
	t, err := dbclone.Inspect(ctx, conn.Conn(), c.CanClone)
	if err != nil {
		return err
	}
	c.target = t
	return nil
}

// Create makes database name from template. While the template has other
// sessions it returns an errs.Busy error (the pool retries).
func (c *SQLCreator) Create(ctx context.Context, name, template, owner string) (string, error) {
	if c.Strategy == StrategyDefault {
		if _, err := c.Admin.Exec(ctx, dbclone.CreateDatabaseSQL(name, template, owner)); err != nil {
			return StrategyDefault, classify(err, "cannot create database %s from %s", name, template)
		}
		return StrategyDefault, nil
	}
	st, err := dbclone.ParseStrategy(c.Strategy)
	if err != nil {
		return "", err
	}
	conn, err := c.Admin.Acquire(ctx)
	if err != nil {
		return string(st), errs.Wrap(errs.Internal, err, "cannot connect to the server")
	}
	defer conn.Release()
	// The fast path, measured by pool's BenchmarkCreateRate (issue 33):
	// dbclone.Create makes about ten round trips (checks, the advisor's
	// size and dirty-buffer query, the sweep of abandoned work, an
	// advisory lock, the wait for sessions on the template, the copy
	// under a work name and its rename); a pool owns its names, drops
	// their leftovers when it starts and never cancels a creation, so
	// once a strategy is known for the template one CREATE DATABASE
	// does. Anything but sessions on the template or an existing name
	// goes through Create, which explains it.
	if s, ok := c.cached(template, st); ok {
		err := dbclone.CreateDirect(ctx, conn.Conn(), name, template, owner, s, c.target)
		if err == nil || errs.IsBusy(err) || errs.IsExists(err) || ctx.Err() != nil {
			return string(s), err
		}
		c.forget(template)
	}
	opts := dbclone.CreateOptions{Strategy: st, Owner: owner, Target: c.target}
	if st == dbclone.Auto {
		opts.Learning = &c.learn
	}
	res, err := dbclone.Create(ctx, conn.Conn(), name, template, opts)
	if err != nil {
		return string(st), err
	}
	c.remember(template, res.Strategy)
	return string(res.Strategy), nil
}

// Prewarm reads database name, just cloned (strategy StrategyClone), ahead
// into the page cache (pgdata.PrewarmDatabase: all of it when small, else
// its catalogs) when its files are reachable here (the data directory is
// known: the managed server, or a role that may read data_directory); the
// pool calls it for the copies nobody waits for (pool.Prewarmer). Full
// copies need none: their pages were just written through the cache.
func (c *SQLCreator) Prewarm(ctx context.Context, name, strategy string) {
	if strategy != StrategyClone || c.DataDir() == "" {
		return
	}
	var oid uint32
	if err := c.Admin.QueryRow(ctx, "SELECT oid FROM pg_database WHERE datname = $1", name).Scan(&oid); err != nil {
		return
	}
	pgdata.PrewarmDatabase(c.DataDir(), oid)
}

// cached returns the strategy for a single CREATE DATABASE from template:
// a forced one, or the advisor's choice made within Readvise. It needs
// the server inspected (Probe).
func (c *SQLCreator) cached(template string, st dbclone.Strategy) (dbclone.Strategy, bool) {
	if c.target == nil {
		return "", false
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	ch, ok := c.chosen[template]
	if !ok || st != dbclone.Auto && ch.strategy != st || st == dbclone.Auto && time.Since(ch.at) > Readvise {
		return "", false
	}
	return ch.strategy, true
}

func (c *SQLCreator) remember(template string, s dbclone.Strategy) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.chosen == nil {
		c.chosen = map[string]choice{}
	}
	c.chosen[template] = choice{strategy: s, at: time.Now()}
}

func (c *SQLCreator) forget(template string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	delete(c.chosen, template)
}

// Drop runs DROP DATABASE IF EXISTS name. While sessions are connected it
// returns an errs.Busy error.
func (c *SQLCreator) Drop(ctx context.Context, name string) error {
	dbclone.AwaitNoSessions(ctx, c.Admin, name, dbclone.Grace) // as Rename
	if _, err := c.Admin.Exec(ctx, "DROP DATABASE IF EXISTS "+pgx.Identifier{name}.Sanitize()); err != nil {
		return classify(err, "cannot drop database %s", name)
	}
	return nil
}

// Rename implements pool.Retirer: ALTER DATABASE from RENAME TO to. While
// sessions are connected to from it returns an errs.Busy error.
func (c *SQLCreator) Rename(ctx context.Context, from, to string) error {
	// A test that just closed its connection leaves a backend exiting; the
	// rename would sleep 100 ms on it (dbclone.AwaitNoSessions).
	dbclone.AwaitNoSessions(ctx, c.Admin, from, dbclone.Grace)
	if _, err := c.Admin.Exec(ctx, "ALTER DATABASE "+pgx.Identifier{from}.Sanitize()+" RENAME TO "+pgx.Identifier{to}.Sanitize()); err != nil {
		return classify(err, "cannot rename database %s", from)
	}
	return nil
}

// classify wraps a server error with dbclone's SQLSTATE classifier ("object
// in use" is errs.Busy, which the pool retries).
func classify(err error, format string, args ...any) error {
	return dbclone.SQLError(context.Background(), err, format, args...)
}

// Sessions implements SessionCounter: the sessions connected to each of
// names now and the server's count of sessions ever established to it
// (pg_stat_database.sessions, PostgreSQL 14+; -1 before, read through
// to_jsonb so that one query serves every major).
func (c *SQLCreator) Sessions(ctx context.Context, names []string) (map[string]pool.Sessions, error) {
	rows, err := c.Admin.Query(ctx, `SELECT s.datname::text, s.numbackends,
		coalesce((to_jsonb(s)->>'sessions')::bigint, -1)
		FROM pg_catalog.pg_stat_database s WHERE s.datname = ANY($1)`, names)
	if err != nil {
		return nil, classify(err, "cannot count sessions")
	}
	defer rows.Close()
	out := map[string]pool.Sessions{}
	for rows.Next() {
		var n string
		var k pool.Sessions
		if err := rows.Scan(&n, &k.Connected, &k.Established); err != nil {
			return nil, classify(err, "cannot count sessions")
		}
		out[n] = k
	}
	if err := rows.Err(); err != nil {
		return nil, classify(err, "cannot count sessions")
	}
	return out, nil
}
