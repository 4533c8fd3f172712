//go:build !linux && !darwin

package fsutil

// RenameNoReplace renames oldpath to newpath, failing with an error
// matching fs.ErrExist when newpath exists. Without renameat2 it checks
// first, then renames (a race with another writer remains possible).
func RenameNoReplace(oldpath, newpath string) error {
	return renameChecked(oldpath, newpath)
}

// Exchange reports that this platform cannot swap two paths atomically
// (ok false): the caller renames the old one aside.
func Exchange(oldpath, newpath string) (ok bool, err error) { return false, nil }
