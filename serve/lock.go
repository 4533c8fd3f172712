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
	_ = fsutil.WriteFileAtomic(ownerPath, []byte(fmt.Sprintf("pid %d, listening on %s\n", os.Getpid(), addr)), 0o644)
	return func() {
		_ = os.Remove(ownerPath)
		l.Unlock()
	}, nil
}
