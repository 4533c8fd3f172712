package safefs

import (
	"errors"
	"os"

	"golang.org/x/sys/unix"
)

func openDirectory(dir string) (*os.File, error) {
	fd, err := unix.Open(dir, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, &os.PathError{Op: "open", Path: dir, Err: err}
	}
	return os.NewFile(uintptr(fd), dir), nil
}

// openBeneath opens rel below d with openat2(RESOLVE_NO_SYMLINKS |
// RESOLVE_BENEATH), or, where the kernel lacks openat2 (before 5.6), one
// component at a time with O_NOFOLLOW.
func openBeneath(d *Dir, rel string) (*os.File, error) {
	how := unix.OpenHow{
		Flags:   unix.O_RDONLY | unix.O_NOFOLLOW | unix.O_NONBLOCK | unix.O_CLOEXEC,
		Resolve: unix.RESOLVE_NO_SYMLINKS | unix.RESOLVE_BENEATH | unix.RESOLVE_NO_MAGICLINKS,
	}
	for {
		fd, err := unix.Openat2(int(d.f.Fd()), rel, &how)
		switch {
		case err == nil:
			return os.NewFile(uintptr(fd), d.join(rel)), nil
		case errors.Is(err, unix.EINTR), errors.Is(err, unix.EAGAIN):
			continue // EAGAIN: a rename raced the lookup
		case errors.Is(err, unix.ELOOP):
			return nil, &os.PathError{Op: "open", Path: d.join(rel), Err: ErrSymlink}
		case errors.Is(err, unix.ENOSYS):
			return openByComponents(d, rel)
		}
		return nil, &os.PathError{Op: "open", Path: d.join(rel), Err: err}
	}
}

func openByComponents(d *Dir, rel string) (*os.File, error) {
	parts := splitSlash(rel)
	dirfd := int(d.f.Fd())
	owned := -1
	defer func() {
		if owned >= 0 {
			unix.Close(owned)
		}
	}()
	for i, p := range parts {
		flags := unix.O_RDONLY | unix.O_NOFOLLOW | unix.O_NONBLOCK | unix.O_CLOEXEC
		if i < len(parts)-1 {
			flags |= unix.O_DIRECTORY
		}
		fd, err := unix.Openat(dirfd, p, flags, 0)
		if err != nil {
			if errors.Is(err, unix.ELOOP) || (i < len(parts)-1 && errors.Is(err, unix.ENOTDIR) && isSymlinkAt(dirfd, p)) {
				err = ErrSymlink
			}
			return nil, &os.PathError{Op: "open", Path: d.join(rel), Err: err}
		}
		if owned >= 0 {
			unix.Close(owned)
		}
		if i == len(parts)-1 {
			return os.NewFile(uintptr(fd), d.join(rel)), nil
		}
		owned, dirfd = fd, fd
	}
	return nil, &os.PathError{Op: "open", Path: d.join(rel), Err: unix.EINVAL}
}

func isSymlinkAt(dirfd int, name string) bool {
	var st unix.Stat_t
	return unix.Fstatat(dirfd, name, &st, unix.AT_SYMLINK_NOFOLLOW) == nil && st.Mode&unix.S_IFMT == unix.S_IFLNK
}

// readlinkAt reads the link name in the open directory dir.
func readlinkAt(dir *os.File, name string) (string, error) {
	for n := 256; ; n *= 2 {
		buf := make([]byte, n)
		k, err := unix.Readlinkat(int(dir.Fd()), name, buf)
		if err != nil {
			return "", err
		}
		if k < n {
			return string(buf[:k]), nil
		}
	}
}
