// Package errs defines pgfork's error kinds: typed errors that carry what
// went wrong, the file or object concerned, and a hint that tells the user
// what to do. FromOS is the one place where an operating-system error becomes
// a kind. The CLI maps kinds to exit codes in one place
// (cmd/pgfork/exitcodes.go), the HTTP server to status codes in another
// (server.StatusOf).
//
// errs imports nothing of pgfork's. Hints written here and in library
// packages must make sense to every caller, an HTTP client of pgfork serve
// as much as a shell user: they say what to change, not which pgfork command
// to run (the CLI adds command-specific advice itself).
package errs

import (
	"errors"
	"fmt"
)

// Kind classifies an error so that callers (and the CLI's exit code) can act
// on it without parsing messages.
type Kind int

// Error kinds. Their order is stable: the CLI documents the exit code of each.
const (
	// Internal is an unexpected failure: I/O errors, a server that crashed.
	Internal Kind = iota
	// Usage is bad input from the user: a flag value, a name, a path.
	Usage
	// NotFound means a source, cluster, template, snapshot or binary is missing.
	NotFound
	// Exists means the destination or name is already taken.
	Exists
	// Unsupported means the filesystem, server version or platform cannot do
	// what was asked (e.g. --method clone on ext4).
	Unsupported
	// Busy means something else holds the object (sessions on a template,
	// a running cluster, a lock).
	Busy
	// NoSpace means the target filesystem ran out of space.
	NoSpace
	// Permission means the OS or the server refused access.
	Permission
	// Interrupted means the operation was cancelled (Ctrl-C, SIGTERM).
	Interrupted
)

var kindNames = [...]string{"internal", "usage", "not-found", "exists", "unsupported", "busy", "no-space", "permission", "interrupted"}

// String returns the kind's stable machine-readable name (used in --json).
func (k Kind) String() string {
	if int(k) < len(kindNames) {
		return kindNames[k]
	}
	return fmt.Sprintf("kind(%d)", int(k))
}

// Error is an error with a kind, the object it concerns and a hint.
type Error struct {
	Kind Kind
	// Msg says what went wrong, in words a user understands.
	Msg string
	// Path is the file, directory or object name concerned, if any.
	Path string
	// Hint says what the user can do about it, in words that hold for every
	// front end (the CLI and HTTP clients of pgfork serve); may be empty.
	Hint string
	// CLI is advice that names pgfork's command line (a command, a flag). The
	// CLI prints it after Hint; other front ends leave it out.
	CLI string
	// Err is the underlying cause, if any.
	Err error
}

func (e *Error) Error() string {
	s := e.Msg
	if e.Path != "" {
		if s == "" {
			s = e.Path
		} else {
			s = e.Path + ": " + s
		}
	}
	if e.Err != nil {
		if s == "" {
			s = e.Err.Error()
		} else {
			s += ": " + e.Err.Error()
		}
	}
	return s
}

// Unwrap returns the underlying cause.
func (e *Error) Unwrap() error { return e.Err }

// New returns an error of the given kind with a formatted message.
func New(kind Kind, format string, args ...any) *Error {
	return &Error{Kind: kind, Msg: fmt.Sprintf(format, args...)}
}

// Wrap returns an error of the given kind wrapping err, with a message.
// It never returns nil: with a nil err the result is an error of that kind
// without a cause. (A nil *Error stored in an error interface is not nil, so
// returning one would turn "no error" into an error that panics when read.)
func Wrap(kind Kind, err error, format string, args ...any) *Error {
	return &Error{Kind: kind, Msg: fmt.Sprintf(format, args...), Err: err}
}

// WithHint sets the hint and returns e, for chaining.
func (e *Error) WithHint(format string, args ...any) *Error {
	e.Hint = fmt.Sprintf(format, args...)
	return e
}

// WithCLI sets advice that names pgfork's command line (see Error.CLI) and
// returns e, for chaining.
func (e *Error) WithCLI(format string, args ...any) *Error {
	e.CLI = fmt.Sprintf(format, args...)
	return e
}

// WithPath sets the path and returns e, for chaining.
func (e *Error) WithPath(p string) *Error {
	e.Path = p
	return e
}

// KindOf returns the kind of err: the first kind other than Internal among
// the *Errors in its chain (an Internal wrapper keeps the kind of what it
// wraps, so wrapping never hides a full disk or a busy object), or Internal.
// A context cancellation that no *Error wraps is Internal here too: callers
// that map errors to outcomes check errors.Is(err, context.Canceled) first
// (cmd/pgfork's exitCode does), or classify with FromOS, which maps it to
// Interrupted.
func KindOf(err error) Kind {
	for err != nil {
		var e *Error
		if !errors.As(err, &e) {
			return Internal
		}
		if e.Kind != Internal {
			return e.Kind
		}
		err = e.Err
	}
	return Internal
}

// Is reports whether err's kind (KindOf) is kind. Callers ask by behaviour
// (errs.Is(err, errs.Busy), or IsBusy) rather than by matching messages,
// SQLSTATEs or sentinel errors.
func Is(err error, kind Kind) bool { return err != nil && KindOf(err) == kind }

// IsBusy reports whether something else holds the object err is about
// (sessions, a lock, a running server): waiting or retrying may help.
func IsBusy(err error) bool { return Is(err, Busy) }

// IsNotFound reports whether err is about something missing.
func IsNotFound(err error) bool { return Is(err, NotFound) }

// IsNoSpace reports whether err is a full filesystem (or quota).
func IsNoSpace(err error) bool { return Is(err, NoSpace) }

// IsExists reports whether err is about a name or destination already taken.
func IsExists(err error) bool { return Is(err, Exists) }

// HintOf returns the first non-empty hint in err's chain.
func HintOf(err error) string { return firstOf(err, func(e *Error) string { return e.Hint }) }

// CLIHintOf returns the first non-empty command-line advice (Error.CLI) in
// err's chain.
func CLIHintOf(err error) string { return firstOf(err, func(e *Error) string { return e.CLI }) }

// firstOf returns the first non-empty field(e) of the *Errors in err's chain.
func firstOf(err error, field func(*Error) string) string {
	for err != nil {
		var e *Error
		if !errors.As(err, &e) {
			return ""
		}
		if v := field(e); v != "" {
			return v
		}
		err = e.Err
	}
	return ""
}
