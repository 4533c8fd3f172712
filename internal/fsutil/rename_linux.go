package fsutil

import (
	"errors"
	"io/fs"
	"os"

	"golang.org/x/sys/unix"
)

// RenameNoReplace renames oldpath to newpath in one step that fails with an
// error matching fs.ErrExist when newpath exists, even as an empty
// directory (which os.Rename would replace). It is how a finished copy is
// moved under its final name without ever clobbering one. On filesystems
// without renameat2's RENAME_NOREPLACE it checks first, then renames.
func RenameNoReplace(oldpath, newpath string) error {
	err := unix.Renameat2(unix.AT_FDCWD, oldpath, unix.AT_FDCWD, newpath, unix.RENAME_NOREPLACE)
	if errors.Is(err, unix.EINVAL) || errors.Is(err, unix.ENOSYS) {
		return renameChecked(oldpath, newpath)
	}
	if err != nil {
		if errors.Is(err, unix.EEXIST) || errors.Is(err, unix.ENOTEMPTY) {
			err = fs.ErrExist
		}
		return &os.LinkError{Op: "rename", Old: oldpath, New: newpath, Err: err}
	}
	return nil
}

// Exchange atomically swaps oldpath and newpath (both must exist):
// renameat2's RENAME_EXCHANGE. ok is false when the filesystem cannot do it
// (the caller then renames the old one aside).
func Exchange(oldpath, newpath string) (ok bool, err error) {
	err = unix.Renameat2(unix.AT_FDCWD, oldpath, unix.AT_FDCWD, newpath, unix.RENAME_EXCHANGE)
	if errors.Is(err, unix.EINVAL) || errors.Is(err, unix.ENOSYS) {
		return false, nil
	}
	if err != nil {
		return false, &os.LinkError{Op: "rename exchange", Old: oldpath, New: newpath, Err: err}
	}
	return true, nil
}
