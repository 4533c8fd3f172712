//go:build !linux

package instance

import (
	"os"
	"syscall"
)

// openAs opens path as the current user: outside Linux pgfork does not run
// servers as another user from root (no setfsuid).
func openAs(path string, _, _ int, trunc bool) (*os.File, error) { return openLogFile(path, trunc) }

const logOpenFlags = os.O_CREATE | os.O_WRONLY | os.O_APPEND | syscall.O_NOFOLLOW | syscall.O_NONBLOCK | syscall.O_CLOEXEC
