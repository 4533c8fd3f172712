package pgclone_test

import (
	"bytes"
	"context"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgfork/pgfork/instance"
	"github.com/pgfork/pgfork/internal/pgtest"
	"github.com/pgfork/pgfork/internal/testenv"
	"github.com/pgfork/pgfork/pgbin"
)

// pgEnv is one PostgreSQL build under test.
type pgEnv struct {
	bin  string
	inst pgbin.Installation
	user *instance.OSUser
}

func (e pgEnv) name() string { return "pg" + e.inst.Version }

// forEachPG runs f once per PostgreSQL build under test.
func forEachPG(t *testing.T, f func(t *testing.T, e pgEnv)) {
	t.Helper()
	u := pgtest.User(t)
	for _, bin := range testenv.PGBinDirs(t) {
		in, err := pgbin.Find(pgbin.Options{Explicit: bin, StateDir: t.TempDir()}, 0)
		if err != nil {
			t.Fatalf("PostgreSQL build %s: %v", bin, err)
		}
		e := pgEnv{bin: bin, inst: in, user: u}
		t.Run(e.name(), func(t *testing.T) { f(t, e) })
	}
}

// forEachFS runs f with a fresh base directory on ext4 (the temp dir) and
// on the XFS reflink image.
func forEachFS(t *testing.T, f func(t *testing.T, base string)) {
	t.Helper()
	t.Run("ext4", func(t *testing.T) { f(t, testenv.Dir(t)) })
	t.Run("xfs", func(t *testing.T) { f(t, testenv.XFSDir(t)) })
}

// newCluster runs initdb in base/name.
func (e pgEnv) newCluster(t *testing.T, base, name string) string {
	t.Helper()
	data := filepath.Join(base, name)
	pgtest.InitDB(t, data, pgtest.Server{BinDir: e.bin, Env: e.inst.Env()})
	return data
}

// start starts a server on data and stops it (fast) when the test ends.
func (e pgEnv) start(t *testing.T, data string, settings map[string]string) *instance.Instance {
	t.Helper()
	return pgtest.Start(t, data, pgtest.Server{BinDir: e.bin, Env: e.inst.Env(), Settings: settings, LogFile: data + ".server.log"})
}

func stop(t *testing.T, in *instance.Instance) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	if err := in.Stop(ctx, instance.Fast); err != nil {
		t.Fatal(err)
	}
}

// query runs one query and returns its first column as text.
func query(t *testing.T, url, sql string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatalf("connect %s: %v", url, err)
	}
	defer conn.Close(ctx)
	var s *string
	if err := conn.QueryRow(ctx, sql).Scan(&s); err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
	if s == nil {
		return "<null>"
	}
	return *s
}

func exec1(t *testing.T, url, sql string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatalf("connect %s: %v", url, err)
	}
	defer conn.Close(ctx)
	if _, err := conn.Exec(ctx, sql); err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
}

// tool runs one of the build's client programs and returns its output.
func (e pgEnv) tool(t *testing.T, name string, args ...string) string {
	t.Helper()
	cmd := exec.Command(filepath.Join(e.bin, name), args...)
	cmd.Env = append(os.Environ(), e.inst.Env()...)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err != nil {
		t.Fatalf("%s %s: %v\n%s", name, strings.Join(args, " "), err, out.String())
	}
	return out.String()
}

// checkPgbenchInvariant checks that every balance sum equals the sum of the
// history's deltas: true of any consistent state of a tpcb-like run.
func checkPgbenchInvariant(t *testing.T, url string) {
	t.Helper()
	h := query(t, url, "SELECT coalesce(sum(delta), 0)::text FROM pgbench_history")
	n := query(t, url, "SELECT count(*)::text FROM pgbench_history")
	for _, tbl := range []string{"accounts:abalance", "tellers:tbalance", "branches:bbalance"} {
		name, col, _ := strings.Cut(tbl, ":")
		got := query(t, url, "SELECT coalesce(sum("+col+"), 0)::text FROM pgbench_"+name)
		if got != h {
			t.Errorf("pgbench invariant broken in the clone: sum(%s) from pgbench_%s = %s, sum(delta) from pgbench_history = %s (%s history rows)", col, name, got, h, n)
		}
	}
	if n == "0" {
		t.Errorf("the clone has no pgbench history: the copy was not taken under load")
	}
	t.Logf("pgbench invariant holds: %s history rows, sum(delta) = %s", n, h)
}

// leftovers lists the hidden staging entries beside dst.
func leftovers(t *testing.T, dst string) []string {
	t.Helper()
	m, _ := filepath.Glob(filepath.Join(filepath.Dir(dst), "."+filepath.Base(dst)+"*"))
	return m
}

// ownedBy checks that everything under dir belongs to u (when root).
func ownedBy(t *testing.T, dir string, u *instance.OSUser) {
	t.Helper()
	if u == nil {
		return
	}
	var bad []string
	_ = filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return nil
		}
		fi, err := os.Lstat(p)
		if err != nil {
			return nil
		}
		if st := fi.Sys().(*syscall.Stat_t); int(st.Uid) != u.UID || int(st.Gid) != u.GID {
			bad = append(bad, p)
		}
		return nil
	})
	if len(bad) > 0 {
		t.Errorf("%d entries of %s are not owned by %s, e.g. %s", len(bad), dir, u.Name, bad[0])
	}
}
