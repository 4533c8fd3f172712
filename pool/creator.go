package pool

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgfork/pgfork/internal/errs"
)

// Strategies a SQLCreator accepts.
const (
	StrategyAuto     = "auto"      // pick the fastest for the server (see SQLCreator.Create)
	StrategyDefault  = "default"   // no STRATEGY clause: what IntegreSQL and most tools do
	StrategyWALLog   = "wal_log"   // STRATEGY WAL_LOG
	StrategyFileCopy = "file_copy" // STRATEGY FILE_COPY
)

// ValidStrategy reports whether s is a strategy name SQLCreator accepts.
func ValidStrategy(s string) bool {
	switch s {
	case StrategyAuto, StrategyDefault, StrategyWALLog, StrategyFileCopy, "clone":
		return true
	}
	return false
}

// SQLCreator creates databases with CREATE DATABASE … TEMPLATE over an
// admin connection pool.
//
// It is the adapter the pools use until dbclone.Create (with its strategy
// advisor) is wired in: "auto" chooses FILE_COPY when the server copies
// files by cloning (PostgreSQL 18, file_copy_method = clone), where it costs
// next to nothing, and WAL_LOG otherwise.
type SQLCreator struct {
	Admin    *pgxpool.Pool
	Strategy string // one of the Strategy* constants; empty means auto
	// cloneOK caches whether file_copy_method = clone (set by Probe).
	cloneOK bool
}

// Probe reads the server settings that "auto" depends on.
func (c *SQLCreator) Probe(ctx context.Context) error {
	var v string
	err := c.Admin.QueryRow(ctx, "SELECT coalesce(current_setting('file_copy_method', true), '')").Scan(&v)
	if err != nil {
		return errs.Wrap(errs.Internal, err, "cannot read server settings")
	}
	c.cloneOK = v == "clone"
	return nil
}

func (c *SQLCreator) strategy() (clause, name string) {
	s := c.Strategy
	if s == "" || s == StrategyAuto {
		if c.cloneOK {
			return " STRATEGY FILE_COPY", "clone"
		}
		return " STRATEGY WAL_LOG", StrategyWALLog
	}
	switch s {
	case StrategyWALLog:
		return " STRATEGY WAL_LOG", s
	case StrategyFileCopy:
		return " STRATEGY FILE_COPY", s
	case "clone":
		return " STRATEGY FILE_COPY", s
	}
	return "", StrategyDefault
}

// Create runs CREATE DATABASE name OWNER owner TEMPLATE template [STRATEGY …].
// While the template has other sessions it returns an error wrapping ErrInUse.
func (c *SQLCreator) Create(ctx context.Context, name, template, owner string) (string, error) {
	clause, strat := c.strategy()
	sql := "CREATE DATABASE " + pgx.Identifier{name}.Sanitize() + " TEMPLATE " + pgx.Identifier{template}.Sanitize()
	if owner != "" {
		sql += " OWNER " + pgx.Identifier{owner}.Sanitize()
	}
	sql += clause
	if _, err := c.Admin.Exec(ctx, sql); err != nil {
		return strat, classify(err, "cannot create database %s from %s", name, template)
	}
	return strat, nil
}

// Drop runs DROP DATABASE IF EXISTS name. While sessions are connected it
// returns an error wrapping ErrInUse.
func (c *SQLCreator) Drop(ctx context.Context, name string) error {
	if _, err := c.Admin.Exec(ctx, "DROP DATABASE IF EXISTS "+pgx.Identifier{name}.Sanitize()); err != nil {
		return classify(err, "cannot drop database %s", name)
	}
	return nil
}

// classify wraps a server error, marking "object in use" (55006) as ErrInUse.
func classify(err error, format string, args ...any) error {
	var pe *pgconn.PgError
	if errors.As(err, &pe) && pe.Code == "55006" {
		return errs.Wrap(errs.Busy, fmt.Errorf("%w: %s", ErrInUse, pe.Message), format, args...)
	}
	if errors.As(err, &pe) && (pe.Code == "53100" || strings.Contains(pe.Message, "No space left")) {
		return errs.Wrap(errs.NoSpace, err, format, args...)
	}
	return errs.Wrap(errs.Internal, err, format, args...)
}
