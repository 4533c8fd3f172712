package pool_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgfork/pgfork/instance"
	"github.com/pgfork/pgfork/internal/errs"
	"github.com/pgfork/pgfork/internal/pgtest"
	"github.com/pgfork/pgfork/pool"
)

type pg struct {
	inst  *instance.Instance
	admin *pgxpool.Pool
}

func (s *pg) url(db string) string { return s.inst.ConnString("postgres", db) }

// startPG starts a throw-away PostgreSQL (test profile) for one test.
func startPG(t *testing.T) *pg {
	t.Helper()
	s := &pg{inst: pgtest.New(t, pgtest.Server{Settings: map[string]string{"max_connections": "200"}})}
	var err error
	s.admin, err = pgxpool.New(context.Background(), s.url("postgres"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.admin.Close)
	return s
}

func (s *pg) exec(t testing.TB, db, sql string) error {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c, err := pgx.Connect(ctx, s.url(db))
	if err != nil {
		return err
	}
	defer c.Close(context.Background())
	_, err = c.Exec(ctx, sql)
	return err
}

func (s *pg) mustExec(t testing.TB, db, sql string) {
	t.Helper()
	if err := s.exec(t, db, sql); err != nil {
		t.Fatalf("%s on %s: %v", sql, db, err)
	}
}

func (s *pg) databases(t testing.TB, prefix string) map[string]bool {
	t.Helper()
	rows, err := s.admin.Query(context.Background(), "SELECT datname FROM pg_database WHERE starts_with(datname, $1)", prefix)
	if err != nil {
		t.Fatal(err)
	}
	names, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	m := map[string]bool{}
	for _, n := range names {
		m[n] = true
	}
	return m
}

func newPool(t *testing.T, s *pg, cfg pool.Config) *pool.Pool {
	t.Helper()
	cr := &pool.SQLCreator{Admin: s.admin, Strategy: pool.StrategyAuto}
	if err := cr.Probe(context.Background()); err != nil {
		t.Fatal(err)
	}
	if cfg.Template == "" {
		cfg.Template = "tpl"
		s.mustExec(t, "postgres", "CREATE DATABASE tpl")
		s.mustExec(t, "tpl", "CREATE TABLE items(id int); INSERT INTO items VALUES (1)")
	}
	if cfg.Name == nil {
		cfg.Name = func(id int) string { return fmt.Sprintf("t_%03d", id) }
	}
	cfg.Hash = "h"
	p := pool.New(cfg, cr)
	t.Cleanup(func() { _ = p.Close(context.Background(), true) })
	return p
}

func acquire(t *testing.T, p *pool.Pool, d time.Duration) pool.DB {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	db, err := p.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	return db
}

func TestPoolStateMachine(t *testing.T) {
	s := startPG(t)
	p := newPool(t, s, pool.Config{Initial: 1, Max: 2})

	a := acquire(t, p, 30*time.Second)
	if st := p.Stats(); st.ByState[pool.InUse] != 1 {
		t.Fatalf("after acquire: %+v", st)
	}
	s.mustExec(t, a.Name, "CREATE TABLE _marker()")
	// Unlock: the same database comes back as is.
	if err := p.Unlock(a.ID); err != nil {
		t.Fatal(err)
	}
	if err := p.Unlock(a.ID); err != nil { // twice is harmless
		t.Fatal(err)
	}
	seen := map[int]pool.DB{}
	for len(seen) < 2 {
		d := acquire(t, p, 30*time.Second)
		seen[d.ID] = d
	}
	b := seen[a.ID]
	if b.Generation != a.Generation {
		t.Fatalf("unlock changed the generation: %d -> %d", a.Generation, b.Generation)
	}
	if err := s.exec(t, b.Name, "CREATE TABLE _marker()"); err == nil {
		t.Fatal("unlocked database lost its content: unlock must give it back as is")
	}
	// Recreate: the database comes back fresh, with the next generation.
	if err := p.Recreate(a.ID); err != nil {
		t.Fatal(err)
	}
	for id := range seen {
		if id != a.ID {
			_ = p.Unlock(id)
		}
	}
	var c pool.DB
	for {
		// Acquire until the recreated database comes back (ids start at
		// 0, so a zero DB{} must not count as found).
		c = acquire(t, p, 30*time.Second)
		if c.ID == a.ID {
			break
		}
		defer p.Unlock(c.ID)
	}
	if c.Generation != a.Generation+1 {
		t.Fatalf("recreate: generation %d, want %d", c.Generation, a.Generation+1)
	}
	s.mustExec(t, c.Name, "CREATE TABLE _marker()") // fresh: no marker
	s.mustExec(t, c.Name, "SELECT count(*) FROM items")
	if err := p.Unlock(999); !errors.Is(err, pool.ErrTestNotFound) {
		t.Fatalf("unknown id: %v", err)
	}
}

func TestPoolTimeoutSaysWhy(t *testing.T) {
	s := startPG(t)
	p := newPool(t, s, pool.Config{Initial: 1, Max: 1})
	a := acquire(t, p, 30*time.Second)
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	start := time.Now()
	_, err := p.Acquire(ctx)
	if !errors.Is(err, pool.ErrTimeout) || errs.KindOf(err) != errs.Busy {
		t.Fatalf("want a Busy timeout, got %v", err)
	}
	if time.Since(start) > 5*time.Second {
		t.Fatalf("timeout took %s", time.Since(start))
	}
	t.Logf("timeout error: %v (hint: %s)", err, errs.HintOf(err))
	if got := err.Error(); !strings.Contains(got, "1 in use") || !strings.Contains(got, "at most 1") {
		t.Fatalf("reason missing from %q", got)
	}
	// Giving the database back serves the next waiter.
	done := make(chan pool.DB)
	go func() { done <- acquire(t, p, 30*time.Second) }()
	time.Sleep(50 * time.Millisecond)
	if err := p.Unlock(a.ID); err != nil {
		t.Fatal(err)
	}
	if b := <-done; b.ID != a.ID {
		t.Fatalf("waiter got %d, want %d", b.ID, a.ID)
	}
}

// TestPoolNeverHandsOutTwice runs parallel holders that each create a marker
// table in the database they get (failing if it exists), then either drop it
// and unlock (the database is reused as is) or leave it and recreate (the next
// holder must get a fresh copy). A marker found on acquisition means the
// database was handed out twice at once, or a recreate did not make it fresh.
func TestPoolNeverHandsOutTwice(t *testing.T) {
	s := startPG(t)
	p := newPool(t, s, pool.Config{Initial: 4, Max: 8, Parallel: 2})
	const workers, per = 12, 15
	var (
		mu      sync.Mutex
		holders = map[int]int{}
	)
	var wg sync.WaitGroup
	errc := make(chan error, workers)
	for w := 0; w < workers; w++ {
		wg.Add(1)
		go func(w int) {
			defer wg.Done()
			r := rand.New(rand.NewPCG(uint64(w), 7))
			for i := 0; i < per; i++ {
				ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
				db, err := p.Acquire(ctx)
				cancel()
				if err != nil {
					errc <- err
					return
				}
				mu.Lock()
				if h, ok := holders[db.ID]; ok {
					mu.Unlock()
					errc <- fmt.Errorf("db %d handed to worker %d while worker %d holds it", db.ID, w, h)
					return
				}
				holders[db.ID] = w
				mu.Unlock()
				if err := s.exec(t, db.Name, "CREATE TABLE _pgfork_marker()"); err != nil {
					errc <- fmt.Errorf("db %s gen %d: marker: %w", db.Name, db.Generation, err)
					return
				}
				unlock := r.IntN(2) == 0
				if unlock {
					if err := s.exec(t, db.Name, "DROP TABLE _pgfork_marker"); err != nil {
						errc <- err
						return
					}
				}
				mu.Lock()
				delete(holders, db.ID)
				mu.Unlock()
				if unlock {
					err = p.Unlock(db.ID)
				} else {
					err = p.Recreate(db.ID)
				}
				if err != nil {
					errc <- err
					return
				}
			}
		}(w)
	}
	wg.Wait()
	close(errc)
	for err := range errc {
		t.Error(err)
	}
	st := p.Stats()
	if st.ByState[pool.InUse] != 0 || st.Total > 8 {
		t.Fatalf("leaked or overgrown: %+v", st)
	}
	if err := p.Close(context.Background(), true); err != nil {
		t.Fatal(err)
	}
	if left := s.databases(t, "t_"); len(left) != 0 {
		t.Fatalf("databases left after close: %v", left)
	}
}

// TestPoolReclaim: with the pool full and a waiter, a database in use for
// longer than MinLifetime (and with no session) is reclaimed under a new
// id; the old id is retired.
func TestPoolReclaim(t *testing.T) {
	s := startPG(t)
	p := newPool(t, s, pool.Config{Initial: 1, Max: 1, MinLifetime: 100 * time.Millisecond})
	a := acquire(t, p, 30*time.Second)
	s.mustExec(t, a.Name, "CREATE TABLE _marker()")
	b := acquire(t, p, 30*time.Second)
	if b.ID == a.ID {
		t.Fatalf("reclaimed database kept its id %d", a.ID)
	}
	s.mustExec(t, b.Name, "CREATE TABLE _marker()") // fresh
	if err := p.Unlock(a.ID); !errors.Is(err, pool.ErrTestNotFound) {
		t.Fatalf("unlock of a retired id: %v", err)
	}
	if dbs := s.databases(t, "t_"); dbs[a.Name] {
		t.Fatalf("reclaimed database %s still exists", a.Name)
	}
}

// TestManagerRestartAndLimit: finalized templates survive a restart without
// re-running migrations, leftover test databases are dropped, and the
// global limit evicts the least recently used idle pool.
func TestManagerRestartAndLimit(t *testing.T) {
	s := startPG(t)
	ctx := context.Background()
	cr := &pool.SQLCreator{Admin: s.admin}
	_ = cr.Probe(ctx)
	cfg := pool.ManagerConfig{Prefix: "pft", Initial: 2, Max: 3, MaxDatabases: 3, GetTimeout: 30 * time.Second}
	m, err := pool.NewManager(cfg, s.admin, cr)
	if err != nil {
		t.Fatal(err)
	}
	if err := m.Open(ctx); err != nil {
		t.Fatal(err)
	}
	tpl, err := m.InitializeTemplate(ctx, "aaa")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := m.InitializeTemplate(ctx, "aaa"); !errors.Is(err, pool.ErrTemplateExists) {
		t.Fatalf("second initialize: %v", err)
	}
	s.mustExec(t, tpl.Database, "CREATE TABLE migrated(x int)")
	if err := m.FinalizeTemplate(ctx, "aaa"); err != nil {
		t.Fatal(err)
	}
	a, err := m.GetTestDatabase(ctx, "aaa")
	if err != nil {
		t.Fatal(err)
	}
	if err := m.Unlock(ctx, "aaa", a.ID); err != nil {
		t.Fatal(err)
	}
	waitFor(t, func() bool { ts, _ := m.Stats(); return ts[0].Pool.ByState[pool.Ready] >= 2 })

	// Pool B needs room: A is idle and least recently used, so it is evicted.
	tb, _ := m.InitializeTemplate(ctx, "bbb")
	s.mustExec(t, tb.Database, "CREATE TABLE other(x int)")
	if err := m.FinalizeTemplate(ctx, "bbb"); err != nil {
		t.Fatal(err)
	}
	b, err := m.GetTestDatabase(ctx, "bbb")
	if err != nil {
		t.Fatal(err)
	}
	waitFor(t, func() bool {
		ts, total := m.Stats()
		return ts[0].Pool.Total == 0 && ts[1].Pool.Total >= 2 && total <= 3
	})
	if n := len(s.databases(t, "pft_test_")); n > 3 {
		t.Fatalf("%d test databases exist, limit 3", n)
	}
	_ = b

	// "Crash": stop the old manager without cleaning up, start a new one.
	_ = m.Stop(ctx)
	m2, _ := pool.NewManager(cfg, s.admin, cr)
	if err := m2.Open(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := m2.InitializeTemplate(ctx, "aaa"); !errors.Is(err, pool.ErrTemplateExists) {
		t.Fatalf("finalized template did not come back: %v", err)
	}
	c, err := m2.GetTestDatabase(ctx, "aaa")
	if err != nil {
		t.Fatal(err)
	}
	s.mustExec(t, c.Name, "SELECT x FROM migrated")
	if err := m2.DiscardTemplate(ctx, "bbb"); err != nil {
		t.Fatal(err)
	}
	if _, err := m2.GetTestDatabase(ctx, "bbb"); !errors.Is(err, pool.ErrTemplateDiscarded) {
		t.Fatalf("discarded: %v", err)
	}
	if err := m2.ResetAll(ctx); err != nil {
		t.Fatal(err)
	}
	if left := s.databases(t, "pft_"); len(left) != 0 {
		t.Fatalf("left after reset: %v", left)
	}
}

func waitFor(t *testing.T, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatal("condition not reached within 30s")
		}
		time.Sleep(20 * time.Millisecond)
	}
}
