package pool_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgfork/pgfork/pool"
	"github.com/pgfork/pgfork/pool/dbstore"
)

// openManager opens a Manager over a dbstore on s (a start of serve).
func openManager(t *testing.T, s *pg, cfg pool.ManagerConfig) *pool.Manager {
	t.Helper()
	cr := &dbstore.SQLCreator{Admin: s.admin}
	if err := cr.Probe(context.Background()); err != nil {
		t.Fatal(err)
	}
	m, err := pool.NewManager(cfg, dbstore.New(s.admin, cr))
	if err != nil {
		t.Fatal(err)
	}
	if err := m.Open(context.Background()); err != nil {
		t.Fatal(err)
	}
	return m
}

// readyTemplate initializes, migrates and finalizes template hash.
func readyTemplate(t *testing.T, s *pg, m *pool.Manager, hash string) {
	t.Helper()
	ctx := context.Background()
	tpl, err := m.InitializeTemplate(ctx, hash)
	if err != nil {
		t.Fatal(err)
	}
	s.mustExec(t, tpl.Database, "CREATE TABLE items(id int); INSERT INTO items VALUES (1)")
	if err := m.FinalizeTemplate(ctx, hash); err != nil {
		t.Fatal(err)
	}
}

func poolStats(t *testing.T, m *pool.Manager, hash string) pool.Stats {
	t.Helper()
	ts, _ := m.Stats()
	for _, x := range ts {
		if x.Hash == hash {
			return x.Pool
		}
	}
	t.Fatalf("no template %s", hash)
	return pool.Stats{}
}

// endRun ends the run of template hash's pool now (pool.Manager.EndRun).
func endRun(t *testing.T, m *pool.Manager, hash string) {
	t.Helper()
	if err := m.EndRun(hash); err != nil {
		t.Fatal(err)
	}
}

// managerSuite runs n tests on workers workers: each takes a database,
// and gives it back for recreation.
func managerSuite(t *testing.T, m *pool.Manager, hash string, workers, n int) {
	t.Helper()
	jobs := make(chan int, n)
	for i := range n {
		jobs <- i
	}
	close(jobs)
	errc := make(chan error, workers)
	for range workers {
		go func() {
			for range jobs {
				db, err := m.GetTestDatabase(context.Background(), hash)
				if err == nil {
					err = m.Recreate(context.Background(), hash, db.ID)
				}
				if err != nil {
					errc <- err
					return
				}
			}
			errc <- nil
		}()
	}
	for range workers {
		if err := <-errc; err != nil {
			t.Fatal(err)
		}
	}
}

// TestManagerDemandAcrossRestart: a pool learns how many fresh databases
// a run of its template took, fills up to that as soon as the run ends,
// and after a restart of serve fills up to it at once, before any test
// asks: the second run finds them ready.
func TestManagerDemandAcrossRestart(t *testing.T) {
	s := startPG(t)
	ctx := context.Background()
	const hash, n = "dem", 9
	cfg := pool.ManagerConfig{Prefix: "pfd", Initial: 1, Max: 12, Parallel: 2, LearnDemand: true,
		RunGap: time.Hour, GetTimeout: 30 * time.Second}
	m := openManager(t, s, cfg)
	readyTemplate(t, s, m, hash)
	managerSuite(t, m, hash, 3, n)
	endRun(t, m, hash) // not a time that a loaded machine can reach between two hand-outs
	waitFor(t, func() bool { st := poolStats(t, m, hash); return st.Demand == n && st.ByState[pool.Ready] >= n })
	if err := m.Close(ctx); err != nil {
		t.Fatal(err)
	}

	m2 := openManager(t, s, cfg)
	t.Cleanup(func() { _ = m2.Close(context.Background()) })
	waitFor(t, func() bool { return poolStats(t, m2, hash).ByState[pool.Ready] == n })
	if st := poolStats(t, m2, hash); st.Demand != n || st.Base != n {
		t.Fatalf("after a restart: %+v, want demand and base %d", st, n)
	}
	// The user's Initial wins: no learning, the pool keeps Initial.
	cfg.LearnDemand = false
	if err := m2.Close(ctx); err != nil {
		t.Fatal(err)
	}
	m3 := openManager(t, s, cfg)
	t.Cleanup(func() { _ = m3.Close(context.Background()) })
	waitFor(t, func() bool { return poolStats(t, m3, hash).ByState[pool.Ready] == 1 })
	time.Sleep(300 * time.Millisecond)
	if st := poolStats(t, m3, hash); st.Total != 1 || st.Base != 1 {
		t.Fatalf("with Initial given: %+v, want 1 database", st)
	}
}

