package serve

import (
	"errors"
	"fmt"

	"github.com/pgfork/pgfork/internal/errs"
	"github.com/pgfork/pgfork/internal/flock"
	"github.com/pgfork/pgfork/internal/servelock"
	"github.com/pgfork/pgfork/internal/statedir"
)

// LockState takes the state directory of lay for one pgfork serve, which
// listens on addr: a second serve on the same state directory would stop
// the first one's PostgreSQL and leave it answering 503 (issue 19, F19).
// It fails with errs.Busy naming the first one's pid and address (when
// servelock.Find proves them). The lock is released by release, or by the
// kernel when the process exits; the record of it (servelock.Record) is
// trusted only while the lock is held.
func LockState(lay statedir.Layout, addr string) (release func(), err error) {
	if err := lay.Ensure(); err != nil {
		return nil, errs.FromOS(err, lay.Root, "cannot create the state directory")
	}
	lockPath := servelock.LockPath(lay)
	l, err := flock.TryExclusive(lockPath)
	if errors.Is(err, flock.ErrBusy) {
		return nil, errs.New(errs.Busy, "%s already uses the state directory %s", describe(lay), lay.Root).
			WithHint("stop it first, or give this one a state directory of its own")
	}
	if err != nil {
		return nil, errs.FromOS(err, lockPath, "cannot lock the state directory")
	}
	recordOwner(lay, addr)
	return func() {
		_ = servelock.Remove(lay)
		l.Unlock()
	}, nil
}

// describe names the pgfork serve holding lay's state directory for a
// message: "another pgfork serve (pid N, listening on ADDR)" when
// servelock.Find proves it, else without the details.
func describe(lay statedir.Layout) string {
	if o, ok := servelock.Find(lay); ok {
		return fmt.Sprintf("another pgfork serve (%s)", o)
	}
	return "another pgfork serve"
}

// recordOwner records this process, listening on addr, as the serve that
// holds lay's state directory (once it listens: the address bound, not
// --listen's port 0). A record that cannot be written only leaves pgfork
// ls without this serve's pools.
func recordOwner(lay statedir.Layout, addr string) {
	_ = servelock.Record(lay, addr)
}
