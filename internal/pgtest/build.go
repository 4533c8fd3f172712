package pgtest

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/pgfork/pgfork/instance"
	"github.com/pgfork/pgfork/internal/testenv"
	"github.com/pgfork/pgfork/pgbin"
)

// Build is one PostgreSQL build under test (a directory of
// testenv.PGBinDirs) and the OS user its servers run as. Packages embed it
// in their own type to hang their set-up methods on.
type Build struct {
	// Bin is the build's bin directory.
	Bin string
	// Inst is the build as pgbin found it (version, major, Env).
	Inst pgbin.Installation
	// User is what User returns: nil unless the tests run as root.
	User *instance.OSUser
}

// Name is the subtest name for the build: "pg" and its version.
func (b Build) Name() string { return "pg" + b.Inst.Version }

// Builds returns the builds under test of major minMajor or newer (0: all),
// oldest first as testenv.PGBinDirs lists them. When none is that new the
// test is skipped, or fails under PGFORK_TEST_REQUIRE=1.
func Builds(t testing.TB, minMajor int) []Build {
	t.Helper()
	u := User(t)
	var out []Build
	for _, bin := range testenv.PGBinDirs(t) {
		in, err := pgbin.Find(pgbin.Options{Explicit: bin, StateDir: t.TempDir()}, 0)
		if err != nil {
			t.Fatalf("PostgreSQL build %s: %v", bin, err)
		}
		if in.Major >= minMajor {
			out = append(out, Build{Bin: bin, Inst: in, User: u})
		}
	}
	if len(out) == 0 {
		if testenv.Require() {
			t.Fatalf("no PostgreSQL %d or newer in the test environment", minMajor)
		}
		t.Skipf("no PostgreSQL %d or newer in the test environment", minMajor)
	}
	return out
}

// ForEachBuild runs f in a subtest (named by Build.Name) for each build of
// Builds(t, minMajor).
func ForEachBuild(t *testing.T, minMajor int, f func(t *testing.T, b Build)) {
	t.Helper()
	for _, b := range Builds(t, minMajor) {
		t.Run(b.Name(), func(t *testing.T) { f(t, b) })
	}
}

// ForEachFS runs f in two subtests, "ext4" and "xfs", each with a fresh
// base directory: one in the temp dir (ext4 on the test machines), one on
// the XFS reflink image (testenv.XFSDir).
func ForEachFS(t *testing.T, f func(t *testing.T, base string)) {
	t.Helper()
	t.Run("ext4", func(t *testing.T) { f(t, testenv.Dir(t)) })
	t.Run("xfs", func(t *testing.T) { f(t, testenv.XFSDir(t)) })
}

// ForEachBuildOnFS runs f once per build of Builds(t, minMajor), each in a
// subtest named by Build.Name with one named by the filesystem inside
// ("ext4" or "xfs", as ForEachFS names them): the first build on ext4, the
// next on XFS, alternating, so that every build and both filesystems run
// with the fewest runs (a single build runs on both). It is for tests
// whose major-dependent code does not depend on the filesystem and whose
// filesystem-dependent code (the copy method) does not depend on the
// major: ForEachBuild around ForEachFS ran each of those twice.
func ForEachBuildOnFS(t *testing.T, minMajor int, f func(t *testing.T, b Build, base string)) {
	t.Helper()
	builds := Builds(t, minMajor)
	for i, b := range builds {
		t.Run(b.Name(), func(t *testing.T) {
			if len(builds) == 1 || i%2 == 0 {
				t.Run("ext4", func(t *testing.T) { f(t, b, testenv.Dir(t)) })
			}
			if len(builds) == 1 || i%2 == 1 {
				t.Run("xfs", func(t *testing.T) { f(t, b, testenv.XFSDir(t)) })
			}
		})
	}
}

// Server is the Server that runs this build (Bin and Env set).
func (b Build) Server() Server { return Server{BinDir: b.Bin, Env: b.Inst.Env()} }

// Tool runs one of the build's programs (pgbench, pg_basebackup, ...) as the
// current OS user and returns its combined output; it fails the test if the
// program fails.
func (b Build) Tool(t testing.TB, name string, args ...string) string {
	t.Helper()
	out, err := b.TryTool(name, args...)
	if err != nil {
		t.Fatalf("%s %s: %v\n%s", name, strings.Join(args, " "), err, out)
	}
	return out
}

// TryTool is Tool for a program that may fail: it returns the combined
// output and the error.
func (b Build) TryTool(name string, args ...string) (string, error) {
	cmd := exec.Command(filepath.Join(b.Bin, name), args...)
	cmd.Env = append(os.Environ(), b.Inst.Env()...)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	err := cmd.Run()
	return out.String(), err
}
