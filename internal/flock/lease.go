package flock

import (
	"errors"
	"os"
	"strconv"

	"golang.org/x/sys/unix"
)

// Held reports whether any process holds a lock (shared or exclusive) on
// the file path: a lease that processes keep by holding a shared lock
// (`pgfork serve --lease`), a flock(2) lock (Rust's File::lock_shared,
// Python's fcntl.flock, flock(1)) or a POSIX record lock (Java's
// FileChannel.lock, fcntl(2)/lockf), which flock does not see on Linux. It takes an exclusive lock for a moment when
// the file is free, so a process asking for a shared lock just then waits
// that moment (Shared waits; TryShared would fail). A missing file is not
// held. The file is opened read-only, never created or followed as a
// symlink.
func Held(path string) (bool, error) {
	fd, err := unix.Open(path, unix.O_RDONLY|unix.O_CLOEXEC|unix.O_NOFOLLOW|unix.O_NONBLOCK, 0)
	if errors.Is(err, unix.ENOENT) {
		return false, nil
	}
	if err != nil {
		return false, &os.PathError{Op: "open", Path: path, Err: err}
	}
	defer unix.Close(fd)
	for {
		err = unix.Flock(fd, unix.LOCK_EX|unix.LOCK_NB)
		if !errors.Is(err, unix.EINTR) {
			break
		}
	}
	switch {
	case err == nil:
		return recordLocked(fd, path) // closing fd releases the flock
	case errors.Is(err, unix.EWOULDBLOCK):
		return true, nil
	}
	return false, &os.PathError{Op: "flock", Path: path, Err: err}
}

// CloseInherited closes the descriptors above stderr that this process
// inherited on the file path, and returns how many. A lock its starter
// took on a descriptor it let the child inherit (the shell's
// `exec 9>FILE; flock -s 9`) is held by the child too, through the same
// open file description: Held would never see the lease end. Closing the
// child's copy leaves the starter's lock as long as the starter keeps
// its own. Call it before this process opens path itself.
func CloseInherited(path string) (int, error) {
	var want unix.Stat_t
	if err := unix.Stat(path, &want); err != nil {
		if errors.Is(err, unix.ENOENT) {
			return 0, nil
		}
		return 0, &os.PathError{Op: "stat", Path: path, Err: err}
	}
	n := 0
	for _, fd := range openFDs() {
		var st unix.Stat_t
		if fd <= 2 || unix.Fstat(fd, &st) != nil {
			continue
		}
		if st.Dev == want.Dev && st.Ino == want.Ino {
			if unix.Close(fd) == nil {
				n++
			}
		}
	}
	return n, nil
}

// openFDs lists this process's open descriptors: /dev/fd (Linux, macOS),
// else the first 1024.
func openFDs() []int {
	var fds []int
	if ents, err := os.ReadDir("/dev/fd"); err == nil {
		for _, e := range ents {
			if n, err := strconv.Atoi(e.Name()); err == nil {
				fds = append(fds, n)
			}
		}
		return fds
	}
	for fd := 3; fd < 1024; fd++ {
		fds = append(fds, fd)
	}
	return fds
}

// recordLocked reports whether another process holds a POSIX record lock
// on any byte of the open file fd: F_GETLK asks whether a write lock over
// the whole file could be placed, without placing one (so a read-only
// descriptor will do).
func recordLocked(fd int, path string) (bool, error) {
	lk := unix.Flock_t{Type: unix.F_WRLCK, Whence: 0, Start: 0, Len: 0}
	for {
		err := unix.FcntlFlock(uintptr(fd), unix.F_GETLK, &lk)
		if errors.Is(err, unix.EINTR) {
			continue
		}
		if err != nil {
			return false, &os.PathError{Op: "fcntl F_GETLK", Path: path, Err: err}
		}
		return lk.Type != unix.F_UNLCK, nil
	}
}
