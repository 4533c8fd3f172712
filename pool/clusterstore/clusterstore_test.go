package clusterstore_test

import (
	"context"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/pgfork/pgfork/internal/pgtest"
	"github.com/pgfork/pgfork/internal/statedir"
	"github.com/pgfork/pgfork/internal/testenv"
	"github.com/pgfork/pgfork/pgbin"
	"github.com/pgfork/pgfork/pool"
	"github.com/pgfork/pgfork/pool/clusterstore"
	"github.com/pgfork/pgfork/pool/storetest"
)

// TestConformance runs cluster isolation's store through the suite every
// pool.Store passes, with real clusters on the XFS reflink image: a
// template cluster per template, a copy started per test.
func TestConformance(t *testing.T) {
	dir := testenv.Dir(t)
	pg, err := pgbin.Find(pgbin.Options{Explicit: testenv.PGBinDirs(t)[0]}, 0)
	if err != nil {
		t.Fatal(err)
	}
	u := pgtest.User(t)
	storeDir := filepath.Join(dir, "serve-clusters")
	var conn pool.ConnInfo
	storetest.Run(t, storetest.Suite{
		Open: func(t *testing.T) pool.Store {
			st, err := clusterstore.New(clusterstore.Options{Dir: storeDir,
				Layout: statedir.Layout{Root: filepath.Join(dir, "state")}, PG: pg, User: u})
			if err != nil {
				t.Fatal(err)
			}
			conn = st.Conn()
			return st
		},
		Connect: func(t *testing.T, ep pool.Endpoint) (*pgx.Conn, error) {
			q := url.Values{"host": {ep.Host}, "port": {strconv.Itoa(ep.Port)}, "user": {conn.Username},
				"password": {conn.Password}, "dbname": {ep.Database}}
			return pgx.Connect(context.Background(), "postgres:///?"+q.Encode())
		},
		CopyExists: func(t *testing.T, name string) bool {
			for _, d := range []string{"tests", "templates"} {
				if _, err := os.Stat(filepath.Join(storeDir, d, name)); err == nil {
					return true
				}
			}
			return false
		},
	})
}

// TestDamagedStateRefused: a state.json that is not valid JSON is refused
// with its path named (it used to be read as empty, forgetting every
// template, and then overwritten), and it is left as it was.
func TestDamagedStateRefused(t *testing.T) {
	dir := testenv.Dir(t)
	pg, err := pgbin.Find(pgbin.Options{Explicit: testenv.PGBinDirs(t)[0]}, 0)
	if err != nil {
		t.Fatal(err)
	}
	storeDir := filepath.Join(dir, "damaged-state")
	if err := os.MkdirAll(storeDir, 0o755); err != nil {
		t.Fatal(err)
	}
	state := filepath.Join(storeDir, "state.json")
	damaged := []byte(`{"Epochs": {"pfx": 3}, "Templates": {"pfx": {"h": {"Hash": "h"`)
	if err := os.WriteFile(state, damaged, 0o644); err != nil {
		t.Fatal(err)
	}
	st, err := clusterstore.New(clusterstore.Options{Dir: storeDir,
		Layout: statedir.Layout{Root: filepath.Join(dir, "damaged-state-home")}, PG: pg, User: pgtest.User(t)})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close(context.Background())
	ctx := context.Background()
	if _, _, err := st.Recover(ctx, "pfx", "pfx_test_", true); err == nil || !strings.Contains(err.Error(), state) {
		t.Fatalf("Recover over a damaged state.json = %v, want an error naming %s", err, state)
	}
	if err := st.Save(ctx, "pfx", pool.Record{Hash: "h2", Name: "n", State: "finalized"}); err == nil {
		t.Fatal("Save over a damaged state.json succeeded (it would overwrite what it could not read)")
	}
	if b, _ := os.ReadFile(state); string(b) != string(damaged) {
		t.Fatalf("the damaged state.json was changed: %q", b)
	}
}

