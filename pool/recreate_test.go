package pool_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgfork/pgfork/pool"
)

// TestPoolRecreateRenamesAway (issue 33): a recreation renames the used
// copy away and makes the fresh one under the same id and name at once;
// the used copies are dropped once no creation is on the way, and none is
// left behind, by the dropper or by Close.
func TestPoolRecreateRenamesAway(t *testing.T) {
	s := startPG(t)
	const n = 3
	p := newPool(t, s, pool.Config{Initial: n, Max: n, Parallel: 2, IdleTimeout: -1})
	var dbs []pool.DB
	for range n {
		db := acquire(t, p, 30*time.Second)
		s.mustExec(t, db.Name, "CREATE TABLE used(x int)")
		dbs = append(dbs, db)
	}
	for _, db := range dbs {
		if err := p.Recreate(db.ID); err != nil {
			t.Fatal(err)
		}
	}
	waitFor(t, func() bool { st := p.Stats(); return st.ByState[pool.Ready] == n && st.Dropping == 0 })
	byID := map[int]pool.DB{}
	for range n {
		db := acquire(t, p, 30*time.Second)
		byID[db.ID] = db
	}
	for _, old := range dbs {
		db, ok := byID[old.ID]
		if !ok || db.Name != old.Name || db.Generation != old.Generation+1 {
			t.Fatalf("recreated %+v came back as %+v (all: %v)", old, db, byID)
		}
		s.mustExec(t, db.Name, "CREATE TABLE used(x int)") // fresh
	}
	// Only the pool's databases exist: every used copy was dropped.
	if got := s.databases(t, "t_"); len(got) != n {
		t.Fatalf("databases after the drops: %v", got)
	}

	// Recreate them again and close at once: Close drops the used copies
	// still waiting too.
	for _, db := range byID {
		if err := p.Recreate(db.ID); err != nil {
			t.Fatal(err)
		}
	}
	if err := p.Close(context.Background(), true); err != nil {
		t.Fatal(err)
	}
	if got := s.databases(t, "t_"); len(got) != 0 {
		t.Fatalf("left after Close: %v", got)
	}
}

// TestPoolRecreateWaitsForHolder: a database given back while its holder
// is still connected is recreated as soon as the holder disconnects (the
// rename is retried with a short backoff, not polled every 50 ms and more),
// and the holder's connection is never cut.
func TestPoolRecreateWaitsForHolder(t *testing.T) {
	s := startPG(t)
	p := newPool(t, s, pool.Config{Initial: 1, Max: 1, IdleTimeout: -1})
	db := acquire(t, p, 30*time.Second)
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, s.url(db.Name))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := conn.Exec(ctx, "CREATE TABLE used(x int)"); err != nil {
		t.Fatal(err)
	}
	if err := p.Recreate(db.ID); err != nil {
		t.Fatal(err)
	}
	time.Sleep(300 * time.Millisecond)
	if st := p.Stats(); st.ByState[pool.Ready] != 0 {
		t.Fatalf("recreated while its holder was connected: %+v", st)
	}
	if _, err := conn.Exec(ctx, "INSERT INTO used VALUES (1)"); err != nil {
		t.Fatalf("the holder's connection was cut: %v", err)
	}
	_ = conn.Close(ctx)
	start := time.Now()
	again := acquire(t, p, 30*time.Second)
	took := time.Since(start)
	t.Logf("ready %s after the holder left", took.Round(time.Millisecond))
	if again.ID != db.ID || again.Generation != db.Generation+1 {
		t.Fatalf("got %+v after recreating %+v", again, db)
	}
	s.mustExec(t, again.Name, "CREATE TABLE used(x int)")
	if took > 5*time.Second {
		t.Errorf("recreation took %s after the holder left", took)
	}
}

// TestPoolCreatesOverLeftover: a database left under a pool's name (a
// crash, a failed drop) does not stop the pool: the creation that finds
// the name taken drops it and creates again.
func TestPoolCreatesOverLeftover(t *testing.T) {
	s := startPG(t)
	s.mustExec(t, "postgres", "CREATE DATABASE t_000")
	s.mustExec(t, "t_000", "CREATE TABLE leftover(x int)")
	p := newPool(t, s, pool.Config{Initial: 1, Max: 1})
	db := acquire(t, p, 30*time.Second)
	if db.Name != "t_000" {
		t.Fatalf("got %+v", db)
	}
	if err := s.exec(t, db.Name, "SELECT * FROM leftover"); err == nil || !strings.Contains(err.Error(), "leftover") {
		t.Fatalf("the leftover database was handed out: %v", err)
	}
	s.mustExec(t, db.Name, "SELECT count(*) FROM items")
}

// TestPoolUsedCopiesBounded: under a long run of recreations the used
// copies waiting for their drop never exceed Max, and once the run ends
// they are all dropped.
func TestPoolUsedCopiesBounded(t *testing.T) {
	s := startPG(t)
	const size = 2
	p := newPool(t, s, pool.Config{Initial: size, Max: size, Parallel: 2, IdleTimeout: -1})
	stop := make(chan struct{})
	worst := 0
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			select {
			case <-stop:
				return
			case <-time.After(time.Millisecond):
			}
			worst = max(worst, p.Stats().Dropping)
		}
	}()
	_, took := runSuite(t, p, 2, 8)
	close(stop)
	<-done
	t.Logf("16 recreations in %s; at most %d used copies waited for their drop", took.Round(time.Millisecond), worst)
	if worst > size {
		t.Errorf("%d used copies waited for their drop, more than Max %d", worst, size)
	}
	waitFor(t, func() bool { st := p.Stats(); return st.Dropping == 0 && st.ByState[pool.Ready] == size })
	if got := s.databases(t, "t_"); len(got) != size {
		t.Fatalf("databases after the run: %v", got)
	}
}
