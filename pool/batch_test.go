package pool_test

import (
	"context"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/pgfork/pgfork/internal/pgtest"
	"github.com/pgfork/pgfork/internal/statedir"
	"github.com/pgfork/pgfork/internal/testenv"
	"github.com/pgfork/pgfork/pgbin"
	"github.com/pgfork/pgfork/pool"
	"github.com/pgfork/pgfork/pool/clusterstore"
)

// TestManagerStartsNoBatchAheadOfAFirstRun (issue 60): on a store whose
// copies come in batches (cloned clusters holding 4 test databases each),
// a template's first run, whose size the pool cannot know, starts a
// cluster only for a test that waits with nothing on the way for it: 16
// tests one after the other, 4 databases ready when the run begins, start 3
// clusters during the run, not 4 or more (the pool used to keep its
// reserve ready or on the way all through the run, and recreate every
// database given back at once: a cluster or two the run never used, each
// a copy of the template's cluster and a server started). The databases
// given back wait for the run's end, and then the pool fills up to what
// the run took. Nor are the copies made during the run read ahead (their
// tests take them at once); those made between runs are.
func TestManagerStartsNoBatchAheadOfAFirstRun(t *testing.T) {
	dir := testenv.XFSDir(t)
	pg, err := pgbin.Find(pgbin.Options{Explicit: testenv.PGBinDirs(t)[0]}, 0)
	if err != nil {
		t.Fatal(err)
	}
	const slots, initial, tests = 4, 4, 16
	cs, err := clusterstore.New(clusterstore.Options{Dir: filepath.Join(dir, "clusters"), Layout: statedir.Layout{Root: filepath.Join(dir, "state")},
		PG: pg, User: pgtest.User(t), Lean: true, OwnName: true, Slots: slots, SharesBlocks: true})
	if err != nil {
		t.Fatal(err)
	}
	st := &prewarmRecorder{Store: cs, prewarmed: map[string]bool{}}
	// Runs end when the test says so (EndRun), not after a time that a
	// loaded machine could stretch a step past.
	m, err := pool.NewManager(pool.ManagerConfig{Initial: initial, Max: 64, Parallel: 4, LearnDemand: true, NoPersist: true,
		RunGap: time.Hour, GetTimeout: testenv.WaitTimeout, FinalizeTimeout: testenv.WaitTimeout}, st)
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close(context.Background())
	if err := m.Open(context.Background()); err != nil {
		t.Fatal(err)
	}
	const hash = "batches"
	ctx := context.Background()
	if _, err := m.InitializeTemplate(ctx, hash); err != nil {
		t.Fatal(err)
	}
	if err := m.FinalizeTemplate(ctx, hash); err != nil {
		t.Fatal(err)
	}
	settled := func() bool {
		s := poolStats(t, m, hash)
		return s.ByState[pool.Creating] == 0 && s.ByState[pool.Recreating] == 0
	}
	testenv.WaitFor(t, "the pool to make its databases ready", func() bool {
		return settled() && poolStats(t, m, hash).ByState[pool.Ready] == initial
	})
	before := st.Started()
	st.reset()
	// One test at a time, each holding its database until the pool has
	// made what it makes meanwhile: so some are made while nobody waits.
	for range tests {
		db, err := m.GetTestDatabase(ctx, hash)
		if err != nil {
			t.Fatal(err)
		}
		testenv.WaitFor(t, "the pool's creations to end", settled)
		if err := m.Recreate(ctx, hash, db.ID); err != nil {
			t.Fatal(err)
		}
	}
	testenv.WaitFor(t, "the run's creations to end", settled)
	if got, want := st.Started()-before, (tests-initial+slots-1)/slots; got > want {
		t.Errorf("the first run started %d clusters of %d test databases; its %d tests, %d ready when it began, need %d", got, slots, tests, initial, want)
	}
	if n := st.count(); n > 0 {
		t.Errorf("%d copies made during the first run were read ahead: its next tests take them at once", n)
	}
	endRun(t, m, hash)
	testenv.WaitFor(t, "the pool to fill up to what the run took", func() bool {
		s := poolStats(t, m, hash)
		return settled() && s.ByState[pool.Ready] >= tests && s.ByState[pool.Dirty] == 0
	})
	if st.count() == 0 {
		t.Error("no copy made between runs was read ahead")
	}
}

// prewarmRecorder is a cluster store that notes the copies it reads ahead.
type prewarmRecorder struct {
	*clusterstore.Store
	mu        sync.Mutex
	prewarmed map[string]bool
}

func (r *prewarmRecorder) Prewarm(ctx context.Context, name, strategy string) {
	r.mu.Lock()
	r.prewarmed[name] = true
	r.mu.Unlock()
	r.Store.Prewarm(ctx, name, strategy)
}

func (r *prewarmRecorder) reset() {
	r.mu.Lock()
	defer r.mu.Unlock()
	clear(r.prewarmed)
}

func (r *prewarmRecorder) count() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.prewarmed)
}
