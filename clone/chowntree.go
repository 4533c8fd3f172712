//go:build unix

package clone

import (
	"os"

	"golang.org/x/sys/unix"
)

// chownTreeHook, when set (by tests), runs after ChownTree has listed a
// directory and before it changes the owner of that directory's entries:
// the moment another user would swap a directory for a symlink.
var chownTreeHook func(dir string)

// ChownTree gives the tree at path to uid:gid without ever following a
// symlink: the top is opened with O_NOFOLLOW, every entry is changed by
// fchownat relative to its directory's descriptor (AT_SYMLINK_NOFOLLOW),
// and subdirectories are opened relative to their parent's descriptor with
// O_NOFOLLOW, so a directory swapped for a symlink during the walk (by a
// user who can write the tree) is refused, never followed. The top
// directory's owner is changed last, by descriptor. Root calls it for
// trees the run-as user can write (issue 19 F4b).
func ChownTree(path string, uid, gid int) error {
	fd, err := unix.Open(path, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		if err == unix.ENOTDIR || err == unix.ELOOP {
			// A file (or symlink) at the top: change it, not its target.
			if err := unix.Fchownat(unix.AT_FDCWD, path, uid, gid, unix.AT_SYMLINK_NOFOLLOW); err != nil {
				return &os.PathError{Op: "lchown", Path: path, Err: err}
			}
			return nil
		}
		return &os.PathError{Op: "open", Path: path, Err: err}
	}
	f := os.NewFile(uintptr(fd), path)
	defer f.Close()
	if err := chownDirFD(f, path, uid, gid); err != nil {
		return err
	}
	if err := unix.Fchown(fd, uid, gid); err != nil {
		return &os.PathError{Op: "fchown", Path: path, Err: err}
	}
	return nil
}

// chownDirFD changes the owner of every entry under the open directory d
// (named path in errors), not d itself.
func chownDirFD(d *os.File, path string, uid, gid int) error {
	ents, err := d.ReadDir(-1)
	if err != nil {
		return err
	}
	if chownTreeHook != nil {
		chownTreeHook(path)
	}
	dfd := int(d.Fd())
	for _, e := range ents {
		name := e.Name()
		p := path + "/" + name
		if e.IsDir() {
			cfd, err := unix.Openat(dfd, name, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
			if err != nil {
				return &os.PathError{Op: "open", Path: p, Err: err}
			}
			c := os.NewFile(uintptr(cfd), p)
			err = chownDirFD(c, p, uid, gid)
			if err == nil {
				if e := unix.Fchown(cfd, uid, gid); e != nil {
					err = &os.PathError{Op: "fchown", Path: p, Err: e}
				}
			}
			c.Close()
			if err != nil {
				return err
			}
			continue
		}
		if err := unix.Fchownat(dfd, name, uid, gid, unix.AT_SYMLINK_NOFOLLOW); err != nil {
			return &os.PathError{Op: "lchown", Path: p, Err: err}
		}
	}
	return nil
}
