//go:build !linux

package safefs

import (
	"errors"
	"os"
	"path/filepath"
	"syscall"
)

func openDirectory(dir string) (*os.File, error) { return os.Open(dir) }

// openBeneath opens rel one component at a time, refusing symlinks (Lstat
// before each step: outside Linux pgfork does not run as root for others).
func openBeneath(d *Dir, rel string) (*os.File, error) {
	p := d.path
	for _, part := range splitSlash(rel) {
		p = filepath.Join(p, part)
		fi, err := os.Lstat(p)
		if err != nil {
			return nil, err
		}
		if fi.Mode()&os.ModeSymlink != 0 {
			return nil, &os.PathError{Op: "open", Path: p, Err: ErrSymlink}
		}
	}
	f, err := os.OpenFile(p, os.O_RDONLY|syscall.O_NOFOLLOW|syscall.O_NONBLOCK, 0)
	if err != nil && errors.Is(err, syscall.ELOOP) {
		return nil, &os.PathError{Op: "open", Path: p, Err: ErrSymlink}
	}
	return f, err
}

// readlinkAt reads the link name in the open directory dir (by its path:
// outside Linux pgfork does not run as root for others).
func readlinkAt(dir *os.File, name string) (string, error) {
	return os.Readlink(filepath.Join(dir.Name(), name))
}
