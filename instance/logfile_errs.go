package instance

import (
	"errors"
	"syscall"
)

// isSymlinkLoop reports the error open(2) gives for O_NOFOLLOW on a symlink.
func isSymlinkLoop(err error) bool { return errors.Is(err, syscall.ELOOP) }
