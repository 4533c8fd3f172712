package restore

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgfork/pgfork/clone"
	"github.com/pgfork/pgfork/instance"
	"github.com/pgfork/pgfork/internal/testenv"
	"github.com/pgfork/pgfork/pgbin"
)

// pgEnv is one PostgreSQL build under test (17 or newer: incremental
// backups).
type pgEnv struct {
	bin  string
	inst pgbin.Installation
	user *instance.OSUser
}

func (e pgEnv) name() string { return "pg" + e.inst.Version }

func (e pgEnv) owner() *clone.Owner {
	if e.user == nil {
		return nil
	}
	return &clone.Owner{UID: e.user.UID, GID: e.user.GID}
}

// pgEnvs lists the PostgreSQL builds of major 17 or newer under test
// (incremental backups), oldest first.
func pgEnvs(t *testing.T) []pgEnv {
	t.Helper()
	u, err := instance.ResolveUser("")
	if err != nil {
		t.Fatal(err)
	}
	var envs []pgEnv
	for _, bin := range testenv.PGBinDirs(t) {
		in, err := pgbin.Find(pgbin.Options{Explicit: bin, StateDir: t.TempDir()}, 0)
		if err != nil {
			t.Fatalf("PostgreSQL build %s: %v", bin, err)
		}
		if in.Major >= 17 {
			envs = append(envs, pgEnv{bin: bin, inst: in, user: u})
		}
	}
	if len(envs) == 0 {
		if testenv.Require() {
			t.Fatal("no PostgreSQL 17 or newer in the test environment (incremental backups need it)")
		}
		t.Skip("no PostgreSQL 17 or newer")
	}
	return envs
}

// forEachPG runs f once per PostgreSQL build of major 17 or newer.
func forEachPG(t *testing.T, f func(t *testing.T, e pgEnv)) {
	t.Helper()
	for _, e := range pgEnvs(t) {
		t.Run(e.name(), func(t *testing.T) { f(t, e) })
	}
}

// newestPG is the newest PostgreSQL build under test.
func newestPG(t *testing.T) pgEnv {
	t.Helper()
	envs := pgEnvs(t)
	return envs[len(envs)-1]
}

// forEachFS runs f on ext4 (the temp dir) and on the XFS reflink image.
func forEachFS(t *testing.T, f func(t *testing.T, base string)) {
	t.Helper()
	t.Run("ext4", func(t *testing.T) { f(t, testenv.Dir(t)) })
	t.Run("xfs", func(t *testing.T) { f(t, testenv.XFSDir(t)) })
}

// newCluster runs initdb (checksums on) in base/name and starts it with
// WAL summarization (settings override; "" leaves one to the configuration
// files), stopped when the test ends.
func (e pgEnv) newCluster(t *testing.T, base, name string, settings map[string]string) (string, *instance.Instance) {
	t.Helper()
	data := filepath.Join(base, name)
	on := true
	if err := instance.InitDB(context.Background(), instance.InitOptions{BinDir: e.bin, Env: e.inst.Env(), DataDir: data,
		User: e.user, NoSync: true, Checksums: &on, Major: e.inst.Major}); err != nil {
		t.Fatal(err)
	}
	s := map[string]string{"summarize_wal": "on", "fsync": "off"}
	for k, v := range settings {
		s[k] = v
		if v == "" { // leave it to the configuration files
			delete(s, k)
		}
	}
	in, err := instance.Start(context.Background(), instance.Config{BinDir: e.bin, Env: e.inst.Env(), DataDir: data, User: e.user,
		Profile: instance.Durable, Settings: s, LogFile: data + ".server.log"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = in.Stop(context.Background(), instance.Immediate) })
	return data, in
}

func stop(t *testing.T, in *instance.Instance) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 120*time.Second)
	defer cancel()
	if err := in.Stop(ctx, instance.Fast); err != nil {
		t.Fatal(err)
	}
}

// query runs one query and returns its first column as text.
func query(t *testing.T, url, sql string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 120*time.Second)
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

func execSQL(t *testing.T, url string, sqls ...string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 120*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatalf("connect %s: %v", url, err)
	}
	defer conn.Close(ctx)
	for _, s := range sqls {
		if _, err := conn.Exec(ctx, s); err != nil {
			t.Fatalf("%s: %v", s, err)
		}
	}
}

// tool runs one of the build's client programs as the current user.
func (e pgEnv) tool(t *testing.T, name string, args ...string) string {
	t.Helper()
	out, err := e.try(name, args...)
	if err != nil {
		t.Fatalf("%s %s: %v\n%s", name, strings.Join(args, " "), err, out)
	}
	return out
}

func (e pgEnv) try(name string, args ...string) (string, error) {
	cmd := exec.Command(filepath.Join(e.bin, name), args...)
	cmd.Env = append(os.Environ(), e.inst.Env()...)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	err := cmd.Run()
	return out.String(), err
}

