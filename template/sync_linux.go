package template

import (
	"fmt"
	"os"

	"golang.org/x/sys/unix"
)

// syncFS flushes the whole filesystem holding dir (one syncfs call: cheaper
// than an fsync per file of a fresh cluster).
func syncFS(dir string) error {
	f, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer f.Close()
	if err := unix.Syncfs(int(f.Fd())); err != nil {
		return fmt.Errorf("syncfs: %w", err)
	}
	return nil
}
