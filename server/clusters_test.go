package server_test

import (
	"context"
	"fmt"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/pgfork/pgfork/instance"
	"github.com/pgfork/pgfork/internal/pgtest"
	"github.com/pgfork/pgfork/internal/statedir"
	"github.com/pgfork/pgfork/internal/testenv"
	"github.com/pgfork/pgfork/pgbin"
	"github.com/pgfork/pgfork/pool"
	"github.com/pgfork/pgfork/pool/clusterstore"
	"github.com/pgfork/pgfork/server"
)

type clusterEnv struct {
	env
	store *clusterstore.Store
	pids  map[int]bool // every server pid seen
}

// newClusterEnv serves cluster isolation from dir (on the XFS reflink image).
func newClusterEnv(t *testing.T, dir string, init, max int) *clusterEnv {
	t.Helper()
	pg, err := pgbin.Find(pgbin.Options{Explicit: testenv.PGBinDirs(t)[0]}, 0)
	if err != nil {
		t.Fatal(err)
	}
	u := pgtest.User(t)
	st, err := clusterstore.New(clusterstore.Options{Dir: filepath.Join(dir, "serve-clusters"),
		Layout: statedir.Layout{Root: filepath.Join(dir, "state")}, PG: pg, User: u})
	if err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewRegistry()
	metrics := server.NewMetrics(reg)
	mgr, err := pool.NewManager(pool.ManagerConfig{Prefix: "pfc", Owner: st.Role(), Initial: init, Max: max,
		Parallel: 2, GetTimeout: 60 * time.Second, FinalizeTimeout: 30 * time.Second, Observer: metrics}, st)
	if err != nil {
		t.Fatal(err)
	}
	if err := mgr.Open(context.Background()); err != nil {
		t.Fatal(err)
	}
	e := &clusterEnv{store: st, pids: map[int]bool{}}
	e.mgr = mgr
	e.srv = httptest.NewServer(server.New(server.Config{Manager: mgr, Conn: st.Conn(), Registry: reg, Metrics: metrics}))
	t.Cleanup(e.srv.Close)
	t.Cleanup(func() { _ = mgr.Close(context.Background()) })
	return e
}

func (e *clusterEnv) seen() {
	for _, pid := range e.store.Running() {
		e.pids[pid] = true
	}
}

func alive(pid int) bool { return syscall.Kill(pid, 0) == nil }

type serverID struct {
	port    int
	dataDir string
	sysid   int64
	super   bool
}

func identify(t *testing.T, c config) serverID {
	t.Helper()
	conn := connect(t, c)
	defer conn.Close(context.Background())
	var id serverID
	if err := conn.QueryRow(context.Background(), `SELECT inet_server_port(), current_setting('data_directory'),
		(SELECT system_identifier FROM pg_control_system())::bigint, (SELECT rolsuper FROM pg_roles WHERE rolname = current_user)`).
		Scan(&id.port, &id.dataDir, &id.sysid, &id.super); err != nil {
		t.Fatal(err)
	}
	if id.port != c.Port {
		t.Fatalf("config says port %d, server runs on %d", c.Port, id.port)
	}
	return id
}

func query(t *testing.T, c config, sql string) string {
	t.Helper()
	conn := connect(t, c)
	defer conn.Close(context.Background())
	var s string
	if err := conn.QueryRow(context.Background(), sql).Scan(&s); err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
	return s
}

