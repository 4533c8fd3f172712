//go:build !linux

package template

import "syscall"

// sparsifyWAL does nothing outside Linux.
func sparsifyWAL(string) error { return nil }

// fsSpace returns the bytes available and the size of path's filesystem.
func fsSpace(path string) (free, total int64, err error) {
	var s syscall.Statfs_t
	if err := syscall.Statfs(path, &s); err != nil {
		return 0, 0, err
	}
	return int64(s.Bavail) * int64(s.Bsize), int64(s.Blocks) * int64(s.Bsize), nil
}
