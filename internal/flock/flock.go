// Package flock takes advisory whole-file locks (flock(2)) on lock files,
// waiting in small steps so that a context can cancel the wait. The kernel
// drops a lock when its holder exits, so a crashed process never leaves a
// lock behind.
//
// It also locks directories themselves (LockDir) so that a cleanup can tell
// a staging directory being built from the remains of a crashed run
// (IsLockedByLiveProcess). flock owns every advisory lock pgfork takes; no
// other package calls flock(2). It imports nothing of pgfork's.
package flock

import (
	"context"
	"errors"
	"os"
	"time"

	"golang.org/x/sys/unix"
)

// ErrBusy is returned by the Try functions when another process holds the lock.
var ErrBusy = errors.New("lock held by another process")

// Lock is a held lock. Release it with Unlock.
type Lock struct {
	f    *os.File
	path string
}

func same(f *os.File, path string) bool {
	a, err := f.Stat()
	if err != nil {
		return false
	}
	b, err := os.Stat(path)
	return err == nil && os.SameFile(a, b)
}

func open(path string) (*os.File, error) {
	return os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o644)
}

func take(ctx context.Context, path string, how int, wait bool) (*Lock, error) {
	f, err := open(path)
	if err != nil {
		return nil, err
	}
	delay := time.Millisecond
	for {
		err := unix.Flock(int(f.Fd()), how|unix.LOCK_NB)
		if err == nil {
			// The file may have been removed (and recreated) by the
			// previous holder while we waited: then our lock guards
			// nothing, so start again on the current file.
			if same(f, path) {
				return &Lock{f: f, path: path}, nil
			}
			f.Close()
			if f, err = open(path); err != nil {
				return nil, err
			}
			continue
		}
		if !errors.Is(err, unix.EWOULDBLOCK) && !errors.Is(err, unix.EINTR) {
			f.Close()
			return nil, &os.PathError{Op: "flock", Path: path, Err: err}
		}
		if !wait {
			f.Close()
			return nil, ErrBusy
		}
		select {
		case <-ctx.Done():
			f.Close()
			return nil, ctx.Err()
		case <-time.After(delay):
		}
		if delay < 20*time.Millisecond {
			delay *= 2
		}
	}
}

// Exclusive waits for an exclusive lock on path (created if missing).
func Exclusive(ctx context.Context, path string) (*Lock, error) {
	return take(ctx, path, unix.LOCK_EX, true)
}

// Shared waits for a shared lock on path (created if missing).
func Shared(ctx context.Context, path string) (*Lock, error) {
	return take(ctx, path, unix.LOCK_SH, true)
}

// TryExclusive takes an exclusive lock on path or returns ErrBusy at once.
func TryExclusive(path string) (*Lock, error) {
	return take(context.Background(), path, unix.LOCK_EX, false)
}

// TryShared takes a shared lock on path or returns ErrBusy at once.
func TryShared(path string) (*Lock, error) {
	return take(context.Background(), path, unix.LOCK_SH, false)
}

// Unlock releases the lock. It is safe to call on a nil Lock and more than once.
//
// The lock belongs to the open file description, which a child forked by
// any goroutine of this process shares until it execs (or for good, if it
// was handed the descriptor): closing only our descriptor would leave the
// lock held for that moment, and a TryExclusive right after (ours or
// another process's) would find it busy. LOCK_UN releases it for every
// holder of the description at once.
func (l *Lock) Unlock() {
	if l == nil || l.f == nil {
		return
	}
	_ = unix.Flock(int(l.f.Fd()), unix.LOCK_UN)
	_ = l.f.Close()
	l.f = nil
}

// Remove deletes the lock file and releases the lock. Waiters notice that
// the file they locked is gone and lock the new one, so removing is safe.
func (l *Lock) Remove() {
	if l == nil || l.f == nil {
		return
	}
	_ = os.Remove(l.path)
	l.Unlock()
}