// TestClusterIsolation walks IntegreSQL's flow with a whole server per
// test: the template is migrated in its own cluster, finalize stops it, two
// tests get two servers (ports, data directories differ), a test is a
// superuser and can ALTER SYSTEM without touching the other, unlock gives
// the same server back, recreate a fresh one, discard stops and removes
// them all, and shutting down leaves no postgres process.
func TestClusterIsolation(t *testing.T) {
	e := newClusterEnv(t, testenv.XFSDir(t), 1, 2)
	const h = "clusteriso"
	var tpl struct {
		Database struct{ Config config } `json:"database"`
	}
	e.expect(t, "POST", "/api/v1/templates", map[string]string{"hash": h}, 200).json(t, &tpl)
	tc := tpl.Database.Config
	if tc.Port == 0 || tc.Password == "" {
		t.Fatalf("template config %+v", tc)
	}
	if err := execAs(t, tc, "CREATE TABLE migrated(x int); INSERT INTO migrated VALUES (1)"); err != nil {
		t.Fatal(err)
	}
	e.seen()
	e.expect(t, "PUT", "/api/v1/templates/"+h, nil, 204)
	if _, ok := e.store.Running()["pfc_template_"+h]; ok {
		t.Fatal("template cluster still runs after finalize")
	}

	var a, b testDB
	e.expect(t, "GET", "/api/v1/templates/"+h+"/tests", nil, 200).json(t, &a)
	e.expect(t, "GET", "/api/v1/templates/"+h+"/tests", nil, 200).json(t, &b)
	e.seen()
	ia, ib := identify(t, a.Database.Config), identify(t, b.Database.Config)
	if ia.port == ib.port || ia.dataDir == ib.dataDir || ia.port == tc.Port {
		t.Fatalf("two tests share a server: %+v %+v (template port %d)", ia, ib, tc.Port)
	}
	if !ia.super || !ib.super {
		t.Fatal("the client role is not a superuser of its cluster")
	}
	if got := query(t, a.Database.Config, "SELECT count(*)::text FROM migrated"); got != "1" {
		t.Fatalf("test cluster lacks the migration: %s", got)
	}
	// Superuser things in a do not reach b.
	if err := execAs(t, a.Database.Config, "ALTER SYSTEM SET work_mem = '7MB'"); err != nil {
		t.Fatal(err)
	}
	if err := execAs(t, a.Database.Config, "SELECT pg_reload_conf(); CREATE ROLE only_in_a"); err != nil {
		t.Fatal(err)
	}
	// pg_reload_conf only signals the postmaster: new sessions see the
	// setting once it has read the file again.
	testenv.WaitFor(t, "ALTER SYSTEM in a to set work_mem in its new sessions", func() bool {
		return query(t, a.Database.Config, "SHOW work_mem") == "7MB"
	})
	if got := query(t, b.Database.Config, "SHOW work_mem"); got == "7MB" {
		t.Fatal("ALTER SYSTEM in a changed b")
	}
	if got := query(t, b.Database.Config, "SELECT count(*)::text FROM pg_roles WHERE rolname = 'only_in_a'"); got != "0" {
		t.Fatal("a role created in a exists in b")
	}

	// Unlock gives the same server back.
	e.expect(t, "POST", fmt.Sprintf("/api/v1/templates/%s/tests/%d/unlock", h, b.ID), nil, 204)
	var b2 testDB
	e.expect(t, "GET", "/api/v1/templates/"+h+"/tests", nil, 200).json(t, &b2)
	if b2.ID != b.ID || b2.Database.Config.Port != b.Database.Config.Port {
		t.Fatalf("unlock then get: id %d port %d, want id %d port %d", b2.ID, b2.Database.Config.Port, b.ID, b.Database.Config.Port)
	}
	// Recreate: a comes back as a fresh cluster (pool max 2: it must be a).
	oldPid := ia.pid(t)
	e.expect(t, "POST", fmt.Sprintf("/api/v1/templates/%s/tests/%d/recreate", h, a.ID), nil, 204)
	var a2 testDB
	e.expect(t, "GET", "/api/v1/templates/"+h+"/tests", nil, 200).json(t, &a2)
	e.seen()
	if a2.ID != a.ID {
		t.Fatalf("recreated id %d, want %d", a2.ID, a.ID)
	}
	if got := query(t, a2.Database.Config, "SHOW work_mem"); got == "7MB" {
		t.Fatal("recreated cluster kept ALTER SYSTEM")
	}
	if got := query(t, a2.Database.Config, "SELECT count(*)::text FROM pg_roles WHERE rolname = 'only_in_a'"); got != "0" {
		t.Fatal("recreated cluster kept a role")
	}
	if oldPid == identify(t, a2.Database.Config).pid(t) || alive(oldPid) {
		t.Fatal("the recreated cluster's old server still runs")
	}
	// Metrics carry the creation strategy "cluster".
	if r := e.expect(t, "GET", "/metrics", nil, 200); !containsStr(r.body, `pgfork_database_create_seconds_count{strategy="cluster"}`) {
		t.Fatalf("metrics lack cluster creations")
	}

	// Discard: every cluster of the template stops and goes away.
	e.expect(t, "DELETE", "/api/v1/templates/"+h, nil, 204)
	if n := len(e.store.Running()); n != 0 {
		t.Fatalf("%d clusters still run after discard", n)
	}
	for pid := range e.pids {
		if alive(pid) {
			t.Fatalf("postgres %d still runs after discard", pid)
		}
	}
	ents, _ := os.ReadDir(filepath.Join(filepath.Dir(ia.dataDir), ".."))
	if len(ents) != 0 {
		t.Fatalf("test clusters left on disk: %v", ents)
	}

	// Shutdown with clusters in use leaves no postgres process.
	e.migrateCluster(t, "second")
	var c testDB
	e.expect(t, "GET", "/api/v1/templates/second/tests", nil, 200).json(t, &c)
	e.expect(t, "POST", "/api/v1/templates", map[string]string{"hash": "third"}, 200) // left initializing
	e.seen()
	if err := e.mgr.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	for pid := range e.pids {
		if alive(pid) {
			t.Fatalf("postgres %d still runs after shutdown", pid)
		}
	}
}

func (id serverID) pid(t *testing.T) int {
	t.Helper()
	pf, err := instance.ReadPidFile(id.dataDir)
	if err != nil {
		t.Fatal(err)
	}
	return pf.Pid
}

