package server

import (
	"errors"
	"io/fs"
	"net"
	"os"
	"syscall"
	"time"

	"github.com/pgfork/pgfork/internal/errs"
	"github.com/pgfork/pgfork/internal/safefs"
)

// ListenUnix listens on a Unix socket at path, mode 0600. What is already
// at path is removed only when it is a stale socket (a socket no process
// listens on, left by a crash); a live socket is errs.Busy, anything else
// (a regular file, a directory, a symlink) is refused and left alone: as
// root, `--socket /etc/passwd` used to delete it (issue 19, F14).
func ListenUnix(path string) (net.Listener, error) {
	fi, err := os.Lstat(path)
	switch {
	case errors.Is(err, fs.ErrNotExist):
	case err != nil:
		return nil, errs.FromOS(err, path, "cannot use the socket path")
	case fi.Mode()&fs.ModeSocket == 0:
		return nil, errs.New(errs.Exists, "%s is in the way of the socket (not a socket); pgfork removes only a stale socket of its own", safefs.TypeName(fi.Mode())).
			WithPath(path).WithHint("choose a path where nothing is, or remove what is there yourself")
	default:
		c, derr := net.DialTimeout("unix", path, time.Second)
		if derr == nil {
			c.Close()
			return nil, errs.New(errs.Busy, "another process listens on the socket").WithPath(path).
				WithHint("stop it, or choose another socket path")
		}
		if !errors.Is(derr, syscall.ECONNREFUSED) {
			return nil, errs.FromOS(derr, path, "cannot tell whether the socket is in use")
		}
		if err := os.Remove(path); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return nil, errs.FromOS(err, path, "cannot remove the stale socket")
		}
	}
	old := syscall.Umask(0o177)
	l, err := net.Listen("unix", path)
	syscall.Umask(old)
	if err != nil {
		return nil, errs.FromOS(err, path, "cannot listen on the socket")
	}
	if err := os.Chmod(path, 0o600); err != nil {
		l.Close()
		return nil, errs.FromOS(err, path, "cannot make the socket private")
	}
	return l, nil
}
