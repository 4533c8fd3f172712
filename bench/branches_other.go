//go:build !linux

package main

// uniqueBytes counts every file's blocks where FIEMAP is missing (shared
// blocks counted once per file that holds them).
func uniqueBytes(dirs ...string) int64 {
	var n int64
	for _, d := range dirs {
		n += dirBlocks(d)
	}
	return n
}