func containsStr(b []byte, s string) bool { return strings.Contains(string(b), s) }

func (e *clusterEnv) migrateCluster(t *testing.T, hash string) {
	t.Helper()
	var tpl struct {
		Database struct{ Config config } `json:"database"`
	}
	e.expect(t, "POST", "/api/v1/templates", map[string]string{"hash": hash}, 200).json(t, &tpl)
	if err := execAs(t, tpl.Database.Config, "CREATE TABLE migrated(x int)"); err != nil {
		t.Fatal(err)
	}
	e.expect(t, "PUT", "/api/v1/templates/"+hash, nil, 204)
}

// TestClusterIsolationCrash: after a crash (pools stopped, servers left
// running), the next start stops and removes the test clusters and the
// template cluster left initializing, brings the finalized template back
// (initialize: 423) and hands out clusters again.
func TestClusterIsolationCrash(t *testing.T) {
	dir := testenv.XFSDir(t)
	e := newClusterEnv(t, dir, 1, 2)
	e.migrateCluster(t, "crash")
	var a testDB
	e.expect(t, "GET", "/api/v1/templates/crash/tests", nil, 200).json(t, &a)
	e.expect(t, "POST", "/api/v1/templates", map[string]string{"hash": "half"}, 200)
	e.seen()
	if len(e.pids) < 2 {
		t.Fatalf("expected a test and a template cluster running, got %v", e.pids)
	}
	e.srv.Close()
	_ = e.mgr.Stop(context.Background()) // crash-like: clusters keep running
	for pid := range e.pids {
		if !alive(pid) {
			t.Fatalf("crash simulation stopped %d", pid)
		}
	}

	e2 := newClusterEnv(t, dir, 1, 2)
	for pid := range e.pids {
		if alive(pid) {
			t.Fatalf("postgres %d left by the crash still runs after restart", pid)
		}
	}
	e2.expect(t, "POST", "/api/v1/templates", map[string]string{"hash": "crash"}, 423)
	e2.expect(t, "GET", "/api/v1/templates/half/tests", nil, 404)
	var b testDB
	e2.expect(t, "GET", "/api/v1/templates/crash/tests", nil, 200).json(t, &b)
	if err := execAs(t, b.Database.Config, "SELECT x FROM migrated"); err != nil {
		t.Fatal(err)
	}
	e2.seen()
	if err := e2.mgr.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	for pid := range e2.pids {
		if alive(pid) {
			t.Fatalf("postgres %d still runs after shutdown", pid)
		}
	}
}

// TestClusterSocketOnRequest: with a cluster per test, ?socket=1 names
// that test's own cluster's private socket directory (not a shared one),
// where the handed-out role connects without its password to the same
// server and database as over TCP; unasked, the answer has no socketDir.
func TestClusterSocketOnRequest(t *testing.T) {
	e := newClusterEnv(t, testenv.XFSDir(t), 1, 3)
	const h = "clustersock"
	e.expect(t, "POST", "/api/v1/templates", map[string]string{"hash": h}, 200)
	e.expect(t, "PUT", "/api/v1/templates/"+h, nil, 204)
	var plain, a, b socketAnswer
	e.expect(t, "GET", "/api/v1/templates/"+h+"/tests", nil, 200).json(t, &plain)
	if plain.Database.Config.SocketDir != nil {
		t.Errorf("unasked hand-out names socketDir %q", *plain.Database.Config.SocketDir)
	}
	e.expect(t, "GET", "/api/v2/templates/"+h+"/tests?socket=1", nil, 200).json(t, &a)
	e.expect(t, "GET", "/api/v1/templates/"+h+"/tests?socket=1", nil, 200).json(t, &b)
	sa, sb := a.Database.Config.SocketDir, b.Database.Config.SocketDir
	if sa == nil || sb == nil || !filepath.IsAbs(*sa) || *sa == *sb {
		t.Fatalf("socket dirs of two test clusters: %v, %v; want two absolute, different", sa, sb)
	}
	c := a.Database.Config
	tcp := identify(t, c.config)
	q := url.Values{"host": {*sa}, "port": {strconv.Itoa(c.Port)}, "user": {c.Username}, "sslmode": {"disable"}}
	conn, err := pgx.Connect(context.Background(), "postgres:///"+c.Database+"?"+q.Encode())
	if err != nil {
		t.Fatalf("connecting on the cluster's socket without a password: %v", err)
	}
	defer conn.Close(context.Background())
	var dataDir, db, user string
	if err := conn.QueryRow(context.Background(), "SELECT current_setting('data_directory'), current_database(), current_user").
		Scan(&dataDir, &db, &user); err != nil {
		t.Fatal(err)
	}
	if dataDir != tcp.dataDir || db != c.Database || user != c.Username {
		t.Errorf("on the socket: %s %s %s; over TCP: %s %s %s", dataDir, db, user, tcp.dataDir, c.Database, c.Username)
	}
}
