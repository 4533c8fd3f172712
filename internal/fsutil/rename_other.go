//go:build !linux && !darwin

package fsutil

// RenameNoReplace renames oldpath to newpath, failing with an error
// matching fs.ErrExist when newpath exists. Without renameat2 it checks
// first, then renames (a race with another writer remains possible).
func RenameNoReplace(oldpath, newpath string) error {
	return renameChecked(oldpath, newpath)
}
