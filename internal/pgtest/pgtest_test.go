package pgtest_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/pgfork/pgfork/internal/pgtest"
	"github.com/pgfork/pgfork/internal/testenv"
)

// TestHelpersOnRealServers runs the shared helpers against a server of each
// build under test: SQL in and out (NULL as "<null>"), a build's tools,
// the pgbench invariant after a real tpcb-like run, and Stop really
// stopping the server.
func TestHelpersOnRealServers(t *testing.T) {
	pgtest.ForEachBuild(t, 0, func(t *testing.T, b pgtest.Build) {
		if !strings.HasPrefix(t.Name(), "TestHelpersOnRealServers/pg"+b.Inst.Version) {
			t.Errorf("subtest %s is not named after the build %s", t.Name(), b.Inst.Version)
		}
		in := pgtest.New(t, b.Server())
		url := in.ConnString("", "")
		pgtest.Exec(t, url, "CREATE TABLE t(x int)", "INSERT INTO t SELECT generate_series(1, 10)")
		if got := pgtest.Query(t, url, "SELECT sum(x)::text FROM t"); got != "55" {
			t.Errorf("sum = %s, want 55", got)
		}
		if got := pgtest.Query(t, url, "SELECT NULL::text"); got != "<null>" {
			t.Errorf("NULL came back as %q, want <null>", got)
		}
		if out := b.Tool(t, "pgbench", "--version"); !strings.Contains(out, b.Inst.Version) {
			t.Errorf("pgbench --version of %s says %q", b.Inst.Version, out)
		}
		if out, err := b.TryTool("pgbench", "--no-such-option"); err == nil {
			t.Errorf("pgbench accepted a bad option: %s", out)
		}
		b.Tool(t, "pgbench", "-i", "-s", "1", "-q", "-d", url)
		b.Tool(t, "pgbench", "-n", "-t", "50", "-d", url)
		pgtest.CheckPgbenchInvariant(t, url, "pgbench did not run")
		pgtest.Exec(t, url, "UPDATE pgbench_accounts SET abalance = abalance + 1 WHERE aid = 1")
		r := &recorder{TB: t}
		pgtest.CheckPgbenchInvariant(r, url, "pgbench did not run")
		if len(r.errs) != 1 || !strings.Contains(r.errs[0], "pgbench_accounts") {
			t.Errorf("one account off by one: the check said %q, want one error naming pgbench_accounts", r.errs)
		}
		pgtest.Exec(t, url, "TRUNCATE pgbench_history", "UPDATE pgbench_accounts SET abalance = 0",
			"UPDATE pgbench_tellers SET tbalance = 0", "UPDATE pgbench_branches SET bbalance = 0")
		r = &recorder{TB: t}
		pgtest.CheckPgbenchInvariant(r, url, "pgbench did not run")
		if len(r.errs) != 1 || r.errs[0] != "no pgbench history: pgbench did not run" {
			t.Errorf("empty history: the check said %q, want one error saying so", r.errs)
		}
		pgtest.Stop(t, in)
		if c, err := pgx.Connect(context.Background(), url); err == nil {
			_ = c.Close(context.Background())
			t.Errorf("the server still accepts connections after Stop")
		}
	})
}

// recorder keeps the errors a check reports instead of failing the test.
type recorder struct {
	testing.TB
	errs []string
}

func (r *recorder) Errorf(format string, args ...any) {
	r.errs = append(r.errs, fmt.Sprintf(format, args...))
}

// TestForEachFS checks that both filesystems get a fresh, empty directory.
func TestForEachFS(t *testing.T) {
	var seen []string
	pgtest.ForEachFS(t, func(t *testing.T, base string) {
		seen = append(seen, t.Name())
		if base == "" {
			t.Fatal("empty base directory")
		}
	})
	if len(seen) != 2 || !strings.HasSuffix(seen[0], "/ext4") || !strings.HasSuffix(seen[1], "/xfs") {
		t.Errorf("subtests %v, want ext4 and xfs", seen)
	}
}

// TestForEachBuildOnFS checks that every build runs once and both
// filesystems are covered, each run on a fresh directory of its
// filesystem.
func TestForEachBuildOnFS(t *testing.T) {
	builds := pgtest.Builds(t, 0)
	runs := map[string]int{}
	fss := map[string]bool{}
	pgtest.ForEachBuildOnFS(t, 0, func(t *testing.T, b pgtest.Build, base string) {
		runs[b.Inst.Version]++
		fs := t.Name()[strings.LastIndex(t.Name(), "/")+1:]
		fss[fs] = true
		if onXFS := strings.HasPrefix(base, os.Getenv(testenv.EnvXFS)+"/"); (fs == "xfs") != onXFS {
			t.Errorf("subtest %s runs in %s (on the XFS image: %v)", t.Name(), base, onXFS)
		}
		if ents, err := os.ReadDir(base); err != nil || len(ents) != 0 {
			t.Errorf("base %s: %v, %d entries; want a fresh empty directory", base, err, len(ents))
		}
	})
	for _, b := range builds {
		if want := map[bool]int{true: 2, false: 1}[len(builds) == 1]; runs[b.Inst.Version] != want {
			t.Errorf("build %s ran %d times, want %d", b.Inst.Version, runs[b.Inst.Version], want)
		}
	}
	if !fss["ext4"] || !fss["xfs"] || len(fss) != 2 {
		t.Errorf("filesystems run: %v, want ext4 and xfs", fss)
	}
}

// TestInitDBCopiesCachedOutput: InitDB runs initdb once per build and
// options and copies its output after; the copies are clusters of their
// own with the options asked for (checksums here), and FreshInitDB runs
// initdb (a system identifier of its own).
func TestInitDBCopiesCachedOutput(t *testing.T) {
	b := pgtest.Builds(t, 0)[0]
	dir := testenv.XFSDir(t)
	on, off := true, false
	sysid := func(url string) string {
		return pgtest.Query(t, url, "SELECT system_identifier::text FROM pg_control_system()")
	}
	var ids []string
	for i, c := range []struct {
		sums  *bool
		fresh bool
		want  string
	}{{&on, false, "on"}, {&on, false, "on"}, {&off, false, "off"}, {&on, true, "on"}} {
		s := b.Server()
		s.Checksums, s.FreshInitDB = c.sums, c.fresh
		data := filepath.Join(dir, fmt.Sprint("d", i))
		pgtest.InitDB(t, data, s)
		in := pgtest.Start(t, data, s)
		url := in.ConnString("", "")
		if got := pgtest.Query(t, url, "SHOW data_checksums"); got != c.want {
			t.Errorf("cluster %d: data_checksums %s, want %s", i, got, c.want)
		}
		pgtest.Exec(t, url, fmt.Sprintf("CREATE TABLE only_in_%d ()", i))
		if got := pgtest.Query(t, url, "SELECT count(*)::text FROM pg_class WHERE relname LIKE 'only_in_%'"); got != "1" {
			t.Errorf("cluster %d sees %s tables made in the clusters copied before it, want its own alone", i, got)
		}
		ids = append(ids, sysid(url))
		pgtest.Stop(t, in)
	}
	if ids[0] != ids[1] {
		t.Errorf("system identifiers %v: the second cluster was not a copy of the first's initdb", ids)
	}
	if ids[3] == ids[0] || ids[2] == ids[0] {
		t.Errorf("system identifiers %v: a fresh initdb, or other options, got a copy", ids)
	}
}
