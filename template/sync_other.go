//go:build !linux

package template

import "syscall"

// syncFS flushes everything (no syncfs outside Linux).
func syncFS(string) error {
	syscall.Sync()
	return nil
}

// sparsifyWAL does nothing outside Linux.
func sparsifyWAL(string) error { return nil }