// TestManagerDemandOfARunCutShort: a server stopped right after its tests
// (a client's auto-started serve stops when the run ends, well within
// RunGap) still learns what the run took: the next start fills to it.
func TestManagerDemandOfARunCutShort(t *testing.T) {
	s := startPG(t)
	ctx := context.Background()
	const hash, n = "cut", 7
	cfg := pool.ManagerConfig{Prefix: "pfc", Initial: 1, Max: 12, Parallel: 2, LearnDemand: true,
		RunGap: time.Hour, GetTimeout: 30 * time.Second}
	m := openManager(t, s, cfg)
	readyTemplate(t, s, m, hash)
	managerSuite(t, m, hash, 3, n)
	if st := poolStats(t, m, hash); st.Demand != 0 {
		t.Fatalf("the run has not ended (RunGap an hour), yet demand is %d", st.Demand)
	}
	if err := m.Close(ctx); err != nil {
		t.Fatal(err)
	}
	m2 := openManager(t, s, cfg)
	t.Cleanup(func() { _ = m2.Close(context.Background()) })
	waitFor(t, func() bool { return poolStats(t, m2, hash).ByState[pool.Ready] == n })
	if st := poolStats(t, m2, hash); st.Demand != n || st.Base != n {
		t.Fatalf("after a stop that cut the run short: %+v, want demand and base %d", st, n)
	}
}

// TestManagerKeptOutsideMax: databases kept for inspection leave the
// pool's count (hand-outs go on at Max), have a cap of their own (the
// oldest dropped beyond it), are counted in hand-outs and stay across a
// restart, their ids not reused.
func TestManagerKeptOutsideMax(t *testing.T) {
	s := startPG(t)
	ctx := context.Background()
	const hash = "kpt"
	cfg := pool.ManagerConfig{Prefix: "pfk", Initial: 1, Max: 2, Parallel: 2, KeptMax: 3, GetTimeout: time.Minute} // hand-outs wait for creations: the load decides how long
	m := openManager(t, s, cfg)
	readyTemplate(t, s, m, hash)
	var kept []pool.TestDatabase
	for range 4 {
		db, err := m.GetTestDatabase(ctx, hash)
		if err != nil {
			t.Fatalf("hand-out with %d kept at Max %d: %v", len(kept), cfg.Max, err)
		}
		s.mustExec(t, db.Name, "INSERT INTO items VALUES (42)")
		if err := m.Keep(ctx, hash, db.ID); err != nil {
			t.Fatal(err)
		}
		kept = append(kept, db)
	}
	// The oldest went beyond KeptMax 3.
	waitFor(t, func() bool { return !s.databases(t, "pfk_test_")[kept[0].Name] })
	for _, k := range kept[1:] {
		s.mustExec(t, k.Name, "SELECT 1 FROM items WHERE id = 42")
	}
	db, err := m.GetTestDatabase(ctx, hash)
	if err != nil {
		t.Fatal(err)
	}
	if db.Kept != 3 || db.KeptMax != 3 {
		t.Fatalf("hand-out says %d kept of %d; want 3 of 3", db.Kept, db.KeptMax)
	}
	if st := poolStats(t, m, hash); st.Total > cfg.Max || st.Kept != 3 {
		t.Fatalf("stats %+v: want at most %d in the pool, 3 kept", st, cfg.Max)
	}
	if err := m.Close(ctx); err != nil {
		t.Fatal(err)
	}

	m2 := openManager(t, s, cfg)
	t.Cleanup(func() { _ = m2.Close(context.Background()) })
	if st := poolStats(t, m2, hash); st.Kept != 3 {
		t.Fatalf("after a restart %d kept, want 3 (%v)", st.Kept, s.databases(t, "pfk_"))
	}
	for _, k := range kept[1:] {
		s.mustExec(t, k.Name, "SELECT 1 FROM items WHERE id = 42")
	}
	names := map[string]bool{}
	for _, k := range kept[1:] {
		names[k.Name] = true
	}
	for range 2 {
		db, err := m2.GetTestDatabase(ctx, hash)
		if err != nil {
			t.Fatal(err)
		}
		if names[db.Name] {
			t.Fatalf("kept database %s handed out again", db.Name)
		}
	}
	// Given back, a kept database is dropped.
	if err := m2.Recreate(ctx, hash, kept[1].ID); err != nil {
		t.Fatal(err)
	}
	waitFor(t, func() bool { return !s.databases(t, "pfk_test_")[kept[1].Name] })
	// Discarding the template drops what is kept.
	if err := m2.DiscardTemplate(ctx, hash); err != nil {
		t.Fatal(err)
	}
	if left := s.databases(t, "pfk_test_"); len(left) != 0 {
		t.Fatalf("left after discard: %v", left)
	}
	if _, err := m2.GetTestDatabase(ctx, hash); !errors.Is(err, pool.ErrTemplateDiscarded) {
		t.Fatal(err)
	}
}