// TestSlots: with Slots, one started copy of a template's cluster holds
// several test databases (the managed mode's cloned clusters). Five copies
// from a template of 3 slots run on two servers, each copy has the
// template's row under its own name and keeps its writes to itself; a
// dropped copy's name can be made again while its cluster serves the
// others; the cluster goes once its last copy is dropped; Recover after a
// restart removes what a crashed run left.
func TestSlots(t *testing.T) {
	dir := testenv.Dir(t)
	pg, err := pgbin.Find(pgbin.Options{Explicit: testenv.PGBinDirs(t)[0]}, 0)
	if err != nil {
		t.Fatal(err)
	}
	storeDir := filepath.Join(dir, "slots")
	open := func() *clusterstore.Store {
		st, err := clusterstore.New(clusterstore.Options{Dir: storeDir, Layout: statedir.Layout{Root: filepath.Join(dir, "state")},
			PG: pg, User: pgtest.User(t), Lean: true, OwnName: true, Slots: 3})
		if err != nil {
			t.Fatal(err)
		}
		return st
	}
	st := open()
	defer func() { _ = st.Close(context.Background()) }()
	ctx := context.Background()
	conn := st.Conn()
	connect := func(ep pool.Endpoint) *pgx.Conn {
		t.Helper()
		q := url.Values{"host": {ep.Host}, "port": {strconv.Itoa(ep.Port)}, "user": {conn.Username},
			"password": {conn.Password}, "dbname": {ep.Database}}
		c, err := pgx.Connect(ctx, "postgres:///?"+q.Encode())
		if err != nil {
			t.Fatalf("connect to %+v: %v", ep, err)
		}
		return c
	}
	one := func(ep pool.Endpoint, sql string) string {
		t.Helper()
		c := connect(ep)
		defer c.Close(ctx)
		var s string
		if err := c.QueryRow(ctx, sql).Scan(&s); err != nil {
			t.Fatalf("%s in %s: %v", sql, ep.Database, err)
		}
		return s
	}
	const tmpl = "sl_template_h"
	if _, _, err := st.Recover(ctx, "sl", "sl_test_", true); err != nil {
		t.Fatal(err)
	}
	if err := st.CreateTemplate(ctx, tmpl, "", "template0"); err != nil {
		t.Fatal(err)
	}
	c := connect(st.Endpoint(tmpl))
	if _, err := c.Exec(ctx, "CREATE TABLE conf (v text); INSERT INTO conf VALUES ('from the template')"); err != nil {
		t.Fatal(err)
	}
	_ = c.Close(ctx)
	if err := st.FinalizeTemplate(ctx, tmpl); err != nil {
		t.Fatal(err)
	}
	names := []string{"sl_test_h_0", "sl_test_h_1", "sl_test_h_2", "sl_test_h_3", "sl_test_h_4"}
	ports := map[int]int{}
	metas := map[string]int{}
	for _, n := range names {
		if _, err := st.Create(ctx, n, tmpl, ""); err != nil {
			t.Fatalf("Create %s: %v", n, err)
		}
		ep := st.Endpoint(n)
		if ep.Database != n {
			t.Fatalf("copy %s is database %q", n, ep.Database)
		}
		ports[ep.Port]++
		if got := one(ep, "SELECT v FROM conf"); got != "from the template" {
			t.Fatalf("copy %s holds %q", n, got)
		}
		// The slots are empty databases given the template's files once
		// its cluster stopped: their rows must say what CREATE DATABASE …
		// TEMPLATE would have copied, and the server must take the files
		// as its own (a freeze checks every tuple's xmin against them).
		meta := one(ep, `SELECT d.datfrozenxid || ' ' || d.datminmxid || ' ' ||
			(SELECT count(*) FROM pg_shdepend s WHERE s.dbid = d.oid AND s.deptype = 'o')
			FROM pg_database d WHERE d.datname = current_database()`)
		if metas[meta]++; len(metas) > 1 {
			t.Fatalf("copy %s differs from the others in datfrozenxid, datminmxid or owner dependencies: %v", n, metas)
		}
		if strings.HasSuffix(meta, " 0") {
			t.Fatalf("copy %s has no owner dependency of its table (%s)", n, meta)
		}
		vc := connect(ep)
		if _, err := vc.Exec(ctx, "VACUUM (FREEZE) conf"); err != nil {
			t.Fatalf("freeze in copy %s: %v", n, err)
		}
		_ = vc.Close(ctx)
	}
	if len(ports) != 2 {
		t.Fatalf("5 copies of a template of 3 slots ran on %d servers (%v), want 2", len(ports), ports)
	}
	if n := len(st.Running()); n != 2 {
		t.Fatalf("%d servers run for 5 copies of 3 slots, want 2", n)
	}
	// A copy's writes stay in it, though its neighbour shares the server.
	c = connect(st.Endpoint(names[0]))
	if _, err := c.Exec(ctx, "UPDATE conf SET v = 'changed by the test'"); err != nil {
		t.Fatal(err)
	}
	if st.Endpoint(names[1]).Port != st.Endpoint(names[0]).Port {
		t.Fatal("the first two copies are not neighbours")
	}
	if got := one(st.Endpoint(names[1]), "SELECT v FROM conf"); got != "from the template" {
		t.Fatalf("a neighbour's write reached copy %s: %q", names[1], got)
	}
	// Drop ends the copy's sessions and frees its name in a cluster that
	// goes on serving the others.
	checkpoints := one(st.Endpoint(names[1]), "SELECT checkpoints_req::text FROM pg_stat_bgwriter")
	if err := st.Drop(ctx, names[0]); err != nil {
		t.Fatal(err)
	}
	if err := c.Ping(ctx); err == nil {
		t.Fatal("a session of a dropped copy still works")
	}
	if st.Holds(names[0]) {
		t.Fatal("the store still holds a dropped copy")
	}
	if got := one(st.Endpoint(names[1]), "SELECT count(*)::text FROM pg_database WHERE datname = '"+names[0]+"'"); got != "0" {
		t.Fatal("the dropped copy's database is still in its cluster")
	}
	// It was retired, not dropped: renamed away, closed to connections,
	// and no checkpoint forced on the neighbours (a DROP DATABASE forces
	// one).
	if got := one(st.Endpoint(names[1]), "SELECT string_agg(datname || ':' || datallowconn, ',') FROM pg_database WHERE datname LIKE 'pgfork_used_%'"); got != "pgfork_used_1:false" {
		t.Fatalf("retired databases in the cluster: %q, want pgfork_used_1:false", got)
	}
	if got := one(st.Endpoint(names[1]), "SELECT checkpoints_req::text FROM pg_stat_bgwriter"); got != checkpoints {
		t.Fatalf("the give-back forced a checkpoint in the cluster (requested: %s before, %s after)", checkpoints, got)
	}
	if _, err := st.Create(ctx, names[0], tmpl, ""); err != nil {
		t.Fatalf("Create of a dropped name: %v", err)
	}
	if got := one(st.Endpoint(names[0]), "SELECT v FROM conf"); got != "from the template" {
		t.Fatalf("the copy made again holds %q", got)
	}
	// Every copy dropped: no server runs, no test cluster is left.
	for _, n := range names {
		if err := st.Drop(ctx, n); err != nil {
			t.Fatal(err)
		}
	}
	if n := len(st.Running()); n != 0 {
		t.Fatalf("%d servers run once every copy is dropped, want none", n)
	}
	// A cluster whose free slots nobody took stays for the next copies
	// until its template goes.
	if _, err := st.Create(ctx, "sl_test_h_5", tmpl, ""); err != nil {
		t.Fatal(err)
	}
	if err := st.Drop(ctx, "sl_test_h_5"); err != nil {
		t.Fatal(err)
	}
	if n := len(st.Running()); n != 1 {
		t.Fatalf("%d servers run with a cluster of two free slots, want 1", n)
	}
	if err := st.DropTemplate(ctx, tmpl); err != nil {
		t.Fatal(err)
	}
	if n := len(st.Running()); n != 0 {
		t.Fatalf("%d servers run after the template was dropped", n)
	}
	if ents, _ := os.ReadDir(filepath.Join(storeDir, "tests")); len(ents) != 0 {
		t.Fatalf("test clusters left: %v", ents)
	}
	// A crashed run's cluster of several copies: the next store's Recover
	// stops its server and removes it.
	if err := st.CreateTemplate(ctx, tmpl, "", "template0"); err != nil {
		t.Fatal(err)
	}
	if err := st.FinalizeTemplate(ctx, tmpl); err != nil {
		t.Fatal(err)
	}
	if _, err := st.Create(ctx, "sl_test_h_6", tmpl, ""); err != nil {
		t.Fatal(err)
	}
	var pid int
	for _, p := range st.Running() {
		pid = p
	}
	st2 := open()
	defer func() { _ = st2.Close(context.Background()) }()
	if _, _, err := st2.Recover(ctx, "sl", "sl_test_", true); err != nil {
		t.Fatal(err)
	}
	if ents, _ := os.ReadDir(filepath.Join(storeDir, "tests")); len(ents) != 0 {
		t.Fatalf("Recover left test clusters: %v", ents)
	}
	if pid == 0 || syscall.Kill(pid, 0) == nil {
		t.Fatalf("Recover left the crashed run's server %d running", pid)
	}
}

