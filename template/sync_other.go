//go:build !linux

package template

import "syscall"

// syncFS flushes everything (no syncfs outside Linux).
func syncFS(string) error {
	syscall.Sync()
	return nil
}
