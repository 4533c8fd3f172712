package instance

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"syscall"

	"github.com/pgfork/pgfork/internal/errs"
)

// OpenAppend opens a file that belongs to the server's user (its log, a
// settings file in its data directory) for appending, creating it 0600, as
// u when u is set (root running PostgreSQL as another user): the file is
// opened with that user's rights, never root's, so whoever can write its
// directory cannot make root open, create or chown another file through it
// (docs/SECURITY.md). It refuses a name that is a symlink or not a regular
// file. Where the user may not write the directory, root opens it only if no
// other user can change that directory or any above it. Without u it opens
// as the calling user, with the same refusals.
func OpenAppend(path string, u *OSUser) (*os.File, error) { return openFor(path, u, false) }

// WriteFileAs replaces the contents of path, a file of the server's user
// (pg_hba.conf in its data directory), with data, opened as OpenAppend
// opens (the user's rights, no symlink, regular files only) but truncated.
func WriteFileAs(path string, u *OSUser, data []byte) error {
	f, err := openFor(path, u, true)
	if err != nil {
		return err
	}
	if _, err := f.Write(data); err != nil {
		f.Close()
		return errs.FromOS(err, path, "cannot write %s", filepath.Base(path))
	}
	if err := f.Close(); err != nil {
		return errs.FromOS(err, path, "cannot write %s", filepath.Base(path))
	}
	return nil
}

func openFor(path string, u *OSUser, trunc bool) (*os.File, error) {
	var f *os.File
	var err error
	if u != nil && os.Geteuid() == 0 {
		f, err = openAs(path, u.UID, u.GID, trunc)
		if err != nil && deniedByOS(err) {
			// The user may not write there: a directory of root's (a test
			// run's directory, a workspace). Root opens the log itself only
			// where no other user can change the path (trustedDir), and
			// hands the file over by descriptor.
			f, err = openTrusted(path, u, trunc)
		}
	} else {
		f, err = openLogFile(path, trunc)
	}
	if err != nil {
		return nil, errs.FromOS(err, path, "cannot open %s for writing", filepath.Base(path))
	}
	return f, nil
}

// deniedByOS reports whether open(2) itself refused the user (EACCES,
// EPERM): only then may root try in its stead. pgfork's own refusals (the
// name is a symlink, not a regular file) are the answer as they are: before,
// a planted symlink was blamed on the directory (issue 32, F11).
func deniedByOS(err error) bool {
	return errs.KindOf(err) == errs.Internal && (errors.Is(err, syscall.EACCES) || errors.Is(err, syscall.EPERM))
}

// openTrusted opens path as root when its directory, and every directory
// above it, is root's and writable by no one else, then gives the file to
// u by descriptor. A file that belongs to someone else is refused.
func openTrusted(path string, u *OSUser, trunc bool) (*os.File, error) {
	// The path as given (its symlinks must be root's, in root's
	// directories) and the path it resolves to must both be out of other
	// users' reach.
	given, err := filepath.Abs(filepath.Dir(path))
	if err != nil {
		return nil, err
	}
	dir, err := filepath.EvalSymlinks(given)
	if err != nil {
		return nil, err
	}
	why := untrusted(given)
	if why == "" {
		why = untrusted(dir)
	}
	if why != "" {
		return nil, errs.New(errs.Permission, "%s cannot write the server log's directory, and pgfork opens it as root only in a directory no other user can change (%s)", u.Name, why).
			WithPath(path).WithHint("put the log in a directory %s owns (the data directory is one), or in one only root can write", u.Name)
	}
	f, err := openLogFile(filepath.Join(dir, filepath.Base(path)), trunc)
	if err != nil {
		return nil, err
	}
	fi, err := f.Stat()
	if err != nil {
		f.Close()
		return nil, err
	}
	if st, ok := fi.Sys().(*syscall.Stat_t); ok && st.Uid != 0 && int(st.Uid) != u.UID {
		f.Close()
		return nil, errs.New(errs.Permission, "the server log belongs to uid %d, neither root nor %s", st.Uid, u.Name).WithPath(path).
			WithHint("remove it; the log is created anew")
	}
	if err := f.Chown(u.UID, u.GID); err != nil {
		f.Close()
		return nil, err
	}
	return f, nil
}

// untrusted says why another user could change what dir names, or "" when
// none can: dir and each directory above it must be root's and writable by
// no one else (a symlink on the way must be root's); above dir a sticky
// directory (/tmp) is fine, as its entries can only be renamed by their
// owners.
func untrusted(dir string) string {
	for p := dir; ; p = filepath.Dir(p) {
		fi, err := os.Lstat(p)
		if err != nil {
			return err.Error()
		}
		st, ok := fi.Sys().(*syscall.Stat_t)
		if !ok {
			return "cannot read its owner"
		}
		if st.Uid != 0 {
			return fmt.Sprintf("%s belongs to uid %d", p, st.Uid)
		}
		if fi.Mode()&os.ModeSymlink == 0 && fi.Mode().Perm()&0o022 != 0 && (p == dir || fi.Mode()&os.ModeSticky == 0) {
			return fmt.Sprintf("others may write %s", p)
		}
		if p == filepath.Dir(p) {
			return ""
		}
	}
}

// openLogFile opens path with logOpenFlags (truncated when trunc) and
// checks it is a regular file.
func openLogFile(path string, trunc bool) (*os.File, error) {
	flags := logOpenFlags
	if trunc {
		flags = flags&^os.O_APPEND | os.O_TRUNC
	}
	f, err := os.OpenFile(path, flags, 0o600)
	if err != nil {
		if isSymlinkLoop(err) {
			return nil, errs.New(errs.Permission, "the server log is a symbolic link; pgfork does not follow it").WithPath(path).
				WithHint("remove the link; the log is created as a plain file")
		}
		return nil, err
	}
	fi, err := f.Stat()
	if err != nil {
		f.Close()
		return nil, err
	}
	if !fi.Mode().IsRegular() {
		f.Close()
		return nil, errs.New(errs.Usage, "the server log is not a regular file (%s)", fi.Mode().Type()).WithPath(path).
			WithHint("remove it; the log is created as a plain file")
	}
	return f, nil
}