// TestManagerMaxBySize: with MaxBySize a pool's Max comes from its
// template's size on the server (full copies take that much disk each);
// without it, or when it says 0, the configured Max stays.
func TestManagerMaxBySize(t *testing.T) {
	s := startPG(t)
	ctx := context.Background()
	var sizes []int64
	cfg := pool.ManagerConfig{Prefix: "pfs", Initial: 1, Max: 3, Parallel: 1, GetTimeout: 30 * time.Second,
		LearnDemand: true, RunGap: time.Hour, // runs end in missedRun
		MaxBySize: func(size int64) int {
			sizes = append(sizes, size)
			if size > 100<<20 {
				return 0 // "unknown": keeps Max
			}
			return 5
		}}
	m := openManager(t, s, cfg)
	t.Cleanup(func() { _ = m.Close(ctx) })
	readyTemplate(t, s, m, "small")
	if st := poolStats(t, m, "small"); st.Max != 5 {
		t.Fatalf("Max %d, want MaxBySize's 5", st.Max)
	}
	var want int64
	if err := s.admin.QueryRow(ctx, "SELECT pg_database_size('pfs_template_small')").Scan(&want); err != nil {
		t.Fatal(err)
	}
	if len(sizes) != 1 || sizes[0] != want || want < 1<<20 {
		t.Fatalf("MaxBySize saw %v, want the template's pg_database_size %d", sizes, want)
	}
	// A first run: misses grow the pool no further than the configured
	// Max (each creation beyond would copy the template while tests
	// wait); the demand it learned fills it up to MaxBySize's.
	missedRun(t, m, "small", 5, cfg.Max)

	tpl, err := m.InitializeTemplate(ctx, "big")
	if err != nil {
		t.Fatal(err)
	}
	s.mustExec(t, tpl.Database, "CREATE TABLE big AS SELECT g, repeat('x', 900) AS v FROM generate_series(1, 120000) g")
	if err := m.FinalizeTemplate(ctx, "big"); err != nil {
		t.Fatal(err)
	}
	if st := poolStats(t, m, "big"); st.Max != 3 {
		t.Fatalf("Max %d, want the configured 3 when MaxBySize says 0", st.Max)
	}
}

