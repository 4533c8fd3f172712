package dbstore

import (
	"context"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgfork/pgfork/dbclone"
	"github.com/pgfork/pgfork/internal/errs"
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
	opts := dbclone.CreateOptions{Strategy: st, Owner: owner, Target: c.target}
	if st == dbclone.Auto {
		opts.Learning = &c.learn
	}
	res, err := dbclone.Create(ctx, conn.Conn(), name, template, opts)
	if err != nil {
		return string(st), err
	}
	return string(res.Strategy), nil
}

// Drop runs DROP DATABASE IF EXISTS name. While sessions are connected it
// returns an errs.Busy error.
func (c *SQLCreator) Drop(ctx context.Context, name string) error {
	if _, err := c.Admin.Exec(ctx, "DROP DATABASE IF EXISTS "+pgx.Identifier{name}.Sanitize()); err != nil {
		return classify(err, "cannot drop database %s", name)
	}
	return nil
}

// classify wraps a server error with dbclone's SQLSTATE classifier ("object
// in use" is errs.Busy, which the pool retries).
func classify(err error, format string, args ...any) error {
	return dbclone.SQLError(context.Background(), err, format, args...)
}

// Sessions implements SessionCounter: the sessions connected to each of
// names, from pg_stat_activity.
func (c *SQLCreator) Sessions(ctx context.Context, names []string) (map[string]int, error) {
	rows, err := c.Admin.Query(ctx, `SELECT datname::text, count(*)::int FROM pg_stat_activity
		WHERE datname = ANY($1) GROUP BY datname`, names)
	if err != nil {
		return nil, classify(err, "cannot count sessions")
	}
	defer rows.Close()
	out := map[string]int{}
	for rows.Next() {
		var n string
		var k int
		if err := rows.Scan(&n, &k); err != nil {
			return nil, classify(err, "cannot count sessions")
		}
		out[n] = k
	}
	if err := rows.Err(); err != nil {
		return nil, classify(err, "cannot count sessions")
	}
	return out, nil
}
