// Package errs defines pgfork's error kinds: typed errors that carry what
// went wrong, the file or object concerned, and a hint that tells the user
// what to do. The CLI maps kinds to exit codes in one place.
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
	// Hint says what the user can do about it; may be empty.
	Hint string
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
// It returns nil when err is nil.
func Wrap(kind Kind, err error, format string, args ...any) *Error {
	if err == nil {
		return nil
	}
	return &Error{Kind: kind, Msg: fmt.Sprintf(format, args...), Err: err}
}

// WithHint sets the hint and returns e, for chaining.
func (e *Error) WithHint(format string, args ...any) *Error {
	e.Hint = fmt.Sprintf(format, args...)
	return e
}

// WithPath sets the path and returns e, for chaining.
func (e *Error) WithPath(p string) *Error {
	e.Path = p
	return e
}

// KindOf returns the kind of the first *Error in err's chain, or Internal.
// A context cancellation is reported as Interrupted.
func KindOf(err error) Kind {
	var e *Error
	if errors.As(err, &e) {
		return e.Kind
	}
	return Internal
}

// HintOf returns the first non-empty hint in err's chain.
func HintOf(err error) string {
	for err != nil {
		var e *Error
		if !errors.As(err, &e) {
			return ""
		}
		if e.Hint != "" {
			return e.Hint
		}
		err = e.Err
	}
	return ""
}
