//go:build !linux && !darwin

package clone

import (
	"io/fs"
	"os"
)

func cloneFile(*os.File, *os.File) error { return errNotHere }

func cloneUnsupported(error) bool { return false }

func renameNoReplace(oldpath, newpath string) error {
	if _, err := os.Lstat(newpath); err == nil {
		return &os.LinkError{Op: "rename", Old: oldpath, New: newpath, Err: fs.ErrExist}
	}
	return os.Rename(oldpath, newpath)
}

func freeBytes(string) (int64, error) { return 0, errNotHere }
