package fsutil

import (
	"errors"
	"io/fs"
	"os"

	"golang.org/x/sys/unix"
)

// RenameNoReplace renames oldpath to newpath, failing with an error
// matching fs.ErrExist when newpath exists: renamex_np(RENAME_EXCL), atomic
// on APFS and HFS+; on filesystems without it, check first, then rename.
func RenameNoReplace(oldpath, newpath string) error {
	err := unix.RenamexNp(oldpath, newpath, unix.RENAME_EXCL)
	if errors.Is(err, unix.ENOTSUP) || errors.Is(err, unix.EINVAL) {
		return renameChecked(oldpath, newpath)
	}
	if err != nil {
		if errors.Is(err, unix.EEXIST) {
			err = fs.ErrExist
		}
		return &os.LinkError{Op: "rename", Old: oldpath, New: newpath, Err: err}
	}
	return nil
}

// Exchange atomically swaps oldpath and newpath (both must exist):
// renamex_np's RENAME_SWAP, on APFS and HFS+. ok is false when the
// filesystem cannot do it (the caller then renames the old one aside).
func Exchange(oldpath, newpath string) (ok bool, err error) {
	err = unix.RenamexNp(oldpath, newpath, unix.RENAME_SWAP)
	if errors.Is(err, unix.ENOTSUP) || errors.Is(err, unix.EINVAL) {
		return false, nil
	}
	if err != nil {
		return false, &os.LinkError{Op: "rename exchange", Old: oldpath, New: newpath, Err: err}
	}
	return true, nil
}
