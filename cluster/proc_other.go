//go:build !linux

package cluster

// procStart is unknown outside Linux: pids are trusted as they are.
func procStart(int) uint64 { return 0 }
