package pool_test

import (
	"context"
	"fmt"
	"runtime"
	"sort"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgfork/pgfork/pool"
	"github.com/pgfork/pgfork/pool/dbstore"
)

// BenchmarkSecondRun measures issue 33's target for a suite run again on
// the same serve: a CI-shaped suite (PGFORK_BENCH_TESTS tests, default 80,
// on 4 workers; each test connects to its database, writes a row, updates
// 49 of the template's, commits, and gives it back for recreation) against
// its floor (each worker reusing one database: no isolation), side by side
// on one server: the first run on a fresh template, the second on the same
// manager, the third after a restart (a new manager over the same state).
// Two contenders: the pool growing toward demand by misses only, as
// before (LearnDemand off), and the pool filling ahead to the demand it
// learned (LearnDemand on). Sizes are serve's defaults (DefaultSizes) on
// this machine. Sub-benchmarks: PostgreSQL 18 on the XFS reflink mount
// with file_copy_method = clone, PostgreSQL 15 there (full copies).
// PGFORK_BENCH_TEMPLATE_MB sizes the template (default 20). Run:
//
//	go test -run '^$' -bench SecondRun -benchtime 1x ./pool/
func BenchmarkSecondRun(b *testing.B) {
	mb := envInt("PGFORK_BENCH_TEMPLATE_MB", 20)
	tests := envInt("PGFORK_BENCH_TESTS", 80)
	const workers = 4
	for _, major := range []string{"18", "15"} {
		b.Run("pg"+major, func(b *testing.B) {
			bin := binFor(b, major)
			s := startBenchPG(b, bin, major)
			clone := major >= "18"
			for _, learn := range []bool{false, true} {
				cr := &dbstore.SQLCreator{Admin: s.admin, CanClone: clone}
				if err := cr.Probe(context.Background()); err != nil {
					b.Fatal(err)
				}
				prefix := fmt.Sprintf("pfb%v", learn)[:5]
				cfg := pool.DefaultSizes(cr.SharesBlocks(), runtime.NumCPU()).Apply(pool.ManagerConfig{Prefix: prefix, GetTimeout: 5 * time.Minute}, pool.Given{})
				cfg.LearnDemand = learn
				open := func() *pool.Manager {
					m, err := pool.NewManager(cfg, dbstore.New(s.admin, cr))
					if err != nil {
						b.Fatal(err)
					}
					if err := m.Open(context.Background()); err != nil {
						b.Fatal(err)
					}
					return m
				}
				m := open()
				const hash = "ci"
				tpl, err := m.InitializeTemplate(context.Background(), hash)
				if err != nil {
					b.Fatal(err)
				}
				s.mustExec(b, tpl.Database, fmt.Sprintf("CREATE TABLE items AS SELECT g AS id, repeat('x', 200) AS pad FROM generate_series(1, %d) g; CREATE INDEX ON items(id)", mb*3500))
				if err := m.FinalizeTemplate(context.Background(), hash); err != nil {
					b.Fatal(err)
				}
				settle := func(m *pool.Manager) {
					time.Sleep(pool.DefaultRunGap + 200*time.Millisecond) // the run ends
					pollUntil(b, func() bool {
						ts, _ := m.Stats()
						st := ts[0].Pool
						return st.ByState[pool.Creating]+st.ByState[pool.Dirty]+st.ByState[pool.Recreating] == 0 && st.ByState[pool.Ready] >= st.Base &&
							st.Dropping == 0
					})
				}
				settle(m)
				floor := floorSuite(b, s, m, hash, workers, tests)
				settle(m)
				first := ciSuite(b, s, m, hash, workers, tests)
				settle(m)
				second := ciSuite(b, s, m, hash, workers, tests)
				if err := m.Close(context.Background()); err != nil {
					b.Fatal(err)
				}
				m = open()
				settle(m)
				ts, _ := m.Stats()
				readyAfter := ts[0].Pool.ByState[pool.Ready]
				third := ciSuite(b, s, m, hash, workers, tests)
				ts, _ = m.Stats()
				b.Logf("PostgreSQL %s, %d MB template, %d tests on %d workers, learn demand %v (Initial %d, Max %d, Parallel %d): floor %s; "+
					"first run %s; second run on the same serve %s; after a restart (%d ready at start) %s; pool now %+v",
					major, dbMB(b, s, tpl.Database), tests, workers, learn, cfg.Initial, cfg.Max, cfg.Parallel, floor.String(floor),
					first.String(floor), second.String(floor), readyAfter, third.String(floor), ts[0].Pool)
				tag := map[bool]string{false: "grow", true: "learn"}[learn]
				b.ReportMetric(second.suite.Seconds()/floor.suite.Seconds(), tag+"-second-x-floor")
				b.ReportMetric(third.suite.Seconds()/floor.suite.Seconds(), tag+"-restart-x-floor")
				b.ReportMetric(float64(second.quantile(0.5).Microseconds())/1000, tag+"-second-p50-ms")
				b.ReportMetric(float64(third.quantile(0.99).Microseconds())/1000, tag+"-restart-p99-ms")
				if err := m.DiscardTemplate(context.Background(), hash); err != nil {
					b.Fatal(err)
				}
				_ = m.Close(context.Background())
			}
		})
	}
}

