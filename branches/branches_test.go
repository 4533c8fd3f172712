package branches

import (
	"context"
	"encoding/json"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/pgfork/pgfork/cluster"
	"github.com/pgfork/pgfork/internal/errs"
	"github.com/pgfork/pgfork/internal/pgtest"
	"github.com/pgfork/pgfork/internal/statedir"
	"github.com/pgfork/pgfork/internal/testenv"
)

// env is a running source cluster on XFS and the Options over it.
//
// The tests mostly wait on PostgreSQL and the disks, so those that can run
// beside each other call t.Parallel(); Go starts them only once every test
// that does not has finished. Each has its own source cluster, state
// directory and ports (the kernel's free ones); a killed create is a
// process of its own. Serial stay the tests that set a package variable
// (testHook, notStreamingGrace) and those that check free space on the
// shared XFS image (the floor, the disk quota), which the others fill.
func env(t *testing.T) Options {
	t.Helper()
	b := pgtest.Builds(t, 0)[0]
	dir := testenv.XFSDir(t)
	src := filepath.Join(dir, "src")
	pgtest.InitDB(t, src, pgtest.Server{BinDir: b.Bin})
	in := pgtest.Start(t, src, pgtest.Server{BinDir: b.Bin})
	pgtest.Exec(t, in.ConnString("", ""), "CREATE TABLE seed (id int)", "INSERT INTO seed VALUES (1)")
	return Options{Layout: statedir.Layout{Root: filepath.Join(dir, "state")}, Installation: b.Inst, User: b.User,
		Sources:     []Source{{Name: "prod", Kind: SourceCluster, DataDir: src, ConnString: in.ConnString("", "")}},
		AdminTokens: []string{"admin"}}
}

func open(t *testing.T, o Options) *Manager {
	t.Helper()
	m, err := Open(context.Background(), o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		for _, b := range m.List(Caller{Token: "admin"}).Branches {
			_, _ = m.Protect(Caller{Token: "admin"}, b.Name, false)
			_ = m.Delete(context.Background(), Caller{Token: "admin"}, b.Name)
		}
		m.Close()
	})
	return m
}

func wantKind(t *testing.T, what string, err error, k errs.Kind) {
	t.Helper()
	if errs.KindOf(err) != k || err == nil {
		t.Errorf("%s: %v, want %v", what, err, k)
	}
}

