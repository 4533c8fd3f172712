//go:build !linux

package restore

import (
	"errors"
	"syscall"
)

var errNoSpace error = syscall.ENOSPC

func syncFS(string) error { return errors.New("syncfs is only available on Linux; use --sync fsync") }
