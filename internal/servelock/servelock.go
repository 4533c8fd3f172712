// Package servelock is the lock a `pgfork serve` holds on its state
// directory (<state>/locks/serve.lock) and the record of who holds it
// (<state>/locks/serve.owner), and the one way to find that serve
// (docs/SECURITY.md, rule 3: a server is trusted only after it proves it is
// the one pgfork started).
//
// The record outlives its serve (kill -9, OOM, a reboot), and a pid or a
// loopback port it names may belong to another user's process by the time
// it is read. So Owner trusts it only while the serve's lock is held and
// the recorded pid runs as the recorded user — the caller's — with the
// recorded start time: that is the process that wrote it, still alive,
// still holding the state directory, so the address it recorded is still
// its own listener. Every consumer (pgfork ls, serve's and the volume's
// "already in use" messages) goes through Owner; the clients' test glue
// reads the same record by the same rule (docs/SECURITY.md).
package servelock

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"github.com/pgfork/pgfork/internal/flock"
	"github.com/pgfork/pgfork/internal/fsutil"
	"github.com/pgfork/pgfork/internal/proc"
	"github.com/pgfork/pgfork/internal/statedir"
)

// Owner is what a serve records of itself in serve.owner (JSON, mode 0644:
// it holds no secret).
type Owner struct {
	Pid int `json:"pid"`
	// Start is the process's start time (proc.StartTime): with Pid it names
	// one process, never a later one that reuses the pid.
	Start uint64 `json:"start"`
	// UID is the user the serve runs as.
	UID int `json:"uid"`
	// Listen is the address its HTTP listener is bound to.
	Listen string `json:"listen"`
}

// String is how messages name the serve: "pid N, listening on ADDR".
func (o Owner) String() string { return fmt.Sprintf("pid %d, listening on %s", o.Pid, o.Listen) }

// maxRecord bounds what is read of serve.owner.
const maxRecord = 4096

// LockPath is the file a serve holds an exclusive flock on while it uses
// lay's state directory.
func LockPath(lay statedir.Layout) string { return filepath.Join(lay.Locks(), "serve.lock") }

// RecordPath is the file a serve records itself in (Record).
func RecordPath(lay statedir.Layout) string { return filepath.Join(lay.Locks(), "serve.owner") }

// Record records the calling process, listening on listen, as the serve
// that holds lay's state directory. Call it only while holding the lock
// at LockPath, and again once the listener is bound (its real port, not
// --listen's 0).
func Record(lay statedir.Layout, listen string) error {
	pid := os.Getpid()
	b, err := json.Marshal(Owner{Pid: pid, Start: proc.StartTime(pid), UID: os.Geteuid(), Listen: listen})
	if err != nil {
		return err
	}
	return fsutil.WriteFileAtomic(RecordPath(lay), append(b, '\n'), 0o644)
}

// Remove removes the record (before the lock is released).
func Remove(lay statedir.Layout) error {
	err := os.Remove(RecordPath(lay))
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	return err
}

// Find returns the serve that holds lay's state directory, proven: its
// record names a pid that runs as the recorded user, which is the caller's
// effective user, with the recorded start time, and the state directory's
// lock is held. ok is false for anything else: no record, a broken one, a
// serve that exited (kill -9 leaves its record), a pid now used by another
// process or another user, a lock nobody holds; and outside Linux, where
// no process's start time can be read. It takes no lock while the recorded
// serve holds it (pgfork ls asks beside a serve that may be starting).
func Find(lay statedir.Layout) (o Owner, ok bool) {
	f, err := os.Open(RecordPath(lay))
	if err != nil {
		return Owner{}, false
	}
	b := make([]byte, maxRecord)
	n, _ := f.Read(b)
	f.Close()
	if json.Unmarshal(b[:n], &o) != nil || o.Listen == "" || o.Start == 0 || !proc.Valid(o.Pid) || o.UID != os.Geteuid() {
		return Owner{}, false
	}
	// The user first, then the start time: if the start time read after
	// the owner still matches, the process whose owner was read is the
	// recorded one (it was alive before and after).
	if uid, err := proc.UID(o.Pid); err != nil || uid != o.UID || proc.StartTime(o.Pid) != o.Start {
		return Owner{}, false
	}
	// Checked last: the probe takes the lock for a moment when nobody holds
	// it, which only a serve shutting down (alive, lock released) leaves.
	if held, err := flock.Held(LockPath(lay)); err != nil || !held {
		return Owner{}, false
	}
	return o, true
}
