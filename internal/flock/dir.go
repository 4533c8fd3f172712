package flock

import (
	"errors"
	"os"

	"golang.org/x/sys/unix"
)

// LockDir takes an exclusive lock on the directory dir itself (no lock file)
// and holds it until release is called or the process exits. Staging
// directories are locked this way while they are built, so that a cleanup
// of leftovers can tell a live build from the remains of a crashed one
// (IsLockedByLiveProcess). A dir held by someone else gives ErrBusy.
func LockDir(dir string) (release func(), err error) {
	fd, err := unix.Open(dir, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, &os.PathError{Op: "open", Path: dir, Err: err}
	}
	if err := unix.Flock(fd, unix.LOCK_EX|unix.LOCK_NB); err != nil {
		unix.Close(fd)
		if errors.Is(err, unix.EWOULDBLOCK) {
			return nil, ErrBusy
		}
		return nil, &os.PathError{Op: "flock", Path: dir, Err: err}
	}
	return func() { _ = unix.Flock(fd, unix.LOCK_UN); unix.Close(fd) }, nil // LOCK_UN: see Lock.Unlock
}

// IsLockedByLiveProcess reports whether a live process holds LockDir's
// lock on dir. A directory that cannot be opened (gone, a symlink) is not
// locked. The test takes the lock for a moment when it is free.
func IsLockedByLiveProcess(dir string) bool {
	fd, err := unix.Open(dir, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC|unix.O_NOFOLLOW, 0)
	if err != nil {
		return false
	}
	defer unix.Close(fd)
	err = unix.Flock(fd, unix.LOCK_EX|unix.LOCK_NB)
	return errors.Is(err, unix.EWOULDBLOCK)
}