// TestBranches: a branch of a running source is a server of its own on
// TCP with its own role and password; reset drops its changes and keeps
// its port and credentials; another token sees none of it (an admin token
// does); the quota refuses one too many; protect refuses a delete; a
// snapshot of a branch is branched again; after serve stops every branch
// and opens again, they run on the same ports with their data.
func TestBranches(t *testing.T) {
	t.Parallel() // see env
	ctx := context.Background()
	o := env(t)
	o.MaxBranches = 2
	m := open(t, o)
	alice, bob, admin := Caller{Token: "alice"}, Caller{Token: "bob"}, Caller{Token: "admin"}

	a1, err := m.Create(ctx, alice, CreateOptions{Name: "a1", Source: "prod"})
	if err != nil {
		t.Fatal(err)
	}
	if a1.Role == "postgres" || a1.Password == "" || a1.Host != "127.0.0.1" {
		t.Fatalf("branch %+v: want its own role and password on loopback", a1)
	}
	if got := pgtest.Query(t, a1.URL(), "SELECT count(*) FROM seed"); got != "1" {
		t.Fatalf("seed rows in the branch: %s", got)
	}
	// TCP needs the password.
	bad := a1
	bad.Password = "wrong"
	if err := tryQuery(bad.URL()); err == nil {
		t.Error("a wrong password was accepted over TCP")
	}
	pgtest.Exec(t, a1.URL(), "CREATE TABLE broken (x int)", "DELETE FROM seed")

	r, err := m.Reset(ctx, alice, "a1")
	if err != nil {
		t.Fatal(err)
	}
	if r.Port != a1.Port || r.URL() != a1.URL() {
		t.Errorf("reset moved the branch: %s, was %s", r.URL(), a1.URL())
	}
	if got := pgtest.Query(t, a1.URL(), "SELECT count(*) FROM seed"); got != "1" {
		t.Errorf("after reset, seed has %s rows, want 1", got)
	}
	if got := pgtest.Query(t, a1.URL(), "SELECT count(*) FROM pg_class WHERE relname = 'broken'"); got != "0" {
		t.Error("reset kept a table made after the branch's point")
	}

	// Isolation.
	if l := m.List(bob).Branches; len(l) != 0 {
		t.Errorf("bob lists %d branches of alice's", len(l))
	}
	_, err = m.Get(bob, "a1")
	wantKind(t, "bob gets alice's branch", err, errs.NotFound)
	wantKind(t, "bob deletes alice's branch", m.Delete(ctx, bob, "a1"), errs.NotFound)
	_, err = m.Reset(ctx, bob, "a1")
	wantKind(t, "bob resets alice's branch", err, errs.NotFound)
	if l := m.List(admin).Branches; len(l) != 1 || l[0].Owner != Owner("alice") {
		t.Errorf("admin lists %+v, want alice's a1", l)
	}

	// Snapshot of a branch, branch of the snapshot.
	pgtest.Exec(t, a1.URL(), "INSERT INTO seed VALUES (2)")
	s, err := m.CreateSnapshot(ctx, alice, SnapshotOptions{Name: "s1", Branch: "a1"})
	if err != nil {
		t.Fatal(err)
	}
	if s.From != "branch:a1" {
		t.Errorf("snapshot from %q", s.From)
	}
	a2, err := m.Create(ctx, alice, CreateOptions{Name: "a2", Snapshot: "s1"})
	if err != nil {
		t.Fatal(err)
	}
	if got := pgtest.Query(t, a2.URL(), "SELECT count(*) FROM seed"); got != "2" {
		t.Errorf("branch of the snapshot has %s rows, want 2", got)
	}
	snaps := m.List(alice).Snapshots
	if len(snaps) != 1 || snaps[0].Size == 0 {
		t.Errorf("snapshots listed: %+v, want s1 with a size", snaps)
	}
	wantKind(t, "deleting a snapshot a branch is made from", m.DeleteSnapshot(alice, "s1"), errs.Busy)

	// Quota.
	_, err = m.Create(ctx, alice, CreateOptions{Name: "a3", Source: "prod"})
	wantKind(t, "a third branch with a quota of 2", err, errs.Permission)
	if _, err := os.Stat(m.branchDir("a3")); err == nil {
		t.Error("the refused branch left a data directory")
	}

	// Protect.
	if _, err := m.Protect(alice, "a1", true); err != nil {
		t.Fatal(err)
	}
	wantKind(t, "deleting a protected branch", m.Delete(ctx, alice, "a1"), errs.Busy)

	// Restart of serve, branches stopped with it.
	m.StopAll(ctx)
	m.Close()
	m2, err := Open(ctx, o)
	if err != nil {
		t.Fatal(err)
	}
	m = m2
	t.Cleanup(func() {
		for _, b := range m.List(admin).Branches {
			_, _ = m.Protect(admin, b.Name, false)
			_ = m.Delete(ctx, admin, b.Name)
		}
		m.Close()
	})
	if got := pgtest.Query(t, a2.URL(), "SELECT count(*) FROM seed"); got != "2" {
		t.Errorf("after a restart a2 has %s rows, want 2", got)
	}
	if l := m.List(alice).Branches; len(l) != 2 || !l[0].Protected {
		t.Errorf("after a restart alice lists %+v", l)
	}

	if _, err := m.Protect(alice, "a1", false); err != nil {
		t.Fatal(err)
	}
	for _, n := range []string{"a1", "a2"} {
		if err := m.Delete(ctx, alice, n); err != nil {
			t.Fatal(err)
		}
	}
	if err := m.DeleteSnapshot(alice, "s1"); err != nil {
		t.Fatal(err)
	}
	for _, sub := range []string{"snap", "data"} {
		if ents, _ := os.ReadDir(filepath.Join(m.dir, sub)); len(ents) != 0 {
			t.Errorf("%s/ keeps %d entries after everything was deleted", sub, len(ents))
		}
	}
	if l, _ := cluster.List(o.Layout); len(l) != 0 {
		t.Errorf("the registry keeps %+v", l)
	}
}

func tryQuery(url string) error {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := connect(ctx, url)
	if err != nil {
		return err
	}
	c.Close(ctx)
	return nil
}

