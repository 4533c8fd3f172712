package proc

import (
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"
)

func alive(pid int) bool {
	err := unix.Kill(pid, 0)
	return err == nil || errors.Is(err, unix.EPERM)
}

func dir(pid int) string { return "/proc/" + strconv.Itoa(pid) }

// StartTime returns the start time of process pid (clock ticks since boot,
// field 22 of /proc/PID/stat), or 0 when unknown. Together with the pid it
// names one process: a later process reusing the pid has another start time.
func StartTime(pid int) uint64 {
	if !Valid(pid) {
		return 0
	}
	b, err := os.ReadFile(dir(pid) + "/stat")
	if err != nil {
		return 0
	}
	s := string(b)
	// The command name (field 2) may hold spaces and parentheses: skip
	// to the last ')'.
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return 0
	}
	f := strings.Fields(s[i+1:])
	// f[0] is field 3 (state); field 22 is f[19].
	if len(f) < 20 {
		return 0
	}
	v, _ := strconv.ParseUint(f[19], 10, 64)
	return v
}

// UID returns the user id process pid runs as: the owner of the directory
// /proc/PID, which is the process's effective user id even when it is not
// dumpable (the files in it are root's then). Unlike Inspect it needs no
// rights over the process.
func UID(pid int) (int, error) {
	if !Valid(pid) {
		return 0, syscall.ESRCH
	}
	fi, err := os.Stat(dir(pid))
	if err != nil {
		return 0, err
	}
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !ok {
		return 0, errors.New("no owner")
	}
	return int(st.Uid), nil
}

// Info is what Inspect learns about a process.
type Info struct {
	UID   int    // real user id (owner of /proc/PID)
	Exe   string // executable path, without a " (deleted)" suffix
	Cwd   string // working directory
	Start uint64 // as StartTime
}

// Inspect reads a process's owner, executable, working directory and start
// time. Reading exe and cwd of another user's process needs root (or
// ptrace rights); an error means "cannot prove anything about it".
func Inspect(pid int) (Info, error) {
	var in Info
	if !Valid(pid) {
		return in, syscall.ESRCH
	}
	uid, err := UID(pid)
	if err != nil {
		return in, err
	}
	in.UID = uid
	exe, err := os.Readlink(dir(pid) + "/exe")
	if err != nil {
		return in, err
	}
	in.Exe = strings.TrimSuffix(exe, " (deleted)")
	if in.Cwd, err = os.Readlink(dir(pid) + "/cwd"); err != nil {
		return in, err
	}
	in.Start = StartTime(pid)
	if in.Start == 0 {
		return in, syscall.ESRCH
	}
	return in, nil
}

// Handle is a pidfd: it refers to one process for its whole life and
// signals nothing once that process is gone, even if its pid is reused.
type Handle struct {
	pid int
	fd  int
}

// Open opens a handle on process pid. Check what the process is (Inspect)
// after Open and then Handle.Alive: if it is still alive, the handle and
// the inspected process are the same one.
func Open(pid int) (*Handle, error) {
	if !Valid(pid) {
		return nil, syscall.ESRCH
	}
	fd, err := unix.PidfdOpen(pid, 0)
	if err != nil {
		return nil, err
	}
	return &Handle{pid: pid, fd: fd}, nil
}

// Pid returns the process id the handle was opened on.
func (h *Handle) Pid() int { return h.pid }

// Signal sends sig to the process; a process that has exited is no error.
func (h *Handle) Signal(sig syscall.Signal) error {
	err := unix.PidfdSendSignal(h.fd, sig, nil, 0)
	if errors.Is(err, unix.ESRCH) {
		return nil
	}
	return err
}

// Alive reports whether the process has not exited yet.
func (h *Handle) Alive() bool {
	return unix.PidfdSendSignal(h.fd, 0, nil, 0) == nil
}

// Close releases the handle.
func (h *Handle) Close() error {
	if h == nil || h.fd < 0 {
		return nil
	}
	err := unix.Close(h.fd)
	h.fd = -1
	return err
}

// SameFile reports whether two paths name the same directory entry after
// resolving symlinks (for comparing a process's cwd with a data directory).
func SameFile(a, b string) bool {
	ra, err1 := filepath.EvalSymlinks(a)
	rb, err2 := filepath.EvalSymlinks(b)
	if err1 != nil || err2 != nil {
		return filepath.Clean(a) == filepath.Clean(b)
	}
	if ra == rb {
		return true
	}
	fa, err1 := os.Stat(ra)
	fb, err2 := os.Stat(rb)
	return err1 == nil && err2 == nil && os.SameFile(fa, fb)
}
