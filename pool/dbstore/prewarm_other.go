//go:build !linux

package dbstore

// prewarmCatalogs does nothing here: reading a clone's catalogs ahead is
// measured and done on Linux only (prewarm_linux.go).
func prewarmCatalogs(string) {}
