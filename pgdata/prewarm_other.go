//go:build !linux

package pgdata

// PrewarmDatabase does nothing here: reading a copy's files ahead is
// measured and done on Linux only (prewarm_linux.go).
func PrewarmDatabase(string, uint32) {}
