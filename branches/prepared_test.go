package branches

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/pgfork/pgfork/cluster"
	"github.com/pgfork/pgfork/internal/errs"
	"github.com/pgfork/pgfork/internal/pgtest"
	"github.com/pgfork/pgfork/internal/statedir"
	"github.com/pgfork/pgfork/internal/testenv"
)

// wantPrepared checks that snapshot name is cleanly shut down and that
// branch started from it without replaying WAL (its log, which begins
// with its own start, says no "redo starts").
func wantPrepared(t *testing.T, m *Manager, snap, branch string) {
	t.Helper()
	out, err := exec.Command(m.o.Installation.Tool("pg_controldata"), m.snapDir(snap)).CombinedOutput()
	if err != nil {
		t.Fatalf("pg_controldata %s: %v: %s", snap, err, out)
	}
	if !strings.Contains(string(out), "Database cluster state:               shut down\n") {
		t.Errorf("snapshot %s is not cleanly shut down:\n%s", snap, out)
	}
	log, err := os.ReadFile(filepath.Join(m.branchDir(branch), "pgfork-server.log"))
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(string(log), "redo starts") || strings.Contains(string(log), "redo done") {
		t.Errorf("branch %s replayed WAL when it started:\n%s", branch, log)
	}
}

// TestPreparedSnapshots: a branch made from a running source starts
// without WAL replay (its snapshot is recovered once and shut down
// cleanly), and so does each reset; with SourceMaxAge, creates from one
// source share one snapshot (parallel ones wait for it), which goes with
// the last branch using it; a create after it is too old takes a new one
// that has the source's newer rows.
func TestPreparedSnapshots(t *testing.T) {
	t.Parallel() // see env
	ctx := context.Background()
	o := env(t)
	m := open(t, o)
	me := Caller{Token: "me"}
	b1, err := m.Create(ctx, me, CreateOptions{Name: "b1", Source: "prod"})
	if err != nil {
		t.Fatal(err)
	}
	wantPrepared(t, m, b1.Snapshot, "b1")
	pgtest.Exec(t, b1.URL(), "DELETE FROM seed")
	if _, err := m.Reset(ctx, me, "b1"); err != nil {
		t.Fatal(err)
	}
	if got := pgtest.Query(t, b1.URL(), "SELECT count(*) FROM seed"); got != "1" {
		t.Errorf("after reset seed has %s rows, want 1", got)
	}
	wantPrepared(t, m, b1.Snapshot, "b1")
	// A snapshot of a branch is prepared too.
	if _, err := m.CreateSnapshot(ctx, me, SnapshotOptions{Name: "s1", Branch: "b1"}); err != nil {
		t.Fatal(err)
	}
	c1, err := m.Create(ctx, me, CreateOptions{Name: "c1", Snapshot: "s1"})
	if err != nil {
		t.Fatal(err)
	}
	wantPrepared(t, m, c1.Snapshot, "c1")
	if err := m.Delete(ctx, me, "c1"); err != nil {
		t.Fatal(err)
	}
	if err := m.Delete(ctx, me, "b1"); err != nil {
		t.Fatal(err)
	}
	m.Close()

	o.SourceMaxAge = time.Hour
	m = open(t, o)
	var wg sync.WaitGroup
	made := make([]Branch, 3)
	for i := range made {
		wg.Go(func() {
			var err error
			if made[i], err = m.Create(ctx, me, CreateOptions{Name: "p" + string(rune('1'+i)), Source: "prod"}); err != nil {
				t.Error(err)
			}
		})
	}
	wg.Wait()
	if t.Failed() {
		t.FailNow()
	}
	if made[0].Snapshot != made[1].Snapshot || made[1].Snapshot != made[2].Snapshot {
		t.Fatalf("parallel creates took snapshots %s, %s, %s, want one shared", made[0].Snapshot, made[1].Snapshot, made[2].Snapshot)
	}
	shared := made[0].Snapshot
	wantPrepared(t, m, shared, "p2")
	for _, n := range []string{"p1", "p2"} {
		if err := m.Delete(ctx, me, n); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := os.Stat(m.snapDir(shared)); err != nil {
		t.Fatalf("the shared snapshot went while p3 uses it: %v", err)
	}
	if _, err := m.Reset(ctx, me, "p3"); err != nil {
		t.Fatal(err)
	}
	wantPrepared(t, m, shared, "p3")
	// Too old: a new snapshot, with the source's newer row.
	pgtest.Exec(t, o.Sources[0].ConnString, "INSERT INTO seed VALUES (2)")
	m.mu.Lock()
	m.snapshot(shared).Created = time.Now().Add(-2 * time.Hour)
	m.mu.Unlock()
	p4, err := m.Create(ctx, me, CreateOptions{Name: "p4", Source: "prod"})
	if err != nil {
		t.Fatal(err)
	}
	if p4.Snapshot == shared {
		t.Error("a create shared a snapshot older than SourceMaxAge")
	}
	if got := pgtest.Query(t, p4.URL(), "SELECT count(*) FROM seed"); got != "2" {
		t.Errorf("the new branch has %s rows, want the source's 2", got)
	}
	if err := m.Delete(ctx, me, "p3"); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(m.snapDir(shared)); !os.IsNotExist(err) {
		t.Errorf("the shared snapshot outlived its last branch: %v", err)
	}

	// A create waiting for the snapshot another create makes gives up
	// when its request is cancelled, and leaves nothing behind.
	m.mu.Lock()
	turn := m.building["prod"]
	m.mu.Unlock()
	turn <- struct{}{} // another create's turn, held
	wctx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
	t0 := time.Now()
	_, err = m.Create(wctx, me, CreateOptions{Name: "w1", Source: "prod"})
	cancel()
	<-turn
	if errs.KindOf(err) != errs.Interrupted || time.Since(t0) > time.Minute { // not its 300 ms, but no wait for the snapshot either, however loaded the machine
		t.Errorf("a cancelled create waiting for the shared snapshot: %v after %s, want Interrupted at once", err, time.Since(t0))
	}
	for _, b := range m.List(Caller{Token: "admin"}).Branches {
		if b.Name == "w1" {
			t.Errorf("the cancelled create left branch w1 (%s)", b.State)
		}
	}
}

// TestStandbyPrimarySettings: a primary started with max_wal_senders
// (and max_connections) above its configuration file's gets a standby
// that starts (a hot standby refuses values below its primary's), and a
// branch of it starts from a prepared snapshot.
func TestStandbyPrimarySettings(t *testing.T) {
	t.Parallel() // see env
	ctx := context.Background()
	b := pgtest.Builds(t, 0)[0]
	dir := testenv.XFSDir(t)
	src := filepath.Join(dir, "primary")
	pgtest.InitDB(t, src, pgtest.Server{BinDir: b.Bin})
	in := pgtest.Start(t, src, pgtest.Server{BinDir: b.Bin, Settings: map[string]string{"wal_level": "replica",
		"full_page_writes": "on", "max_wal_senders": "23", "max_connections": "120"}})
	purl := in.ConnString("", "")
	pgtest.Exec(t, purl, "CREATE TABLE t (id int)", "INSERT INTO t VALUES (1)")
	o := Options{Layout: statedir.Layout{Root: filepath.Join(dir, "state")}, Installation: b.Inst, User: b.User,
		Sources: []Source{{Name: "replica", Kind: SourceStandby, PrimaryURL: purl}}, AdminTokens: []string{"admin"}}
	t.Cleanup(func() {
		_ = cluster.Down(ctx, o.Layout, standbyReg("replica"), cluster.DownOptions{Timeout: 10 * time.Second})
	})
	m := open(t, o)
	e, err := cluster.Get(o.Layout, standbyReg("replica"))
	if err != nil {
		t.Fatal(err)
	}
	sby := (&instanceAt{e.SocketDir, e.Port}).url()
	if got := pgtest.Query(t, sby, "SHOW max_wal_senders"); got != "23" {
		t.Errorf("the standby's max_wal_senders is %s, want the primary's 23", got)
	}
	br, err := m.Create(ctx, Caller{Token: "me"}, CreateOptions{Name: "b1", Source: "replica"})
	if err != nil {
		t.Fatal(err)
	}
	if got := pgtest.Query(t, br.URL(), "SELECT count(*) FROM t"); got != "1" {
		t.Errorf("the branch has %s rows, want 1", got)
	}
	wantPrepared(t, m, br.Snapshot, "b1")
}