// TestCreateKilled: serve killed with SIGKILL while a create has started
// the branch's server but not recorded it complete; the next Open stops
// that server and removes the branch, its data directory, its origin
// snapshot and its registry entry, and its port is free again.
func TestCreateKilled(t *testing.T) {
	t.Parallel() // see env
	killedCreate(t, "started")
}

// TestCreateKilledPreparing: the same, killed while the server recovering
// the branch's origin snapshot (prepare) runs: the next Open stops that
// server too.
func TestCreateKilledPreparing(t *testing.T) {
	t.Parallel() // see env
	killedCreate(t, "preparing")
}

// killedCreate kills a child test process at a create's step and checks
// that the next Open leaves nothing of it.
func killedCreate(t *testing.T, step string) {
	if os.Getenv("PGFORK_BRANCHES_CHILD") != "" {
		var c struct{ Root, Src, Step string }
		if err := json.Unmarshal([]byte(os.Getenv("PGFORK_BRANCHES_CHILD")), &c); err != nil {
			t.Fatal(err)
		}
		b := pgtest.Builds(t, 0)[0]
		o := Options{Layout: statedir.Layout{Root: c.Root}, Installation: b.Inst, User: b.User,
			Sources: []Source{{Name: "prod", Kind: SourceCluster, DataDir: c.Src}}}
		m, err := Open(context.Background(), o)
		if err != nil {
			t.Fatal(err)
		}
		testHook = func(step string) {
			if step == c.Step {
				_ = syscall.Kill(os.Getpid(), syscall.SIGKILL)
			}
		}
		_, err = m.Create(context.Background(), Caller{Token: "alice"}, CreateOptions{Name: "k1", Source: "prod"})
		t.Fatalf("create returned (%v) instead of being killed", err)
	}
	o := env(t)
	b, err := json.Marshal(struct{ Root, Src, Step string }{o.Layout.Root, o.Sources[0].DataDir, step})
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(os.Args[0], "-test.run=^"+t.Name()+"$", "-test.count=1")
	cmd.Env = append(os.Environ(), "PGFORK_BRANCHES_CHILD="+string(b))
	out, err := cmd.CombinedOutput()
	if ee, ok := err.(*exec.ExitError); !ok || ee.Sys().(syscall.WaitStatus).Signal() != syscall.SIGKILL {
		t.Fatalf("the child was not killed (%v):\n%s", err, out)
	}
	var st state
	raw, err := os.ReadFile(filepath.Join(Dir(o.Layout), "state.json"))
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(raw, &st); err != nil || len(st.Branches) != 1 || st.Branches[0].State != stateCreating {
		t.Fatalf("state before reopening: %s", raw)
	}
	port := st.Branches[0].Port
	if l, _ := cluster.List(o.Layout); len(l) != 1 || l[0].State != cluster.Running {
		t.Fatalf("the killed create's server is not running: %+v (the hook ran too early)", l)
	}

	m := open(t, o)
	if l := m.List(Caller{Token: "admin"}); len(l.Branches) != 0 || len(m.st.Snapshots) != 0 {
		t.Errorf("after reopening: %+v, snapshots %+v", l.Branches, m.st.Snapshots)
	}
	for _, sub := range []string{"snap", "data"} {
		if ents, _ := os.ReadDir(filepath.Join(m.dir, sub)); len(ents) != 0 {
			t.Errorf("%s/ keeps %v", sub, ents)
		}
	}
	if l, _ := cluster.List(o.Layout); len(l) != 0 {
		t.Errorf("the registry keeps %+v", l)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(port))
	if err != nil {
		t.Errorf("port %d of the killed create is still taken: %v", port, err)
	} else {
		ln.Close()
	}
}