type suiteRun struct {
	suite time.Duration
	waits []time.Duration // per test: hand-out + give back (the floor: none)
}

func (r suiteRun) quantile(q float64) time.Duration {
	if len(r.waits) == 0 {
		return 0
	}
	return r.waits[min(int(q*float64(len(r.waits))), len(r.waits)-1)]
}

func (r suiteRun) String(floor suiteRun) string {
	return fmt.Sprintf("%s (%.2fx floor, wait p50 %s p99 %s)", r.suite.Round(time.Millisecond), r.suite.Seconds()/floor.suite.Seconds(),
		r.quantile(0.5).Round(100*time.Microsecond), r.quantile(0.99).Round(100*time.Microsecond))
}

// ciTest is one test: connect, write a row, update 49 of the template's,
// commit.
func ciTest(ctx context.Context, url string, i int) error {
	c, err := pgx.Connect(ctx, url)
	if err != nil {
		return err
	}
	defer c.Close(context.Background())
	_, err = c.Exec(ctx, fmt.Sprintf("BEGIN; CREATE TABLE t%d (v text); INSERT INTO t%d VALUES ('row'); UPDATE items SET pad = 'y' WHERE id <= 49; COMMIT", i, i))
	return err
}

func runWorkers(b *testing.B, workers, tests int, one func(i int) (time.Duration, error)) suiteRun {
	b.Helper()
	var mu sync.Mutex
	var run suiteRun
	next := make(chan int, tests)
	for i := range tests {
		next <- i
	}
	close(next)
	errc := make(chan error, workers)
	t0 := time.Now()
	for range workers {
		go func() {
			for i := range next {
				w, err := one(i)
				if err != nil {
					errc <- err
					return
				}
				mu.Lock()
				run.waits = append(run.waits, w)
				mu.Unlock()
			}
			errc <- nil
		}()
	}
	for range workers {
		if err := <-errc; err != nil {
			b.Fatal(err)
		}
	}
	run.suite = time.Since(t0)
	sort.Slice(run.waits, func(i, j int) bool { return run.waits[i] < run.waits[j] })
	return run
}

// ciSuite runs the suite with a fresh database per test.
func ciSuite(b *testing.B, s *pg, m *pool.Manager, hash string, workers, tests int) suiteRun {
	ctx := context.Background()
	return runWorkers(b, workers, tests, func(i int) (time.Duration, error) {
		t0 := time.Now()
		db, err := m.GetTestDatabase(ctx, hash)
		if err != nil {
			return 0, err
		}
		got := time.Since(t0)
		if err := ciTest(ctx, s.url(db.Name), i); err != nil {
			return 0, err
		}
		t1 := time.Now()
		err = m.Recreate(ctx, hash, db.ID)
		return got + time.Since(t1), err
	})
}

// floorSuite runs the suite with one database per worker, taken before.
func floorSuite(b *testing.B, s *pg, m *pool.Manager, hash string, workers, tests int) suiteRun {
	ctx := context.Background()
	dbs := make(chan pool.TestDatabase, workers)
	var held []pool.TestDatabase
	for range workers {
		db, err := m.GetTestDatabase(ctx, hash)
		if err != nil {
			b.Fatal(err)
		}
		dbs <- db
		held = append(held, db)
	}
	run := runWorkers(b, workers, tests, func(i int) (time.Duration, error) {
		db := <-dbs
		defer func() { dbs <- db }()
		return 0, ciTest(ctx, s.url(db.Name), i)
	})
	for _, db := range held {
		_ = m.Recreate(ctx, hash, db.ID)
	}
	return run
}

func dbMB(t testing.TB, s *pg, name string) int64 {
	var n int64
	if err := s.admin.QueryRow(context.Background(), "SELECT pg_database_size($1)", name).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n >> 20
}