// missedRun takes n databases of template hash at once (a first run: each
// acquire misses), failing when misses grow the pool's target beyond
// growMax, gives them back for recreation, ends the run (EndRun: the
// pool's RunGap is longer than the test) and waits until the pool learned
// the run's demand and holds at least n ready, nothing under way.
func missedRun(t *testing.T, m *pool.Manager, hash string, n, growMax int) {
	t.Helper()
	ctx := context.Background()
	var held []pool.TestDatabase
	for range n {
		db, err := m.GetTestDatabase(ctx, hash)
		if err != nil {
			t.Fatal(err)
		}
		held = append(held, db)
		if st := poolStats(t, m, hash); st.Target > growMax {
			t.Fatalf("misses grew the target to %d, beyond %d: %+v", st.Target, growMax, st)
		}
	}
	for _, db := range held {
		if err := m.Recreate(ctx, hash, db.ID); err != nil {
			t.Fatal(err)
		}
	}
	endRun(t, m, hash)
	var last pool.Stats
	defer func() {
		if t.Failed() {
			t.Logf("last stats: %+v", last)
		}
	}()
	// At least n: while the run missed, the pool kept its grown target
	// ahead of the hand-outs, so one more than n may be ready until
	// IdleTimeout (how fast the test's acquires came decides it).
	waitFor(t, func() bool {
		last = poolStats(t, m, hash)
		return last.Demand == n && last.ByState[pool.Ready] >= n && last.Total == last.ByState[pool.Ready]
	})
}

// TestManagerLearnMax: a demand learned beyond Max fills the pool up to
// LearnMax, while misses grow its target only to Max (issue 33: suites of
// 200-300 writing tests were bounded by a Max sized for misses).
func TestManagerLearnMax(t *testing.T) {
	s := startPG(t)
	ctx := context.Background()
	cfg := pool.ManagerConfig{Prefix: "plm", Initial: 1, Max: 2, LearnMax: 6, Parallel: 1, GetTimeout: 30 * time.Second,
		LearnDemand: true, RunGap: time.Hour} // runs end in missedRun
	m := openManager(t, s, cfg)
	t.Cleanup(func() { _ = m.Close(ctx) })
	readyTemplate(t, s, m, "lm")
	if st := poolStats(t, m, "lm"); st.Max != 6 {
		t.Fatalf("Max %d, want LearnMax 6", st.Max)
	}
	missedRun(t, m, "lm", 5, cfg.Max)
	if st := poolStats(t, m, "lm"); st.Target != 5 || st.Total > 6 {
		t.Fatalf("after the run: %+v, want a target of the learned 5", st)
	}
}