// TestExpiryAndFloor: a branch past its TTL is deleted by Expire unless
// protected; below the free-space floor nothing is created (NoSpace) and
// nothing is left behind.
func TestExpiryAndFloor(t *testing.T) {
	ctx := context.Background()
	o := env(t)
	m := open(t, o)
	alice := Caller{Token: "alice"}
	for _, c := range []CreateOptions{{Name: "short", Source: "prod", TTL: time.Second},
		{Name: "kept", Source: "prod", TTL: time.Second, Protected: true}} {
		if _, err := m.Create(ctx, alice, c); err != nil {
			t.Fatal(err)
		}
	}
	time.Sleep(1100 * time.Millisecond)
	m.Expire(ctx)
	l := m.List(alice).Branches
	if len(l) != 1 || l[0].Name != "kept" {
		t.Fatalf("after expiry: %+v, want only the protected branch", l)
	}
	if _, err := os.Stat(m.branchDir("short")); err == nil {
		t.Error("the expired branch's data directory is left")
	}

	m.o.MinFree = 1 << 62
	_, err := m.Create(ctx, alice, CreateOptions{Name: "big", Source: "prod"})
	wantKind(t, "create below the floor", err, errs.NoSpace)
	_, err = m.CreateSnapshot(ctx, alice, SnapshotOptions{Name: "s", Source: "prod"})
	wantKind(t, "snapshot below the floor", err, errs.NoSpace)
	if ents, _ := os.ReadDir(filepath.Join(m.dir, "data")); len(ents) != 1 {
		t.Errorf("data/ has %d entries, want the one kept branch", len(ents))
	}
}

// TestIdleDeletion: a branch with a session open is kept however long it
// lasts; once no session was seen for the idle time it is deleted, unless
// protected.
func TestIdleDeletion(t *testing.T) {
	t.Parallel() // see env
	ctx := context.Background()
	m := open(t, env(t))
	me := Caller{Token: "me"}
	busy, err := m.Create(ctx, me, CreateOptions{Name: "busy", Source: "prod"})
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []CreateOptions{{Name: "idle", Source: "prod"}, {Name: "guarded", Source: "prod", Protected: true}} {
		if _, err := m.Create(ctx, me, c); err != nil {
			t.Fatal(err)
		}
	}
	conn, err := connect(ctx, busy.URL())
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(1100 * time.Millisecond)
	m.ExpireIdle(ctx, time.Second)
	var names []string
	for _, b := range m.List(me).Branches {
		names = append(names, b.Name)
	}
	if len(names) != 2 || names[0] != "busy" || names[1] != "guarded" {
		t.Fatalf("after the idle time: %v, want busy (a session) and guarded (protected)", names)
	}
	conn.Close(ctx)
	// Seen idle now, not yet for the idle time (a long one: the check
	// above, under load, may itself take over a second).
	m.ExpireIdle(ctx, time.Minute)
	if _, err := m.Get(me, "busy"); err != nil {
		t.Fatalf("busy deleted as soon as its session ended: %v", err)
	}
	time.Sleep(1100 * time.Millisecond)
	m.ExpireIdle(ctx, time.Second)
	if _, err := m.Get(me, "busy"); !errs.IsNotFound(err) {
		t.Errorf("busy kept a second after its last session: %v", err)
	}
}

// TestSnapshotRetention: snapshots of a source kept to the newest N, but
// never one a branch is made from; sizes show what is shared.
func TestSnapshotRetention(t *testing.T) {
	t.Parallel() // see env
	ctx := context.Background()
	m := open(t, env(t))
	me := Caller{Token: "me"}
	take := func(name string) {
		t.Helper()
		if _, err := m.CreateSnapshot(ctx, me, SnapshotOptions{Name: name, Source: "prod", Keep: 2}); err != nil {
			t.Fatal(err)
		}
	}
	take("s1")
	if _, err := m.Create(ctx, me, CreateOptions{Name: "on-s1", Snapshot: "s1"}); err != nil {
		t.Fatal(err)
	}
	take("s2")
	take("s3")
	take("s4")
	var names []string
	for _, s := range m.List(me).Snapshots {
		names = append(names, s.Name)
		if s.Size == 0 || s.Shared == 0 {
			t.Errorf("snapshot %s: size %d, shared %d; want both (a reflink copy of the source)", s.Name, s.Size, s.Shared)
		}
	}
	if strings.Join(names, ",") != "s1,s3,s4" {
		t.Errorf("snapshots kept: %v, want s1 (a branch is made from it) and the newest two", names)
	}
	if _, err := os.Stat(m.snapDir("s2")); err == nil {
		t.Error("the dropped snapshot's files are left")
	}
}