// toolAs runs a program as the cluster's OS user (pg_checksums on a data
// directory that user owns).
func (e pgEnv) toolAs(t *testing.T, name string, args ...string) string {
	t.Helper()
	cmd := e.user.Command(context.Background(), e.inst.Env(), filepath.Join(e.bin, name), args...)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err != nil {
		t.Fatalf("%s %s: %v\n%s", name, strings.Join(args, " "), err, out.String())
	}
	return out.String()
}

func (e pgEnv) pgbench(t *testing.T, in *instance.Instance, args ...string) {
	t.Helper()
	e.tool(t, "pgbench", append(args, "-d", in.ConnString("", ""))...)
}

// basebackup takes a plain-format backup into dir, incremental to prev
// when prev is not empty.
func (e pgEnv) basebackup(t *testing.T, in *instance.Instance, dir, prev string, extra ...string) {
	t.Helper()
	args := []string{"-d", in.ConnString("", ""), "-D", dir, "-c", "fast", "--no-sync"}
	if prev != "" {
		args = append(args, "--incremental="+filepath.Join(prev, "backup_manifest"))
	}
	e.tool(t, "pg_basebackup", append(args, extra...)...)
}

// checkPgbenchInvariant checks that every balance sum equals the sum of the
// history's deltas.
func checkPgbenchInvariant(t *testing.T, url string) {
	t.Helper()
	h := query(t, url, "SELECT coalesce(sum(delta), 0)::text FROM pgbench_history")
	n := query(t, url, "SELECT count(*)::text FROM pgbench_history")
	for _, tbl := range []string{"accounts:abalance", "tellers:tbalance", "branches:bbalance"} {
		name, col, _ := strings.Cut(tbl, ":")
		got := query(t, url, "SELECT coalesce(sum("+col+"), 0)::text FROM pgbench_"+name)
		if got != h {
			t.Errorf("pgbench invariant broken: sum(%s) of pgbench_%s = %s, sum(delta) of pgbench_history = %s (%s rows)", col, name, got, h, n)
		}
	}
	if n == "0" {
		t.Errorf("no pgbench history: the chain did not capture the pgbench runs")
	}
}

// leftovers lists the hidden staging entries beside dst.
func leftovers(dst string) []string {
	m, _ := filepath.Glob(filepath.Join(filepath.Dir(dst), "."+filepath.Base(dst)+"*"))
	return m
}

// chain is a backup chain made by makeChain.
type chain struct {
	dirs []string // full, then incrementals
	// expected contents after the newest backup
	growRows, truncRows, newdbRows string
}

// makeChain builds a full backup and three incrementals of a pgbench
// cluster with pgbench runs between them, a table dropped, a table
// truncated, a relation extended and a database created after the full
// backup.
func (e pgEnv) makeChain(t *testing.T, base string) chain {
	t.Helper()
	_, in := e.newCluster(t, base, "src", nil)
	url := in.ConnString("", "")
	e.pgbench(t, in, "-i", "-s", "2", "-q")
	execSQL(t, url,
		"CREATE TABLE dropme AS SELECT g FROM generate_series(1, 50000) g",
		"CREATE TABLE truncme AS SELECT g FROM generate_series(1, 50000) g",
		"CREATE TABLE grow(x int)", "INSERT INTO grow SELECT generate_series(1, 1000)")
	c := chain{}
	b := func(i int) string { return filepath.Join(base, "backup"+string(rune('0'+i))) }
	e.basebackup(t, in, b(0), "")
	e.pgbench(t, in, "-n", "-t", "300")
	execSQL(t, url, "DROP TABLE dropme", "CREATE DATABASE newdb")
	nurl := in.ConnString("", "newdb")
	execSQL(t, nurl, "CREATE TABLE t(x int)", "INSERT INTO t SELECT generate_series(1, 10000)")
	e.basebackup(t, in, b(1), b(0))
	e.pgbench(t, in, "-n", "-t", "300")
	execSQL(t, url, "TRUNCATE truncme", "INSERT INTO grow SELECT generate_series(1, 300000)")
	e.basebackup(t, in, b(2), b(1))
	e.pgbench(t, in, "-n", "-t", "300")
	execSQL(t, url, "INSERT INTO truncme SELECT generate_series(1, 100)", "DELETE FROM grow WHERE x < 500", "VACUUM grow",
		"UPDATE pgbench_accounts SET filler = 'x' WHERE aid <= 20000")
	execSQL(t, nurl, "INSERT INTO t SELECT generate_series(1, 5000)")
	e.basebackup(t, in, b(3), b(2))
	c.growRows = query(t, url, "SELECT count(*)::text FROM grow")
	c.truncRows = query(t, url, "SELECT count(*)::text FROM truncme")
	c.newdbRows = query(t, nurl, "SELECT count(*)::text FROM t")
	stop(t, in)
	for i := range 4 {
		c.dirs = append(c.dirs, b(i))
	}
	return c
}