// TestSlotsFollowNoSymlinkOut: the slots' files are copied as root inside
// the template cluster's data directory, which the server's OS user owns
// and a superuser of that cluster can write to (COPY … TO PROGRAM). A
// template database directory swapped for a symlink to a directory outside
// (here holding a root-only file) must not be copied into the slots: the
// finalize fails, naming the directory, and no slot holds the file.
func TestSlotsFollowNoSymlinkOut(t *testing.T) {
	dir := testenv.Dir(t)
	pg, err := pgbin.Find(pgbin.Options{Explicit: testenv.PGBinDirs(t)[0]}, 0)
	if err != nil {
		t.Fatal(err)
	}
	storeDir := filepath.Join(dir, "slots-symlink")
	st, err := clusterstore.New(clusterstore.Options{Dir: storeDir, Layout: statedir.Layout{Root: filepath.Join(dir, "state")},
		PG: pg, User: pgtest.User(t), Lean: true, OwnName: true, Slots: 3})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = st.Close(context.Background()) }()
	ctx := context.Background()
	const tmpl = "sy_template_h"
	if _, _, err := st.Recover(ctx, "sy", "sy_test_", true); err != nil {
		t.Fatal(err)
	}
	if err := st.CreateTemplate(ctx, tmpl, "", "template0"); err != nil {
		t.Fatal(err)
	}
	// The swap, once the cluster stopped (as a process the tenant left
	// running would): the template database's directory moved outside,
	// with a root-only file beside its own, and a symlink in its place.
	outside := filepath.Join(dir, "outside")
	var tplDir string
	clusterstore.SetTestHookBeforeFill(func(data string, oid uint32) {
		tplDir = filepath.Join(data, "base", strconv.FormatUint(uint64(oid), 10))
		moved := filepath.Join(outside, "db")
		if err := os.MkdirAll(outside, 0o700); err != nil {
			t.Error(err)
		}
		if err := os.Rename(tplDir, moved); err != nil {
			t.Error(err)
		}
		if err := os.WriteFile(filepath.Join(moved, "root-secret"), []byte("not for the tenant"), 0o600); err != nil {
			t.Error(err)
		}
		if err := os.Symlink(moved, tplDir); err != nil {
			t.Error(err)
		}
	})
	defer clusterstore.SetTestHookBeforeFill(nil)
	data := filepath.Join(storeDir, "templates", tmpl, "data")
	err = st.FinalizeTemplate(ctx, tmpl)
	if tplDir == "" {
		t.Fatal("finalize made no reflink slots: nothing was tried")
	}
	if err == nil || !strings.Contains(err.Error(), tplDir) {
		t.Errorf("finalize with the template's directory a symlink out of the cluster: %v, want an error naming %s", err, tplDir)
	}
	_ = filepath.WalkDir(data, func(p string, d os.DirEntry, err error) error {
		if err == nil && d.Name() == "root-secret" {
			t.Errorf("the root-only file was copied into the cluster: %s", p)
		}
		return nil
	})
}