// TestParallelCreates: creates run in parallel (the long steps hold no
// lock), List answers meanwhile, and each branch gets a port of its own.
func TestParallelCreates(t *testing.T) {
	t.Parallel() // see env
	ctx := context.Background()
	m := open(t, env(t))
	me := Caller{Token: "me"}
	const n = 4
	errc := make(chan error, n)
	for i := 0; i < n; i++ {
		go func() {
			_, err := m.Create(ctx, me, CreateOptions{Name: "p" + strconv.Itoa(i), Source: "prod"})
			errc <- err
		}()
	}
	creating := false
	for i := 0; i < n; {
		select {
		case err := <-errc:
			if err != nil {
				t.Error(err)
			}
			i++
		default:
			for _, b := range m.List(me).Branches {
				creating = creating || b.State == stateCreating
			}
			time.Sleep(5 * time.Millisecond)
		}
	}
	if !creating {
		t.Error("List never showed a branch being created: it waited for the creates")
	}
	ports := map[int]bool{}
	for _, b := range m.List(me).Branches {
		ports[b.Port] = true
		if got := pgtest.Query(t, b.URL(), "SELECT count(*) FROM seed"); got != "1" {
			t.Errorf("%s: %s seed rows", b.Name, got)
		}
	}
	if len(ports) != n {
		t.Errorf("%d ports for %d branches", len(ports), n)
	}
}

