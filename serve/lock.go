package serve

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/pgfork/pgfork/internal/errs"
	"github.com/pgfork/pgfork/internal/flock"
	"github.com/pgfork/pgfork/internal/fsutil"
	"github.com/pgfork/pgfork/internal/proc"
	"github.com/pgfork/pgfork/internal/statedir"
)

// LockState takes the state directory of lay for one pgfork serve, which
// listens on addr: a second serve on the same state directory would stop
// the first one's PostgreSQL and leave it answering 503 (issue 19, F19).
// It fails with errs.Busy naming the first one's pid and address. The lock
// is released by release, or by the kernel when the process exits.
func LockState(lay statedir.Layout, addr string) (release func(), err error) {
	if err := lay.Ensure(); err != nil {
		return nil, errs.FromOS(err, lay.Root, "cannot create the state directory")
	}
	lockPath := filepath.Join(lay.Locks(), "serve.lock")
	ownerPath := filepath.Join(lay.Locks(), "serve.owner")
	l, err := flock.TryExclusive(lockPath)
	if errors.Is(err, flock.ErrBusy) {
		who := "another pgfork serve"
		if b, rerr := os.ReadFile(ownerPath); rerr == nil && len(b) > 0 && len(b) < 512 {
			who += " (" + strings.TrimSpace(string(b)) + ")"
		}
		return nil, errs.New(errs.Busy, "%s already uses the state directory %s", who, lay.Root).
			WithHint("stop it first, or give this one a state directory of its own")
	}
	if err != nil {
		return nil, errs.FromOS(err, lockPath, "cannot lock the state directory")
	}
	recordOwner(lay, addr)
	return func() {
		_ = os.Remove(ownerPath)
		l.Unlock()
	}, nil
}

// ownerFormat is what LockState records of the serve holding the lock.
const ownerFormat = "pid %d, listening on %s"

// recordOwner records this process, listening on addr, as the serve that
// holds lay's state directory (once it listens: the address bound, not
// --listen's port 0).
func recordOwner(lay statedir.Layout, addr string) {
	_ = fsutil.WriteFileAtomic(filepath.Join(lay.Locks(), "serve.owner"), []byte(fmt.Sprintf(ownerFormat+"\n", os.Getpid(), addr)), 0o644)
}

// Owner is the pgfork serve that holds lay's state directory, as
// LockState recorded it: its pid and the address it listens on; ok is
// false when none runs. It takes no lock (pgfork ls asks it beside a
// serve that may be starting): a record whose process is gone (a serve
// killed with -9) is no owner.
func Owner(lay statedir.Layout) (pid int, addr string, ok bool) {
	b, err := os.ReadFile(filepath.Join(lay.Locks(), "serve.owner"))
	if err != nil {
		return 0, "", false
	}
	if _, err := fmt.Sscanf(strings.TrimSpace(string(b)), ownerFormat, &pid, &addr); err != nil || !proc.Alive(pid) {
		return 0, "", false
	}
	return pid, addr, true
}
