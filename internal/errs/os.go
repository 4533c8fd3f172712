package errs

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"syscall"
)

// FromOS classifies an error from the operating system (a file operation, a
// rename, a lock, a process) on object, a path or name ("" when the error
// names its own path), and returns it as an *Error whose message is the
// formatted text:
//
//	ENOSPC, EDQUOT           NoSpace
//	EACCES, EPERM, EROFS     Permission
//	ENOENT                   NotFound
//	EEXIST, ENOTEMPTY        Exists
//	EBUSY                    Busy
//	EXDEV, EOPNOTSUPP        Unsupported
//	context.Canceled         Interrupted
//	anything else            Internal
//
// An error that already carries a kind other than Internal (an *Error in its
// chain) is returned as it is, so FromOS may be applied more than once on the
// way up; an Internal one is classified by the OS error it wraps. FromOS
// returns nil (an untyped nil) when err is nil. The hint it sets for the
// kinds a user can act on names no command, only what to change.
func FromOS(err error, object, format string, args ...any) error {
	if err == nil {
		return nil
	}
	if KindOf(err) != Internal {
		return err
	}
	// The object is named once, by the typed error; the OS error's own
	// copy of the path would repeat it. Without an object the OS error
	// keeps its path.
	cause := err
	var pe *fs.PathError
	var le *os.LinkError
	var se *os.SyscallError
	var typed *Error
	switch {
	case object == "", errors.As(err, &typed): // a typed cause keeps its own message
	case errors.As(err, &pe):
		cause = pe.Err
	case errors.As(err, &le):
		cause = le.Err
	case errors.As(err, &se):
		cause = se.Err
	}
	e := &Error{Kind: OSKind(err), Msg: fmt.Sprintf(format, args...), Path: object, Err: cause}
	switch e.Kind {
	case NoSpace:
		e.Hint = "free some space on that filesystem (or write elsewhere) and retry"
	case Permission:
		e.Hint = "run pgfork as a user that may read and write there (or as root); a read-only filesystem cannot be written"
	}
	return e
}

// OSKind returns the kind FromOS gives err, without wrapping it. An *Error in
// err's chain gives its own kind, unless that is Internal: then the OS error
// it wraps decides.
func OSKind(err error) Kind {
	if k := KindOf(err); k != Internal {
		return k
	}
	switch {
	case err == nil:
		return Internal
	case errors.Is(err, context.Canceled):
		return Interrupted
	case errors.Is(err, syscall.ENOSPC), errors.Is(err, syscall.EDQUOT):
		return NoSpace
	case errors.Is(err, syscall.EACCES), errors.Is(err, syscall.EPERM), errors.Is(err, syscall.EROFS),
		errors.Is(err, fs.ErrPermission):
		return Permission
	case errors.Is(err, syscall.ENOENT), errors.Is(err, fs.ErrNotExist):
		return NotFound
	case errors.Is(err, syscall.EEXIST), errors.Is(err, syscall.ENOTEMPTY), errors.Is(err, fs.ErrExist):
		return Exists
	case errors.Is(err, syscall.EBUSY):
		return Busy
	case errors.Is(err, syscall.EXDEV), errors.Is(err, syscall.EOPNOTSUPP):
		return Unsupported
	}
	return Internal
}