// TestStandbySource: a standby of a primary, made and kept running by the
// Manager, is branched without stopping it; rows committed on the primary
// after a branch was made reach the standby (it keeps following) and the
// next branch, not the first; after a restart of the Manager with the
// standby stopped, it starts again and catches up.
func TestStandbySource(t *testing.T) {
	t.Parallel() // see env
	ctx := context.Background()
	b := pgtest.Builds(t, 0)[0]
	dir := testenv.XFSDir(t)
	src := filepath.Join(dir, "primary")
	pgtest.InitDB(t, src, pgtest.Server{BinDir: b.Bin})
	// Backups on a standby need full-page writes on the primary (the
	// test profile turns them off).
	in := pgtest.Start(t, src, pgtest.Server{BinDir: b.Bin, Settings: map[string]string{"wal_level": "replica", "full_page_writes": "on"}})
	purl := in.ConnString("", "")
	pgtest.Exec(t, purl, "CREATE TABLE t (id int)", "INSERT INTO t VALUES (1)")
	o := Options{Layout: statedir.Layout{Root: filepath.Join(dir, "state")}, Installation: b.Inst, User: b.User,
		Sources: []Source{{Name: "replica", Kind: SourceStandby, PrimaryURL: purl}}, AdminTokens: []string{"admin"}}
	m := open(t, o)
	e, err := cluster.Get(o.Layout, standbyReg("replica"))
	if err != nil {
		t.Fatal(err)
	}
	sby := (&instanceAt{e.SocketDir, e.Port}).url()
	t.Cleanup(func() {
		_ = cluster.Down(ctx, o.Layout, standbyReg("replica"), cluster.DownOptions{Timeout: 10 * time.Second})
	})
	if got := pgtest.Query(t, sby, "SELECT pg_is_in_recovery()::text"); got != "true" {
		t.Fatalf("the standby is not in recovery: %s", got)
	}
	me := Caller{Token: "me"}
	b1, err := m.Create(ctx, me, CreateOptions{Name: "b1", Source: "replica"})
	if err != nil {
		t.Fatal(err)
	}
	pgtest.Exec(t, purl, "INSERT INTO t VALUES (2)")
	waitRows(t, sby, "2")
	b2, err := m.Create(ctx, me, CreateOptions{Name: "b2", Source: "replica"})
	if err != nil {
		t.Fatal(err)
	}
	if got := pgtest.Query(t, b1.URL(), "SELECT count(*) FROM t"); got != "1" {
		t.Errorf("b1 has %s rows, want 1 (made before the second row)", got)
	}
	if got := pgtest.Query(t, b2.URL(), "SELECT count(*) FROM t"); got != "2" {
		t.Errorf("b2 has %s rows, want 2", got)
	}
	if got := pgtest.Query(t, b2.URL(), "SELECT pg_is_in_recovery()::text"); got != "false" {
		t.Error("a branch of the standby is still a standby")
	}
	// Its lag: behind while its replay is paused (bytes, and seconds
	// since the last transaction it replayed), back to 0 once resumed.
	lagOf := func() Lag {
		t.Helper()
		l := m.List(me).Sources
		if len(l) != 1 || l[0].Lag == nil {
			t.Fatalf("sources listed without the standby's lag: %+v", l)
		}
		if l[0].Lag.Error != "" {
			t.Fatalf("lag unknown: %s", l[0].Lag.Error)
		}
		return *l[0].Lag
	}
	pgtest.Exec(t, sby, "SELECT pg_wal_replay_pause()")
	pgtest.Exec(t, purl, "INSERT INTO t VALUES (3)")
	time.Sleep(1100 * time.Millisecond)
	if l := lagOf(); l.Bytes <= 0 || l.Seconds == nil || *l.Seconds < 1 {
		t.Errorf("lag while the standby's replay is paused: %+v (seconds %v), want bytes > 0 and ≥ 1 s", l, ptr(l.Seconds))
	}
	reg := prometheus.NewRegistry()
	reg.MustRegister(m.Collector())
	mfs, err := reg.Gather()
	var got []string
	for _, mf := range mfs {
		for _, x := range mf.GetMetric() {
			if x.GetGauge().GetValue() > 0 {
				got = append(got, mf.GetName())
			}
		}
	}
	if err != nil || strings.Join(got, ",") != "pgfork_branch_source_lag_bytes,pgfork_branch_source_lag_seconds,pgfork_branch_source_streaming" {
		t.Errorf("lag metrics above 0: %v (%v), want bytes, seconds and streaming of the one standby", got, err)
	}
	pgtest.Exec(t, sby, "SELECT pg_wal_replay_resume()")
	waitRows(t, sby, "3")
	testenv.WaitFor(t, "the lag of a standby that caught up to be 0", func() bool {
		l := lagOf()
		return l.Bytes == 0 && l.Seconds != nil && *l.Seconds == 0
	})
	// Falls behind while stopped, catches up when started again.
	m.StopAll(ctx)
	m.Close()
	if err := cluster.Down(ctx, o.Layout, standbyReg("replica"), cluster.DownOptions{KeepData: true, Timeout: 10 * time.Second}); err != nil {
		t.Fatal(err)
	}
	pgtest.Exec(t, purl, "INSERT INTO t VALUES (4)")
	m2, err := Open(ctx, o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(m2.Close)
	e, _ = cluster.Get(o.Layout, standbyReg("replica"))
	sby = (&instanceAt{e.SocketDir, e.Port}).url()
	waitRows(t, sby, "4")
	for _, n := range []string{"b1", "b2"} {
		if err := m2.Delete(ctx, me, n); err != nil {
			t.Error(err)
		}
	}
}

func ptr(f *float64) any {
	if f == nil {
		return nil
	}
	return *f
}

type instanceAt struct {
	socket string
	port   int
}

func (i *instanceAt) url() string {
	return "postgresql://postgres@/postgres?host=" + i.socket + "&port=" + strconv.Itoa(i.port)
}

// TestDiskQuota: a token's branches' own bytes (not shared with their
// snapshot) count against its disk quota: once one of two branches wrote
// more than the room left, its next create is refused (Permission, as
// the branch-count quota) and leaves nothing; another token still
// creates; the listing shows each owner's use.
func TestDiskQuota(t *testing.T) {
	ctx := context.Background()
	m := open(t, env(t))
	alice, bob := Caller{Token: "alice"}, Caller{Token: "bob"}
	var a1 Branch
	for _, n := range []string{"a1", "a2"} {
		b, err := m.Create(ctx, alice, CreateOptions{Name: n, Source: "prod"})
		if err != nil {
			t.Fatal(err)
		}
		if n == "a1" {
			a1 = b
		}
	}
	u := m.List(alice).Usage
	if len(u) != 1 || u[0].Owner != Owner("alice") || u[0].Branches != 2 {
		t.Fatalf("alice's usage: %+v", u)
	}
	// Room for 32 MiB more than the two fresh branches use.
	m.o.MaxOwnBytes = u[0].OwnBytes + 32<<20
	pgtest.Exec(t, a1.URL(), "CREATE TABLE big AS SELECT g, repeat('x', 200) AS pad FROM generate_series(1, 300000) g", "CHECKPOINT")
	u = m.List(alice).Usage
	if u[0].OwnBytes < m.o.MaxOwnBytes || u[0].MaxOwnBytes != m.o.MaxOwnBytes {
		t.Fatalf("after writing ~70 MiB alice's usage is %+v, want over the quota %d", u, m.o.MaxOwnBytes)
	}
	_, err := m.Create(ctx, alice, CreateOptions{Name: "a3", Source: "prod"})
	wantKind(t, "a create over the disk quota", err, errs.Permission)
	if err != nil && !strings.Contains(err.Error(), "disk quota") {
		t.Errorf("refusal %q does not say it is the disk quota", err)
	}
	if _, err := os.Stat(m.branchDir("a3")); err == nil {
		t.Error("the refused branch left a data directory")
	}
	if _, err := m.Create(ctx, bob, CreateOptions{Name: "b1", Source: "prod"}); err != nil {
		t.Errorf("bob is refused by alice's disk use: %v", err)
	}
	if u := m.List(Caller{Token: "admin"}).Usage; len(u) != 3 {
		t.Errorf("the admin's listing has usage %+v, want admin, alice and bob", u)
	}
}

// TestLeaveStopped: with LeaveStopped, branches stopped with serve come
// back listed stopped (not started) after a restart; Start runs one on its
// port with its data and password; Stop stops it again, and a branch so
// stopped stays stopped across a restart without LeaveStopped too; a
// stopped branch cannot be snapshotted.
func TestLeaveStopped(t *testing.T) {
	t.Parallel() // see env
	ctx := context.Background()
	o := env(t)
	o.LeaveStopped = true
	m := open(t, o)
	me := Caller{Token: "me"}
	b, err := m.Create(ctx, me, CreateOptions{Name: "kept", Source: "prod"})
	if err != nil {
		t.Fatal(err)
	}
	pgtest.Exec(t, b.URL(), "INSERT INTO seed VALUES (2)")
	reopen := func(leave bool) {
		t.Helper()
		m.StopAll(ctx)
		m.Close()
		o.LeaveStopped = leave
		var err error
		if m, err = Open(ctx, o); err != nil {
			t.Fatal(err)
		}
	}
	stateOf := func() string {
		t.Helper()
		g, err := m.Get(me, "kept")
		if err != nil {
			t.Fatal(err)
		}
		return g.State
	}
	reopen(true)
	t.Cleanup(func() { _ = m.Delete(ctx, me, "kept"); m.Close() })
	if st := stateOf(); st != "stopped" {
		t.Errorf("after a restart with LeaveStopped the branch is %q, want stopped", st)
	}
	if err := tryQuery(b.URL()); err == nil {
		t.Error("the branch left stopped accepts connections")
	}
	_, err = m.CreateSnapshot(ctx, me, SnapshotOptions{Name: "s", Branch: "kept"})
	wantKind(t, "a snapshot of a stopped branch", err, errs.Busy)
	if _, err := m.Start(ctx, me, "kept"); err != nil {
		t.Fatal(err)
	}
	if got := pgtest.Query(t, b.URL(), "SELECT count(*) FROM seed"); got != "2" || stateOf() != "ready" {
		t.Errorf("started: %s rows, state %s; want 2 rows and ready", got, stateOf())
	}
	if _, err := m.Stop(ctx, me, "kept"); err != nil {
		t.Fatal(err)
	}
	if err := tryQuery(b.URL()); err == nil || stateOf() != "stopped" {
		t.Errorf("after Stop the branch is %s and answers (%v)", stateOf(), err)
	}
	m.ExpireIdle(ctx, time.Nanosecond)
	if _, err := m.Get(me, "kept"); err != nil {
		t.Fatalf("a stopped branch was deleted as idle: %v", err)
	}
	reopen(false)
	if st := stateOf(); st != "stopped" {
		t.Errorf("a branch stopped by Stop is %q after a restart that starts branches", st)
	}
	if _, err := m.Start(ctx, me, "kept"); err != nil {
		t.Fatal(err)
	}
	if got := pgtest.Query(t, b.URL(), "SELECT count(*) FROM seed"); got != "2" {
		t.Errorf("started again: %s rows", got)
	}
}
