package restore

import (
	"bytes"
	"context"
	"path/filepath"
	"strings"
	"testing"

	"github.com/pgfork/pgfork/clone"
	"github.com/pgfork/pgfork/instance"
	"github.com/pgfork/pgfork/internal/pgtest"
)

// pgEnv is one PostgreSQL build under test (17 or newer: incremental
// backups); the methods below start clusters and take backups with it.
type pgEnv struct{ pgtest.Build }

func (e pgEnv) owner() *clone.Owner {
	if e.User == nil {
		return nil
	}
	return &clone.Owner{UID: e.User.UID, GID: e.User.GID}
}

// minMajor is the oldest major with incremental backups.
const minMajor = 17

// forEachPG runs f once per PostgreSQL build of major 17 or newer.
func forEachPG(t *testing.T, f func(t *testing.T, e pgEnv)) {
	t.Helper()
	pgtest.ForEachBuild(t, minMajor, func(t *testing.T, b pgtest.Build) { f(t, pgEnv{b}) })
}

// forEachPGOnFS runs f once per PostgreSQL build of major 17 or newer, on
// ext4 or XFS so that both filesystems run (pgtest.ForEachBuildOnFS): what
// the major changes is in the chain and its labels, what the filesystem
// changes is the copy method of the writer, and neither depends on the
// other.
func forEachPGOnFS(t *testing.T, f func(t *testing.T, e pgEnv, base string)) {
	t.Helper()
	pgtest.ForEachBuildOnFS(t, minMajor, func(t *testing.T, b pgtest.Build, base string) { f(t, pgEnv{b}, base) })
}

// newestPG is the newest PostgreSQL build under test.
func newestPG(t *testing.T) pgEnv {
	t.Helper()
	bs := pgtest.Builds(t, minMajor)
	return pgEnv{bs[len(bs)-1]}
}

// newCluster runs initdb (checksums on) in base/name and starts it with
// WAL summarization (settings override; "" leaves one to the configuration
// files), stopped when the test ends.
func (e pgEnv) newCluster(t *testing.T, base, name string, settings map[string]string) (string, *instance.Instance) {
	t.Helper()
	data := filepath.Join(base, name)
	on := true
	if err := instance.InitDB(context.Background(), instance.InitOptions{BinDir: e.Bin, Env: e.Inst.Env(), DataDir: data,
		User: e.User, NoSync: true, Checksums: &on, Major: e.Inst.Major}); err != nil {
		t.Fatal(err)
	}
	s := map[string]string{"summarize_wal": "on", "fsync": "off"}
	for k, v := range settings {
		s[k] = v
		if v == "" { // leave it to the configuration files
			delete(s, k)
		}
	}
	in, err := instance.Start(context.Background(), instance.Config{BinDir: e.Bin, Env: e.Inst.Env(), DataDir: data, User: e.User,
		Profile: instance.Durable, Settings: s, LogFile: data + ".server.log"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = in.Stop(context.Background(), instance.Immediate) })
	return data, in
}

// toolAs runs a program as the cluster's OS user (pg_checksums on a data
// directory that user owns).
func (e pgEnv) toolAs(t *testing.T, name string, args ...string) string {
	t.Helper()
	cmd := e.User.Command(context.Background(), e.Inst.Env(), filepath.Join(e.Bin, name), args...)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err != nil {
		t.Fatalf("%s %s: %v\n%s", name, strings.Join(args, " "), err, out.String())
	}
	return out.String()
}

func (e pgEnv) pgbench(t *testing.T, in *instance.Instance, args ...string) {
	t.Helper()
	e.Tool(t, "pgbench", append(args, "-d", in.ConnString("", ""))...)
}

// basebackup takes a plain-format backup into dir, incremental to prev
// when prev is not empty.
func (e pgEnv) basebackup(t *testing.T, in *instance.Instance, dir, prev string, extra ...string) {
	t.Helper()
	args := []string{"-d", in.ConnString("", ""), "-D", dir, "-c", "fast", "--no-sync"}
	if prev != "" {
		args = append(args, "--incremental="+filepath.Join(prev, "backup_manifest"))
	}
	e.Tool(t, "pg_basebackup", append(args, extra...)...)
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
	pgtest.Exec(t, url,
		"CREATE TABLE dropme AS SELECT g FROM generate_series(1, 50000) g",
		"CREATE TABLE truncme AS SELECT g FROM generate_series(1, 50000) g",
		"CREATE TABLE grow(x int)", "INSERT INTO grow SELECT generate_series(1, 1000)")
	c := chain{}
	b := func(i int) string { return filepath.Join(base, "backup"+string(rune('0'+i))) }
	e.basebackup(t, in, b(0), "")
	e.pgbench(t, in, "-n", "-t", "300")
	pgtest.Exec(t, url, "DROP TABLE dropme", "CREATE DATABASE newdb")
	nurl := in.ConnString("", "newdb")
	pgtest.Exec(t, nurl, "CREATE TABLE t(x int)", "INSERT INTO t SELECT generate_series(1, 10000)")
	e.basebackup(t, in, b(1), b(0))
	e.pgbench(t, in, "-n", "-t", "300")
	pgtest.Exec(t, url, "TRUNCATE truncme", "INSERT INTO grow SELECT generate_series(1, 300000)")
	e.basebackup(t, in, b(2), b(1))
	e.pgbench(t, in, "-n", "-t", "300")
	pgtest.Exec(t, url, "INSERT INTO truncme SELECT generate_series(1, 100)", "DELETE FROM grow WHERE x < 500", "VACUUM grow",
		"UPDATE pgbench_accounts SET filler = 'x' WHERE aid <= 20000")
	pgtest.Exec(t, nurl, "INSERT INTO t SELECT generate_series(1, 5000)")
	e.basebackup(t, in, b(3), b(2))
	c.growRows = pgtest.Query(t, url, "SELECT count(*)::text FROM grow")
	c.truncRows = pgtest.Query(t, url, "SELECT count(*)::text FROM truncme")
	c.newdbRows = pgtest.Query(t, nurl, "SELECT count(*)::text FROM t")
	pgtest.Stop(t, in)
	for i := range 4 {
		c.dirs = append(c.dirs, b(i))
	}
	return c
}
