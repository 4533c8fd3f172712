package serve

import (
	"context"
	"errors"
	"fmt"
	"os"
	"time"

	"github.com/pgfork/pgfork/internal/errs"
	"github.com/pgfork/pgfork/internal/flock"
)

// Lifetime ends a serve that a test run started when the run ends, also
// when its runner is killed and has no global teardown (docs/server.md,
// "Lifetime"; the clients' contract in issue 34).
type Lifetime struct {
	// ExitWithParent ends serve once the process that started it exits
	// (its parent pid changes: the orphan is adopted by init or a
	// subreaper).
	ExitWithParent bool
	// Lease, when set, is a file the test processes of a run hold a shared
	// flock(2) on, the starter from before it starts serve: serve ends
	// once nobody has held one for LeaseGrace.
	Lease string
}

// LeaseGrace is how long a lease must stay unheld before serve ends: the
// gap between one test process letting go and the next taking it.
const LeaseGrace = time.Second

// lifetimePoll is how often the parent and the lease are looked at.
const lifetimePoll = 100 * time.Millisecond

// errLifetimeOver is the cause of the context a Lifetime ends.
var errLifetimeOver = errors.New("lifetime over")

// CheckLease refuses a lease file that does not exist: its starter creates
// it and takes its shared lock before starting serve.
func CheckLease(path string) error {
	if path == "" {
		return nil
	}
	st, err := os.Stat(path)
	if err != nil {
		return errs.Wrap(errs.OSKind(err), err, "cannot use the lease file %s", path).
			WithHint("create it and hold a shared flock on it before starting serve").WithCLI("--lease FILE")
	}
	if !st.Mode().IsRegular() {
		return errs.New(errs.Usage, "the lease file %s is not a regular file", path).WithCLI("--lease FILE")
	}
	return nil
}

// watch returns ctx canceled (cause errLifetimeOver) once l says serve
// ends, telling info why; stop releases the watcher.
func (l Lifetime) watch(ctx context.Context, info func(string)) (context.Context, context.CancelFunc) {
	if !l.ExitWithParent && l.Lease == "" {
		return context.WithCancel(ctx)
	}
	ctx, cancel := context.WithCancelCause(ctx)
	ppid := os.Getppid()
	if l.Lease != "" {
		// The starter's lock on a descriptor serve inherited would be held
		// by serve itself: the lease would never end.
		_, _ = flock.CloseInherited(l.Lease)
	}
	go func() {
		tick := time.NewTicker(lifetimePoll)
		defer tick.Stop()
		lastHeld := time.Now()
		for {
			if l.ExitWithParent && parentGone(ppid) {
				info(fmt.Sprintf("the process that started serve (pid %d) exited", ppid))
				cancel(errLifetimeOver)
				return
			}
			if l.Lease != "" {
				held, err := flock.Held(l.Lease)
				if held || err != nil { // an error: keep serving, as held
					lastHeld = time.Now()
				} else if time.Since(lastHeld) >= LeaseGrace {
					info(fmt.Sprintf("nobody has held the lease %s for %s", l.Lease, LeaseGrace))
					cancel(errLifetimeOver)
					return
				}
			}
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
			}
		}
	}()
	return ctx, func() { cancel(context.Canceled) }
}

// parentGone says the parent of this process is no longer ppid, the one
// it had when it started; a process started by init (ppid 1) follows no
// parent.
func parentGone(ppid int) bool {
	return ppid > 1 && os.Getppid() != ppid
}

// lifetimeOver says ctx ended because the Lifetime did.
func lifetimeOver(ctx context.Context) bool {
	return errors.Is(context.Cause(ctx), errLifetimeOver)
}
