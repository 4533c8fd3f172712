package main

import (
	"context"
	"errors"

	"github.com/pgfork/pgfork/internal/errs"
)

// Exit codes a script can rely on. Keep in sync with exitCodesHelp and the README.
const (
	exitOK          = 0
	exitError       = 1 // unexpected failure (I/O error, server error)
	exitUsage       = 2 // bad command line or input value
	exitNotFound    = 3 // source, cluster, template, snapshot or PostgreSQL build missing
	exitExists      = 4 // destination or name already exists
	exitUnsupported = 5 // filesystem, server version or platform cannot do it
	exitBusy        = 6 // held by someone else: sessions, running server, lock
	exitNoSpace     = 7 // out of disk space
	exitPermission  = 8 // permission denied
	exitInterrupted = 130
)

const exitCodesHelp = `Exit codes:
  0    success
  1    unexpected failure (I/O error, server error)
  2    usage error: bad flag, argument or value
  3    not found: source, cluster, template, snapshot or PostgreSQL build
  4    already exists: destination or name taken
  5    unsupported here: filesystem, server version or platform
  6    busy: sessions connected, server running, lock held
  7    out of disk space
  8    permission denied
  130  interrupted (Ctrl-C / SIGTERM)`

func exitCode(err error) int {
	if err == nil {
		return exitOK
	}
	if errors.Is(err, context.Canceled) {
		return exitInterrupted
	}
	switch errs.KindOf(err) {
	case errs.Usage:
		return exitUsage
	case errs.NotFound:
		return exitNotFound
	case errs.Exists:
		return exitExists
	case errs.Unsupported:
		return exitUnsupported
	case errs.Busy:
		return exitBusy
	case errs.NoSpace:
		return exitNoSpace
	case errs.Permission:
		return exitPermission
	case errs.Interrupted:
		return exitInterrupted
	}
	return exitError
}
