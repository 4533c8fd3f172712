//go:build !linux

package dbstore

// prewarmDatabase does nothing here: reading a clone's catalogs ahead is
// measured and done on Linux only (prewarm_linux.go).
func prewarmDatabase(string) {}
