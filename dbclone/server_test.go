package dbclone

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/pgfork/pgfork/instance"
	"github.com/pgfork/pgfork/internal/pgtest"
	"github.com/pgfork/pgfork/internal/testenv"
)

// server is a real PostgreSQL server shared by the package's tests.
type server struct {
	name     string // "pg15-ext4", "pg18-xfs"
	major    int
	canClone bool
	inst     *instance.Instance
}

var (
	serversMu sync.Mutex
	started   = map[string]*server{}
	cleanups  []func()
)

func TestMain(m *testing.M) {
	code := m.Run()
	serversMu.Lock()
	for i := len(cleanups) - 1; i >= 0; i-- {
		cleanups[i]()
	}
	serversMu.Unlock()
	os.Exit(code)
}

func majorOf(t testing.TB, bin string) int {
	t.Helper()
	// `postgres --version`: "postgres (PostgreSQL) 18.6"
	cmd := (*instance.OSUser)(nil).Command(context.Background(), nil, filepath.Join(bin, "postgres"), "--version")
	b, err := cmd.Output()
	if err != nil {
		t.Fatalf("%s/postgres --version: %v", bin, err)
	}
	f := strings.Fields(string(b))
	var major int
	fmt.Sscanf(f[len(f)-1], "%d", &major)
	return major
}

// startServer starts (once per package run) a server from bin with its data
// directory in a directory under base.
func startServer(t testing.TB, name, bin, base string, canClone bool, settings map[string]string) *server {
	t.Helper()
	serversMu.Lock()
	defer serversMu.Unlock()
	if s, ok := started[name]; ok {
		return s
	}
	dir, err := os.MkdirTemp(base, "dbclone-test-")
	if err != nil {
		t.Fatal(err)
	}
	_ = os.Chmod(dir, 0o755)
	cleanups = append(cleanups, func() { _ = os.RemoveAll(dir) })
	data := filepath.Join(dir, "data")
	pgtest.InitDB(t, data, pgtest.Server{BinDir: bin})
	// PGFORK_DBCLONE_TEST_SETTINGS="shared_buffers=2GB,fsync=on" overrides
	// settings (used to measure the built-in calibration constants).
	if v := os.Getenv("PGFORK_DBCLONE_TEST_SETTINGS"); v != "" {
		settings = map[string]string{}
		for _, kv := range strings.Split(v, ",") {
			if k, val, ok := strings.Cut(kv, "="); ok {
				settings[k] = val
			}
		}
	}
	inst, stop := pgtest.StartShared(t, data, pgtest.Server{BinDir: bin, Settings: settings})
	cleanups = append(cleanups, stop)
	s := &server{name: name, major: majorOf(t, bin), canClone: canClone, inst: inst}
	started[name] = s
	return s
}

// servers returns every server to test against: each PostgreSQL major on
// ext4, and 18+ also on XFS with reflink (where clone runs for real).
func servers(t *testing.T) []*server {
	t.Helper()
	var out []*server
	for _, bin := range testenv.PGBinDirs(t) {
		major := majorOf(t, bin)
		out = append(out, startServer(t, fmt.Sprintf("pg%d-ext4", major), bin, os.TempDir(), false, nil))
		if major >= 18 {
			xfs := os.Getenv(testenv.EnvXFS)
			if xfs == "" {
				testenv.XFSDir(t) // skips, or fails under PGFORK_TEST_REQUIRE=1
			}
			out = append(out, startServer(t, fmt.Sprintf("pg%d-xfs", major), bin, xfs, true, nil))
		}
	}
	return out
}

// connect opens a connection to database db (default postgres) as role user
// (default postgres), closed when the test ends.
func (s *server) connect(t testing.TB, user, db string) *pgx.Conn {
	t.Helper()
	c, err := pgx.Connect(context.Background(), s.inst.ConnString(user, db))
	if err != nil {
		t.Fatalf("%s: connect to %q as %q: %v", s.name, db, user, err)
	}
	t.Cleanup(func() { _ = c.Close(context.Background()) })
	return c
}

func (s *server) exec(t testing.TB, conn *pgx.Conn, sql string, args ...any) {
	t.Helper()
	if _, err := conn.Exec(context.Background(), sql, args...); err != nil {
		t.Fatalf("%s: %s: %v", s.name, sql, err)
	}
}

// each runs f as a subtest on every server.
func each(t *testing.T, f func(t *testing.T, s *server)) {
	for _, s := range servers(t) {
		t.Run(s.name, func(t *testing.T) { f(t, s) })
	}
}
