package pool_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/pgfork/pgfork/internal/testenv"
	"github.com/pgfork/pgfork/pool"
	"github.com/pgfork/pgfork/pool/dbstore"
)

// TestManagerDropsUsedCopiesDuringRun (issue 58): in a run whose rest the
// ready databases cover, the recreations wait for the run's end, but the
// used copies given back do not: they are dropped as they come back,
// during the run, so that a serve stopped right after its run (the
// clients' glue stops it a second after the last test, before the run's
// end) has none of them left to drop. The names stay the pool's until
// the run's end recreates them.
//
// Before, every used copy of such a run stayed under its name until the
// run's end: all of them were left to the stop's drop budget.
func TestManagerDropsUsedCopiesDuringRun(t *testing.T) {
	s := startPG(t)
	ctx := context.Background()
	const hash, n = "duc", 6
	// Runs end when the test says so (EndRun).
	cfg := pool.ManagerConfig{Prefix: "pdu", Initial: 1, Max: 12, Parallel: 2, LearnDemand: true,
		RunGap: time.Hour, IdleTimeout: -1, GetTimeout: 30 * time.Second}
	m := openManager(t, s, cfg)
	t.Cleanup(func() { _ = m.Close(context.Background()) })
	readyTemplate(t, s, m, hash)
	managerSuite(t, m, hash, 2, n)
	endRun(t, m, hash)
	waitFor(t, func() bool {
		st := poolStats(t, m, hash)
		return st.Demand == n && st.ByState[pool.Ready] >= n && st.Dropping == 0
	})
	var names []string
	for range n {
		db, err := m.GetTestDatabase(ctx, hash)
		if err != nil {
			t.Fatal(err)
		}
		s.mustExec(t, db.Name, "INSERT INTO items VALUES (2)")
		if err := m.Recreate(ctx, hash, db.ID); err != nil {
			t.Fatal(err)
		}
		names = append(names, db.Name)
	}
	// The run goes on (no EndRun): its used copies go all the same.
	testenv.WaitFor(t, "the run's used copies to be dropped during the run", func() bool {
		have := s.databases(t, "pdu_test_")
		for _, name := range names {
			if have[name] {
				return false
			}
		}
		return true
	})
	if st := poolStats(t, m, hash); st.ByState[pool.Dirty] != n {
		t.Fatalf("during the run: %+v, want the %d given back waiting for its end", st, n)
	}
	// The run ends: each is made again under its name, fresh.
	endRun(t, m, hash)
	waitFor(t, func() bool { return poolStats(t, m, hash).ByState[pool.Ready] >= n })
	for range n {
		db, err := m.GetTestDatabase(ctx, hash)
		if err != nil {
			t.Fatal(err)
		}
		if got := pgtestQuery(t, s, db.Name, "SELECT count(*) FROM items"); got != 1 {
			t.Errorf("%s after the run's end: %d rows, want the template's 1", db.Name, got)
		}
	}
}

// blockingCreates holds the creations of the names in hold until release
// is closed, and records every drop; the rest goes to the real creator.
type blockingCreates struct {
	pool.Creator
	mu      sync.Mutex
	hold    bool
	held    chan string
	release chan struct{}
	dropped map[string]bool
}

func (c *blockingCreates) Create(ctx context.Context, name, template, owner string) (string, error) {
	c.mu.Lock()
	hold := c.hold
	c.mu.Unlock()
	if hold {
		c.held <- name
		<-c.release
	}
	return c.Creator.Create(ctx, name, template, owner)
}

func (c *blockingCreates) Drop(ctx context.Context, name string) error {
	err := c.Creator.Drop(ctx, name)
	c.mu.Lock()
	c.dropped[name] = true
	c.mu.Unlock()
	return err
}

func (c *blockingCreates) wasDropped(name string) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.dropped[name]
}

// TestPoolCloseDropsWhileCreating (issue 58): a pool closing while a copy
// is being made (a CREATE DATABASE is waited for, never cancelled) drops
// the databases no work touches at once, without waiting for it: the
// ones in use and those given back. A stopping serve gives its drops a
// budget of time; before, every drop waited for the creations under way,
// and a stop during a fill of full copies (0.5-1 s each under load)
// spent the whole budget waiting: "dropped 0 test databases; 26 left for
// the next start to drop".
func TestPoolCloseDropsWhileCreating(t *testing.T) {
	s := startPG(t)
	s.mustExec(t, "postgres", "CREATE DATABASE tpl")
	s.mustExec(t, "tpl", "CREATE TABLE items(id int)")
	cr := &dbstore.SQLCreator{Admin: s.admin, Strategy: dbstore.StrategyAuto}
	if err := cr.Probe(context.Background()); err != nil {
		t.Fatal(err)
	}
	bc := &blockingCreates{Creator: cr, held: make(chan string, 8), release: make(chan struct{}), dropped: map[string]bool{}}
	p := pool.New(pool.Config{Hash: "h", Template: "tpl", Name: func(id int) string { return fmt.Sprintf("tc_%03d", id) },
		Initial: 2, Max: 8, Parallel: 1, IdleTimeout: -1}, bc)
	var inUse []pool.DB
	for range 3 {
		inUse = append(inUse, acquire(t, p, time.Minute))
	}
	// The next creation is held: the pool is making a copy when it closes.
	bc.mu.Lock()
	bc.hold = true
	bc.mu.Unlock()
	if err := p.Recreate(inUse[2].ID); err != nil {
		t.Fatal(err)
	}
	creating := <-bc.held
	closed := make(chan error, 1)
	go func() { closed <- p.Close(context.Background(), true) }()
	testenv.WaitFor(t, "the databases in use to be dropped while a copy is being made", func() bool {
		return bc.wasDropped(inUse[0].Name) && bc.wasDropped(inUse[1].Name)
	})
	select {
	case err := <-closed:
		t.Fatalf("Close returned (%v) with a creation held", err)
	default:
	}
	close(bc.release)
	if err := <-closed; err != nil {
		t.Fatal(err)
	}
	if left := s.databases(t, "tc_"); len(left) != 0 {
		t.Fatalf("after Close: %v left (%s was being made)", left, creating)
	}
}
