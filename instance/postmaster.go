package instance

import (
	"os"
	"path/filepath"
	"syscall"

	"github.com/pgfork/pgfork/internal/errs"
	"github.com/pgfork/pgfork/internal/proc"
)

// Expect is what pgfork recorded when it started a server (in a file only
// pgfork's own user can write, never in the data directory): its pid and
// start time. The zero Expect records nothing.
type Expect struct {
	Pid   int
	Start uint64 // proc.StartTime of Pid; 0: unknown
	UID   int    // the OS user it runs as (for AttachRecorded); 0: unknown
}

// Attach returns the server running on dataDir, or an errs.NotFound error.
// See AttachExpect.
func Attach(dataDir string) (*Instance, error) { return AttachExpect(dataDir, Expect{}) }

// AttachExpect returns the server running on dataDir, or an errs.NotFound
// error when there is none that can be proven to be it.
//
// postmaster.pid belongs to the PostgreSQL OS user, so its pid is not
// trusted: the returned Instance signals the process only if it is proven
// to be the postmaster of dataDir, through a pidfd opened before the proof
// (so a process that later reuses the pid is never signalled). Proven means:
//   - the pid is a valid pid (1 ≤ pid < pid_max: no truncation, no -1);
//   - the process runs as the owner of dataDir, and not as root
//     (PostgreSQL refuses root), nor as another user than ours unless we
//     are root;
//   - its executable is named postgres and its working directory is
//     dataDir (a postmaster chdirs into its data directory);
//   - when want names this pid, its start time is the recorded one.
//
// Anything else — a stale pid, a reused pid, a forged one — is "not
// running": it is never signalled.
func AttachExpect(dataDir string, want Expect) (*Instance, error) {
	notFound := errs.New(errs.NotFound, "no server is running on this data directory").WithPath(dataDir)
	pf, err := ReadPidFile(dataDir)
	if err != nil || !proc.Valid(pf.Pid) {
		return nil, notFound
	}
	h, err := proc.Open(pf.Pid)
	if err != nil {
		return nil, notFound
	}
	if !isPostmaster(dataDir, pf.Pid, want) || !h.Alive() {
		_ = h.Close()
		return nil, notFound
	}
	inst := &Instance{DataDir: dataDir, Pid: pf.Pid, Port: pf.Port, SocketDir: pf.SocketDir, handle: h,
		StartTime: proc.StartTime(pf.Pid)}
	if pf.Listen != "" && pf.Listen != "*" {
		inst.Host = pf.Listen
	}
	return inst, nil
}

// isPostmaster checks the process pid against dataDir and want (see
// AttachExpect). The caller holds a pidfd on pid opened before this check.
func isPostmaster(dataDir string, pid int, want Expect) bool {
	in, err := proc.Inspect(pid)
	if err != nil {
		return false
	}
	fi, err := os.Stat(dataDir)
	if err != nil {
		return false
	}
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !ok || int(st.Uid) != in.UID || in.UID == 0 {
		return false
	}
	if me := os.Geteuid(); me != 0 && in.UID != me {
		return false
	}
	if filepath.Base(in.Exe) != "postgres" {
		return false
	}
	abs, err := filepath.Abs(dataDir)
	if err != nil || !proc.SameFile(in.Cwd, abs) {
		return false
	}
	if want.Pid == pid && want.Start != 0 && in.Start != want.Start {
		return false
	}
	return true
}

// Release closes the handle of an attached server without stopping it
// (and without removing anything). The Instance must not be used after.
func (inst *Instance) Release() {
	if inst.handle != nil {
		_ = inst.handle.Close()
		inst.handle = nil
	}
}

// AttachRecorded returns the postmaster pgfork started and recorded as
// want (pid, start time and user, from a record only pgfork writes) when its
// data directory can no longer prove it: the directory was renamed or
// removed under the running server, or its postmaster.pid forged. The
// process must have the recorded start time (so a reused pid never
// matches), run the postgres executable, and belong to want.UID (the OS
// user pgfork ran it as; never root). It is an errs.NotFound error otherwise.
func AttachRecorded(want Expect) (*Instance, error) {
	uid := want.UID
	notFound := errs.New(errs.NotFound, "the recorded server (pid %d) is not running", want.Pid)
	if want.Start == 0 || !proc.Valid(want.Pid) || uid <= 0 {
		return nil, notFound
	}
	h, err := proc.Open(want.Pid)
	if err != nil {
		return nil, notFound
	}
	in, err := proc.Inspect(want.Pid)
	if err != nil || in.Start != want.Start || in.UID != uid || filepath.Base(in.Exe) != "postgres" || !h.Alive() {
		_ = h.Close()
		return nil, notFound
	}
	return &Instance{Pid: want.Pid, handle: h, StartTime: in.Start}, nil
}
