package dbclone

import (
	"context"
	"errors"
	"strings"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pgfork/pgfork/internal/errs"
)

// SQLKind classifies a server error by its SQLSTATE: the one place that
// maps PostgreSQL's error codes to pgfork's error kinds (dbclone and pool
// both use it). ok is false when err is not a server error; unknown codes
// are errs.Internal.
func SQLKind(err error) (kind errs.Kind, ok bool) {
	var pe *pgconn.PgError
	if !errors.As(err, &pe) {
		return errs.Internal, false
	}
	switch pe.Code {
	case "42P04": // duplicate_database
		return errs.Exists, true
	case "23505": // unique_violation: two CREATE DATABASE of one name at once
		if isCatalogName(pe) {
			return errs.Exists, true
		}
	case "55006", // object_in_use
		"55P03", // lock_not_available
		"53300": // too_many_connections
		return errs.Busy, true
	case "42501", // insufficient_privilege
		"28P01", // invalid_password
		"28000": // invalid_authorization_specification
		return errs.Permission, true
	case "3D000", // invalid_catalog_name: no such database
		"42704": // undefined_object (e.g. the owner role)
		return errs.NotFound, true
	case "53100": // disk_full
		return errs.NoSpace, true
	case "57014": // query_canceled
		return errs.Interrupted, true
	}
	// An I/O error (58030) whose cause is a full disk.
	if strings.Contains(pe.Message, "No space left") || strings.Contains(pe.Detail, "No space left") {
		return errs.NoSpace, true
	}
	return errs.Internal, true
}

// The SQLSTATEs pgfork asks about by name; they are spelled only in this
// file (internal/archtest keeps SQLSTATE literals out of every other file).
const (
	stateObjectInUse           = "55006"
	stateUndefinedDatabase     = "3D000"
	stateInsufficientPrivilege = "42501"
	stateNotInPrerequisite     = "55000"
)

// InUse reports whether err is the server's "object in use" (55006): other
// sessions are connected to the database a command needed alone.
func InUse(err error) bool { return hasState(err, stateObjectInUse) }

// UndefinedDatabase reports whether err is "database does not exist" (3D000).
func UndefinedDatabase(err error) bool { return hasState(err, stateUndefinedDatabase) }

// InsufficientPrivilege reports whether err is the server refusing a
// privilege the role lacks (42501).
func InsufficientPrivilege(err error) bool { return hasState(err, stateInsufficientPrivilege) }

// NotInPrerequisiteState reports whether err is "object not in prerequisite
// state" (55000): e.g. a backup asked of a server with wal_level minimal.
func NotInPrerequisiteState(err error) bool { return hasState(err, stateNotInPrerequisite) }

// ConnectionLost reports whether err is the server going away under a
// session: an operator intervention (57P*: shutdown, crash) or a
// connection exception (08*).
func ConnectionLost(err error) bool {
	var pe *pgconn.PgError
	return errors.As(err, &pe) && (strings.HasPrefix(pe.Code, "57P") || strings.HasPrefix(pe.Code, "08"))
}

func hasState(err error, code string) bool {
	var pe *pgconn.PgError
	return errors.As(err, &pe) && pe.Code == code
}

// isCatalogName says whether a unique violation is on pg_database's (or
// pg_authid's) name index: a concurrent creation of the same name.
func isCatalogName(pe *pgconn.PgError) bool {
	return pe.TableName == "pg_database" || strings.HasPrefix(pe.ConstraintName, "pg_database_datname") ||
		strings.Contains(pe.Message, "pg_database_datname_index")
}

// SQLError wraps a (non-nil) server or connection error with the kind
// SQLKind gives it, reporting a cancelled ctx as errs.Interrupted.
func SQLError(ctx context.Context, err error, format string, args ...any) *errs.Error {
	if ctx != nil && ctx.Err() != nil {
		return errs.Wrap(errs.Interrupted, ctx.Err(), format, args...)
	}
	kind, _ := SQLKind(err)
	return errs.Wrap(kind, err, format, args...)
}
