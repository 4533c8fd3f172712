//go:build !linux

package main

// uniqueBytes counts every file's blocks where FIEMAP is missing (shared
// blocks counted once per file that holds them).
func uniqueBytes(dir string) int64 { return dirBlocks(dir) }
