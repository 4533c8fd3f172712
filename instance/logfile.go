package instance

import (
	"os"

	"github.com/pgfork/pgfork/internal/errs"
)

// OpenLog opens a server's log file for appending, as u when u is set (root
// running PostgreSQL as another user): the log belongs to the server's user
// and is opened with that user's rights, never root's, so whoever can write
// the log's directory cannot make root open, create or chown another file
// through it (docs/SECURITY.md). It refuses a name that is a symlink or not
// a regular file. Without u it opens as the calling user, with the same
// refusals.
func OpenLog(path string, u *OSUser) (*os.File, error) {
	var f *os.File
	var err error
	if u != nil && os.Geteuid() == 0 {
		f, err = openAs(path, u.UID, u.GID)
	} else {
		f, err = openLogFile(path)
	}
	if err != nil {
		if errs.OSKind(err) == errs.Permission && u != nil {
			return nil, errs.FromOS(err, path, "%s cannot write the server log", u.Name).(*errs.Error).
				WithHint("put the log in a directory %s may write (the data directory is one)", u.Name)
		}
		return nil, errs.FromOS(err, path, "cannot open the server log")
	}
	return f, nil
}

// openLogFile opens path with logOpenFlags and checks it is a regular file.
func openLogFile(path string) (*os.File, error) {
	f, err := os.OpenFile(path, logOpenFlags, 0o600)
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
