// Package testenv gives tests the real filesystems and PostgreSQL builds that
// .ci/run (scripts/test-env.sh) prepares: an XFS image with reflink, a tmpfs, a
// small filesystem for ENOSPC, and the PostgreSQL majors to test against.
//
// A test that needs something missing skips with a message saying how to get
// it, unless PGFORK_TEST_REQUIRE=1 (set by CI), in which case it fails: CI
// must really run the XFS and multi-major tests.
//
// A test waits for an event with WaitFor: a deadline of its own that no load
// on a shared machine reaches, so that its verdict is the event's.
//
// testenv is for tests only and imports nothing of pgfork's; starting a
// PostgreSQL server for a test is internal/pgtest's.
package testenv

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// Environment variables set by scripts/test-env.sh.
const (
	EnvXFS     = "PGFORK_TEST_XFS"     // a directory on XFS mounted with reflink=1
	EnvTmpfs   = "PGFORK_TEST_TMPFS"   // a directory on tmpfs
	EnvSmallFS = "PGFORK_TEST_SMALLFS" // a directory on a small (~64 MiB) filesystem, for ENOSPC
	EnvPGBins  = "PGFORK_TEST_PG_BINS" // colon-separated PostgreSQL bin directories to test against
	EnvRequire = "PGFORK_TEST_REQUIRE" // "1": missing environment fails instead of skipping
	EnvRunDir  = "PGFORK_TEST_RUN_DIR" // where the run writes, on the machine's own disk (ext4 here)
)

const setupHint = "as root, run `make test-env` (scripts/test-env.sh) to create it, or `make check` to set up and test in one go"

// Require reports whether missing test environment must fail the test.
func Require() bool { return os.Getenv(EnvRequire) == "1" }

func missing(t testing.TB, what string) {
	t.Helper()
	if Require() {
		t.Fatalf("%s is not available but %s=1: %s", what, EnvRequire, setupHint)
	}
	t.Skipf("skipping: %s is not available; %s", what, setupHint)
}

// Dir returns a fresh, empty directory for the test, mode 0755 (and its
// parents traversable) so an unprivileged PostgreSQL user can use it when
// tests run as root. It is removed when the test ends.
func Dir(t testing.TB) string {
	t.Helper()
	return subdir(t, t.TempDir())
}

func subdir(t testing.TB, base string) string {
	t.Helper()
	d, err := os.MkdirTemp(base, "pgfork-test-")
	if err != nil {
		t.Fatal(err)
	}
	for p := d; p != "/" && p != "." && strings.HasPrefix(p, base); p = filepath.Dir(p) {
		_ = os.Chmod(p, 0o755)
	}
	_ = os.Chmod(base, 0o755)
	if parent := filepath.Dir(base); strings.Contains(parent, os.TempDir()) && parent != os.TempDir() {
		_ = os.Chmod(parent, 0o755)
	}
	t.Cleanup(func() { _ = os.RemoveAll(d) })
	return d
}

func fromEnv(t testing.TB, env, what string) string {
	t.Helper()
	base := os.Getenv(env)
	if base == "" {
		missing(t, what+" ($"+env+")")
		return ""
	}
	if fi, err := os.Stat(base); err != nil || !fi.IsDir() {
		missing(t, what+" ($"+env+"="+base+")")
		return ""
	}
	return subdir(t, base)
}

// XFSDir returns a fresh directory on a reflink-capable XFS filesystem.
func XFSDir(t testing.TB) string {
	t.Helper()
	return fromEnv(t, EnvXFS, "an XFS filesystem with reflink")
}

// RunDir returns a fresh directory under the test run directory, on the
// machine's own disk: for tests that make loop images of their own.
func RunDir(t testing.TB) string {
	t.Helper()
	return fromEnv(t, EnvRunDir, "the test run directory")
}

// TmpfsDir returns a fresh directory on tmpfs.
func TmpfsDir(t testing.TB) string { t.Helper(); return fromEnv(t, EnvTmpfs, "a tmpfs filesystem") }

// SmallFSDir returns a fresh directory on a small filesystem (for ENOSPC).
func SmallFSDir(t testing.TB) string {
	t.Helper()
	return fromEnv(t, EnvSmallFS, "a small filesystem for out-of-space tests")
}

// PGBinDirs returns the PostgreSQL bin directories to test against: those in
// $PGFORK_TEST_PG_BINS, else every /usr/lib/postgresql/*/bin found.
func PGBinDirs(t testing.TB) []string {
	t.Helper()
	var dirs []string
	if v := os.Getenv(EnvPGBins); v != "" {
		for _, d := range strings.Split(v, ":") {
			if d != "" {
				dirs = append(dirs, d)
			}
		}
	} else {
		dirs, _ = filepath.Glob("/usr/lib/postgresql/*/bin")
	}
	if len(dirs) == 0 {
		missing(t, "a PostgreSQL installation")
	}
	return dirs
}

// RequireMajors fails (or skips) unless at least n PostgreSQL majors are given.
func RequireMajors(t testing.TB, n int) []string {
	t.Helper()
	dirs := PGBinDirs(t)
	if len(dirs) < n {
		missing(t, "a second PostgreSQL major (`pgfork pg install 18`)")
	}
	return dirs
}