// TestManagerDefersRecreationsWhileCovered: on a run after the first, the
// pool holds the demand it learned, ready; the databases the run gives
// back are recreated once it ends, not while its tests want the cores,
// also when the ready ones cover its rest exactly. A run that takes more
// than its demand (a miss) gets them recreated at once.
func TestManagerDefersRecreationsWhileCovered(t *testing.T) {
	s := startPG(t)
	ctx := context.Background()
	const hash, n = "dfr", 6
	// Runs end when the test says so (EndRun), not after a time that a
	// loaded machine can stretch a step beyond.
	cfg := pool.ManagerConfig{Prefix: "pfr", Initial: 1, Max: 12, Parallel: 2, LearnDemand: true,
		RunGap: time.Hour, IdleTimeout: 100 * time.Millisecond, GetTimeout: 30 * time.Second}
	m := openManager(t, s, cfg)
	t.Cleanup(func() { _ = m.Close(context.Background()) })
	readyTemplate(t, s, m, hash)
	managerSuite(t, m, hash, 2, n)
	endRun(t, m, hash)
	// The run ends, the pool learns n and settles at n ready (what it grew
	// beyond by misses is dropped after IdleTimeout).
	waitFor(t, func() bool {
		st := poolStats(t, m, hash)
		return st.Demand == n && st.Total == n && st.ByState[pool.Ready] == n && st.Target == n && st.Dropping == 0
	})
	for i := range n {
		db, err := m.GetTestDatabase(ctx, hash)
		if err != nil {
			t.Fatal(err)
		}
		if err := m.Recreate(ctx, hash, db.ID); err != nil {
			t.Fatal(err)
		}
		time.Sleep(50 * time.Millisecond) // a recreation started would be under way
		if st := poolStats(t, m, hash); st.ByState[pool.Dirty] != i+1 || st.Dropping != 0 {
			t.Fatalf("test %d of a run the ready ones cover: %+v, want %d given back and waiting, none recreated", i+1, st, i+1)
		}
	}
	// The run ends: all recreated.
	endRun(t, m, hash)
	waitFor(t, func() bool { st := poolStats(t, m, hash); return st.ByState[pool.Ready] == n && st.Dropping == 0 })

	// A run longer than the demand: the miss starts the recreations.
	var held []pool.TestDatabase
	for range n {
		db, err := m.GetTestDatabase(ctx, hash)
		if err != nil {
			t.Fatal(err)
		}
		held = append(held, db)
	}
	for _, db := range held {
		if err := m.Recreate(ctx, hash, db.ID); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := m.GetTestDatabase(ctx, hash); err != nil {
		t.Fatalf("one more than the demand: %v", err)
	}
}

// TestManagerRecreatesOnlyTheShortfall: a pool whose Max holds less than
// its learned demand (full copies sized by disk) recreates, during a run,
// only the databases the run will miss, counting those on the way as well
// as the ready ones; the other given-back ones wait for the run's end.
func TestManagerRecreatesOnlyTheShortfall(t *testing.T) {
	s := startPG(t)
	ctx := context.Background()
	const hash, demand, most = "sfl", 6, 4
	// Runs end when the test says so (EndRun): the recreations of the
	// shortfall take what time the machine's load gives them.
	cfg := pool.ManagerConfig{Prefix: "psf", Initial: 1, Max: most, Parallel: 2, LearnDemand: true,
		RunGap: time.Hour, IdleTimeout: 100 * time.Millisecond, GetTimeout: 30 * time.Second}
	m := openManager(t, s, cfg)
	t.Cleanup(func() { _ = m.Close(context.Background()) })
	readyTemplate(t, s, m, hash)
	managerSuite(t, m, hash, 2, demand)
	endRun(t, m, hash)
	settled := func(st pool.Stats) bool {
		return st.ByState[pool.Creating]+st.ByState[pool.Recreating]+st.ByState[pool.Dirty] == 0 && st.Dropping == 0
	}
	waitFor(t, func() bool {
		st := poolStats(t, m, hash)
		return st.Demand == demand && st.ByState[pool.Ready] == most && settled(st)
	})
	misses := poolStats(t, m, hash).Misses

	// The second run takes all four ready at once: two more are needed,
	// so two recreations start and two wait.
	for range most {
		db, err := m.GetTestDatabase(ctx, hash)
		if err != nil {
			t.Fatal(err)
		}
		if err := m.Recreate(ctx, hash, db.ID); err != nil {
			t.Fatal(err)
		}
	}
	shortfall := demand - most
	state := func(st pool.Stats) bool {
		return st.ByState[pool.Ready] == shortfall && st.ByState[pool.Dirty] == most-shortfall &&
			st.ByState[pool.Creating]+st.ByState[pool.Recreating] == 0
	}
	waitFor(t, func() bool { return state(poolStats(t, m, hash)) })
	time.Sleep(300 * time.Millisecond) // a recreation started late would be under way
	if st := poolStats(t, m, hash); !state(st) {
		t.Fatalf("after %d of a run of %d on a pool of %d: %+v, want %d recreated and %d waiting for the run's end",
			most, demand, most, st, shortfall, most-shortfall)
	}
	// The rest of the run finds them ready, and recreates nothing more.
	for range shortfall {
		db, err := m.GetTestDatabase(ctx, hash)
		if err != nil {
			t.Fatal(err)
		}
		if err := m.Recreate(ctx, hash, db.ID); err != nil {
			t.Fatal(err)
		}
	}
	st := poolStats(t, m, hash)
	if st.Misses != misses || st.ByState[pool.Dirty] != most || st.ByState[pool.Ready] != 0 {
		t.Fatalf("end of the run: %+v, want no miss (%d before) and all %d waiting for its end", st, misses, most)
	}
	// The run ends: all recreated.
	endRun(t, m, hash)
	waitFor(t, func() bool { st := poolStats(t, m, hash); return st.ByState[pool.Ready] == most && settled(st) })
}

// flushCounter is a database-isolation store that counts its flushes,
// notes the first error and whether one began during a run.
type flushCounter struct {
	pool.Store
	n, duringRun atomic.Int32
	inRun        atomic.Bool
	err          atomic.Value
}

func (f *flushCounter) Flush(ctx context.Context) error {
	f.n.Add(1)
	if f.inRun.Load() {
		f.duringRun.Add(1)
	}
	err := f.Store.(pool.Flusher).Flush(ctx)
	if err != nil {
		f.err.CompareAndSwap(nil, err)
	}
	return err
}

// TestManagerFlushesBetweenRuns: a pool writes the databases it made to
// disk (pool.Flusher) once it has settled after a run's end: not after its
// first fill (a run follows it at once), never while the run goes on,
// although its creations end then.
func TestManagerFlushesBetweenRuns(t *testing.T) {
	s := startPG(t)
	ctx := context.Background()
	cr := &dbstore.SQLCreator{Admin: s.admin}
	if err := cr.Probe(ctx); err != nil {
		t.Fatal(err)
	}
	if cr.DataDir() == "" {
		t.Fatal("the test server's data directory is not known: nothing to flush")
	}
	fc := &flushCounter{Store: dbstore.New(s.admin, cr)}
	const hash = "fls"
	// The run ends when the test says so (EndRun): its creations take
	// what time the machine's load gives them.
	m, err := pool.NewManager(pool.ManagerConfig{Prefix: "pfl", Initial: 2, Max: 8, Parallel: 2, LearnDemand: true,
		RunGap: time.Hour, GetTimeout: 30 * time.Second}, fc)
	if err != nil {
		t.Fatal(err)
	}
	if err := m.Open(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = m.Close(context.Background()) })
	readyTemplate(t, s, m, hash)
	settled := func(st pool.Stats) bool {
		return st.ByState[pool.Creating]+st.ByState[pool.Recreating]+st.ByState[pool.Dirty] == 0 && !st.Flushing
	}
	waitFor(t, func() bool { st := poolStats(t, m, hash); return st.ByState[pool.Ready] == 2 && settled(st) })
	time.Sleep(200 * time.Millisecond) // a flush started would have begun
	if n := fc.n.Load(); n != 0 {
		t.Fatalf("%d flushes after the first fill", n)
	}

	// A run takes the two ready and one more (a miss): the creations it
	// starts end while it holds them, and the pool settles during the run.
	fc.inRun.Store(true)
	var held []pool.TestDatabase
	for range 3 {
		db, err := m.GetTestDatabase(ctx, hash)
		if err != nil {
			t.Fatal(err)
		}
		held = append(held, db)
	}
	waitFor(t, func() bool { return settled(poolStats(t, m, hash)) })
	time.Sleep(200 * time.Millisecond) // a flush started would have begun
	for _, db := range held {
		if err := m.Recreate(ctx, hash, db.ID); err != nil {
			t.Fatal(err)
		}
	}
	fc.inRun.Store(false)
	if n := fc.duringRun.Load(); n != 0 {
		t.Fatalf("%d flushes began during the run", n)
	}
	endRun(t, m, hash)
	waitFor(t, func() bool {
		st := poolStats(t, m, hash)
		return st.Demand == 3 && fc.n.Load() == 1 && settled(st)
	})
	if err, _ := fc.err.Load().(error); err != nil {
		t.Fatalf("flush: %v", err)
	}
}

