//go:build !linux

package fsutil

import (
	"os"
	"syscall"
)

// SyncFS flushes every filesystem: there is no syncfs(2) outside Linux.
func SyncFS(dir string) error {
	if _, err := os.Stat(dir); err != nil {
		return err
	}
	syscall.Sync()
	return nil
}
