// Package pgtest starts throw-away PostgreSQL servers for tests: initdb
// without sync and a server with the test profile (instance.Test), run as
// the postgres OS user when the tests run as root, stopped when the test
// ends. It is the one copy of that set-up; test files call it instead of
// writing their own.
//
// It also holds what tests of several packages do with those servers: the
// builds under test (Builds, ForEachBuild, with Build.Tool to run pgbench
// and the like), the filesystems to run on (ForEachFS), one-shot SQL
// (Query, Exec), Stop, and the pgbench balance check
// (CheckPgbenchInvariant).
//
// pgtest is imported by tests only. It fails the test (t.Fatal) on any
// error, and must not be imported by non-test code.
package pgtest

import (
	"context"
	"path/filepath"
	"testing"
	"time"

	"github.com/pgfork/pgfork/instance"
	"github.com/pgfork/pgfork/internal/testenv"
)

// Server says which build to run and how.
type Server struct {
	// BinDir is the PostgreSQL bin directory; empty means the first of
	// testenv.PGBinDirs.
	BinDir string
	// Env is added to the environment of initdb and postgres (a managed
	// build's library path, pgbin.Installation.Env).
	Env []string
	// Settings are passed to postgres as -c options.
	Settings map[string]string
	// LogFile is the server's log; empty means instance's default.
	LogFile string
	// TCP makes the server listen on a free localhost port too.
	TCP bool
	// Checksums, when set, turns data checksums on or off at initdb.
	Checksums *bool
	// Locale is initdb's --locale; empty means instance's default.
	Locale string
	// FreshInitDB makes InitDB run initdb instead of copying the cached
	// output of an earlier one: for a test that needs a system identifier
	// of its own (copies share their original's).
	FreshInitDB bool
}

// User returns the OS user servers run as: nil when the tests do not run
// as root, else the postgres user.
func User(t testing.TB) *instance.OSUser {
	t.Helper()
	u, err := instance.ResolveUser("")
	if err != nil {
		t.Fatal(err)
	}
	return u
}

func (s *Server) binDir(t testing.TB) string {
	if s.BinDir == "" {
		s.BinDir = testenv.PGBinDirs(t)[0]
	}
	return s.BinDir
}

// InitDB makes a fresh data directory at data (no sync: a test's cluster
// does not outlive a crash): a copy of what initdb made for the same
// build and options earlier in this test run (initdbCache), or initdb's
// own output with s.FreshInitDB.
func InitDB(t testing.TB, data string, s Server) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	o := instance.InitOptions{BinDir: s.binDir(t), Env: s.Env, DataDir: data, User: User(t), NoSync: true,
		Checksums: s.Checksums, Locale: s.Locale}
	if s.FreshInitDB {
		if err := instance.InitDB(ctx, o); err != nil {
			t.Fatalf("initdb %s (%s): %v", data, s.BinDir, err)
		}
		return
	}
	if err := initdbCache.copy(ctx, o); err != nil {
		t.Fatalf("initdb %s (%s): %v", data, s.BinDir, err)
	}
}

// StartShared starts a server on data (test profile) and returns it with
// the function that stops it, for servers shared by several tests (stopped
// from TestMain). Most tests want Start.
func StartShared(t testing.TB, data string, s Server) (*instance.Instance, func()) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	inst, err := instance.Start(ctx, instance.Config{BinDir: s.binDir(t), Env: s.Env, DataDir: data, User: User(t),
		Profile: instance.Test, Settings: s.Settings, LogFile: s.LogFile, TCP: s.TCP})
	if err != nil {
		t.Fatalf("start %s (%s): %v", data, s.BinDir, err)
	}
	return inst, func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		_ = inst.Stop(ctx, instance.Fast)
	}
}

// Start starts a server on data (test profile), stopped when the test ends.
func Start(t testing.TB, data string, s Server) *instance.Instance {
	t.Helper()
	inst, stop := StartShared(t, data, s)
	t.Cleanup(stop)
	return inst
}

// New makes a fresh cluster in the test's directory and starts it; it is
// stopped when the test ends.
func New(t testing.TB, s Server) *instance.Instance {
	t.Helper()
	data := filepath.Join(testenv.Dir(t), "data")
	InitDB(t, data, s)
	return Start(t, data, s)
}
