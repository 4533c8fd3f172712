//go:build !linux

package proc

import (
	"errors"
	"os"
	"path/filepath"
	"syscall"
)

func alive(pid int) bool {
	err := syscall.Kill(pid, 0)
	return err == nil || errors.Is(err, syscall.EPERM)
}

// StartTime returns 0 (unknown) outside Linux.
func StartTime(int) uint64 { return 0 }

// UID cannot tell who runs a process outside Linux.
func UID(int) (int, error) { return 0, errors.ErrUnsupported }

// Info is what Inspect learns about a process.
type Info struct {
	UID   int
	Exe   string
	Cwd   string
	Start uint64
}

// Inspect cannot prove anything about a process outside Linux.
func Inspect(int) (Info, error) { return Info{}, errors.ErrUnsupported }

// Handle signals a process by pid (no pidfd outside Linux).
type Handle struct{ pid int }

// Open returns a handle on process pid.
func Open(pid int) (*Handle, error) {
	if !Valid(pid) || !alive(pid) {
		return nil, syscall.ESRCH
	}
	return &Handle{pid: pid}, nil
}

// Pid returns the process id the handle was opened on.
func (h *Handle) Pid() int { return h.pid }

// Signal sends sig to the process; a process that has exited is no error.
func (h *Handle) Signal(sig syscall.Signal) error {
	err := syscall.Kill(h.pid, sig)
	if errors.Is(err, syscall.ESRCH) {
		return nil
	}
	return err
}

// Alive reports whether the process has not exited yet.
func (h *Handle) Alive() bool { return alive(h.pid) }

// Close releases the handle.
func (h *Handle) Close() error { return nil }

// SameFile reports whether two paths name the same directory.
func SameFile(a, b string) bool {
	fa, err1 := os.Stat(a)
	fb, err2 := os.Stat(b)
	if err1 != nil || err2 != nil {
		return filepath.Clean(a) == filepath.Clean(b)
	}
	return os.SameFile(fa, fb)
}

// Background does nothing here: the process keeps its priority.
func Background() error { return nil }

// LowerTree does nothing here: the child keeps its priority.
func LowerTree(pid int) error { return nil }