// oids returns the oids of the databases whose names start with prefix.
func (s *pg) oids(t *testing.T, prefix string) map[string]uint32 {
	t.Helper()
	rows, err := s.admin.Query(context.Background(), "SELECT datname, oid FROM pg_database WHERE starts_with(datname, $1)", prefix)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	out := map[string]uint32{}
	for rows.Next() {
		var n string
		var o uint32
		if err := rows.Scan(&n, &o); err != nil {
			t.Fatal(err)
		}
		out[n] = o
	}
	return out
}

// TestManagerReadyAcrossCleanStop: the fresh databases a pool has ready
// when the server stops cleanly stay, and the next start hands them out
// at once instead of making them again (zero setup's second run: issue
// 34); a database handed out and given back, or a stop that was a crash,
// leaves nothing for the next start to trust; a template discarded takes
// them with it.
func TestManagerReadyAcrossCleanStop(t *testing.T) {
	s := startPG(t)
	ctx := context.Background()
	const hash, n = "rdy", 3
	cfg := pool.ManagerConfig{Prefix: "pfy", Initial: n, Max: n, Parallel: 2, GetTimeout: 30 * time.Second}
	m := openManager(t, s, cfg)
	readyTemplate(t, s, m, hash)
	waitFor(t, func() bool { return poolStats(t, m, hash).ByState[pool.Ready] == n })
	// One handed out and given back as it is: not fresh, not left.
	db, err := m.GetTestDatabase(ctx, hash)
	if err != nil {
		t.Fatal(err)
	}
	s.mustExec(t, db.Name, "INSERT INTO items VALUES (7)")
	if err := m.Unlock(ctx, hash, db.ID); err != nil {
		t.Fatal(err)
	}
	waitFor(t, func() bool { return poolStats(t, m, hash).ByState[pool.Ready] == n })
	before := s.oids(t, "pfy_test_")
	if err := m.Close(ctx); err != nil {
		t.Fatal(err)
	}
	left := s.oids(t, "pfy_test_")
	if len(left) != n-1 || left[db.Name] != 0 {
		t.Fatalf("after a clean stop: %v, want the %d fresh ones of %v, not %s", left, n-1, before, db.Name)
	}

	// The next start, its pool no bigger than what was left: every
	// hand-out is one of them, none made again.
	cfg.Initial, cfg.Max = n-1, n-1
	m2 := openManager(t, s, cfg)
	if st := poolStats(t, m2, hash); st.ByState[pool.Ready] != n-1 || st.Total != n-1 {
		t.Fatalf("right after the next start: %+v, want the %d left ready", st, n-1)
	}
	for i := range n - 1 {
		got, err := m2.GetTestDatabase(ctx, hash)
		if err != nil {
			t.Fatal(err)
		}
		if left[got.Name] == 0 || s.oids(t, got.Name)[got.Name] != left[got.Name] {
			t.Fatalf("hand-out %d: %s, not one of those left %v", i, got.Name, left)
		}
		if v := pgtestQuery(t, s, got.Name, "SELECT count(*) FROM items WHERE id = 7"); v != 0 {
			t.Fatalf("%s holds what a test wrote in the unlocked database", got.Name)
		}
	}
	// A crash: what was ready is not trusted at the next start.
	giveBack := func() {
		for _, id := range []int{0, 1, 2} {
			_ = m2.Recreate(ctx, hash, id)
		}
	}
	giveBack()
	waitFor(t, func() bool { return poolStats(t, m2, hash).ByState[pool.Ready] == n-1 })
	crashed := s.oids(t, "pfy_test_")
	if err := m2.Stop(ctx); err != nil {
		t.Fatal(err)
	}
	m3 := openManager(t, s, cfg)
	t.Cleanup(func() { _ = m3.Close(context.Background()) })
	for name, oid := range s.oids(t, "pfy_test_") {
		if crashed[name] == oid {
			t.Fatalf("%s outlived a crash (oid %d)", name, oid)
		}
	}
	waitFor(t, func() bool { return poolStats(t, m3, hash).ByState[pool.Ready] == n-1 })
	if err := m3.DiscardTemplate(ctx, hash); err != nil {
		t.Fatal(err)
	}
	if left := s.databases(t, "pfy_test_"); len(left) != 0 {
		t.Fatalf("left after discard: %v", left)
	}
}

func pgtestQuery(t *testing.T, s *pg, db, sql string) int {
	t.Helper()
	conn, err := pgx.Connect(context.Background(), s.url(db))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	var n int
	if err := conn.QueryRow(context.Background(), sql).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}
