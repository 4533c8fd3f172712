package clone

import (
	"io/fs"
	"os"
	"syscall"

	"github.com/pgfork/pgfork/internal/errs"
)

// HandOver gives the finished directory dir its owner (uid/gid; -1 keeps
// one) and mode, by descriptor and without following a symlink: the last
// step of building a tree for another user in a directory that was root's
// and private until then (docs/SECURITY.md, "Root and trees other users
// can write").
func HandOver(dir string, uid, gid int, mode fs.FileMode) error {
	f, err := os.OpenFile(dir, os.O_RDONLY|syscall.O_DIRECTORY|syscall.O_NOFOLLOW, 0)
	if err != nil {
		return err
	}
	defer f.Close()
	if uid >= 0 || gid >= 0 {
		if err := f.Chown(uid, gid); err != nil {
			return err
		}
	}
	return f.Chmod(mode)
}

// SameDir checks that the name dir still names the directory built, whose
// FileInfo was taken when it was made: between filling a staging directory
// and renaming it into place, whoever can write its parent could have put
// something else under its name.
func SameDir(dir string, built os.FileInfo) error {
	if built == nil {
		return nil
	}
	now, err := os.Lstat(dir)
	if err != nil || !os.SameFile(now, built) {
		return errs.New(errs.Permission, "the staging directory was replaced while it was being filled").WithPath(dir).
			WithHint("build the copy in a directory whose parent only you can write")
	}
	return nil
}
