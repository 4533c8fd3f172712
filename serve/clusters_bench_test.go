package serve_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"runtime/pprof"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/pgfork/pgfork/internal/testenv"
	"github.com/pgfork/pgfork/pool"
	"github.com/pgfork/pgfork/serve"
)

// BenchmarkManagedCopies measures issue 33's suite through the managed
// mode on the XFS image with the first PostgreSQL of the test environment
// (15), each way of making test copies side by side: CREATE DATABASE in
// the managed server (databases) and a reflink copy of the template's
// cluster per test (clusters). The suite: PGFORK_BENCH_TESTS tests
// (default 80) on 4 workers, a template of PGFORK_BENCH_ROWS rows (default
// 740,000: ~187 MB), every test connects, creates and fills a table and
// updates 49 rows of the template's; per test, the wait is the hand-out
// plus the give-back (Manager calls, no HTTP). Reported: the floor (each
// worker reuses one database), the first run right after the template's
// finalize, and a second run on the same serve, as multiples of the floor,
// with the waits' p50 and p99. PGFORK_BENCH_COPIES picks one way,
// PGFORK_BENCH_POOL_MAX and PGFORK_BENCH_PARALLEL give pool sizes (as
// --pool-max and --parallel would); PGFORK_BENCH_PROFILE names a file for
// a CPU profile of the first run alone (go tool pprof; with both ways, one
// file each, the way's name appended). Run:
//
//	go test -run '^$' -bench ManagedCopies -benchtime 1x ./serve/
func BenchmarkManagedCopies(b *testing.B) {
	tests := envInt("PGFORK_BENCH_TESTS", 80)
	rows := envInt("PGFORK_BENCH_ROWS", 740000)
	modes := []string{serve.CopiesDatabases, serve.CopiesClusters}
	if m := os.Getenv("PGFORK_BENCH_COPIES"); m != "" {
		modes = []string{m}
	}
	for _, mode := range modes {
		b.Run(mode, func(b *testing.B) {
			root := filepath.Join(testenv.XFSDir(b), "state")
			ctx := context.Background()
			o := managedOptions(b, root)
			o.Copies = mode
			o.Manager = pool.ManagerConfig{Prefix: "pfbn"}
			o.DB.Given = &pool.Given{}
			if n := envInt("PGFORK_BENCH_POOL_MAX", 0); n > 0 {
				o.Manager.Max, o.DB.Given.Max = n, true
			}
			if n := envInt("PGFORK_BENCH_PARALLEL", 0); n > 0 {
				o.Manager.Parallel, o.DB.Given.Parallel = n, true
			}
			be, err := serve.NewManaged(ctx, o)
			if err != nil {
				b.Fatal(err)
			}
			defer be.Close(context.Background())
			b.Logf("%s: %s", mode, be.Sized)
			tpl, err := be.Manager.InitializeTemplate(ctx, "suite")
			if err != nil {
				b.Fatal(err)
			}
			c := connectAs(ctx, b, be.Conn, tpl.Endpoint)
			if _, err := c.Exec(ctx, fmt.Sprintf("CREATE TABLE big AS SELECT g AS id, repeat(md5(g::text), 6) AS v FROM generate_series(1, %d) g; CREATE INDEX ON big(id)", rows)); err != nil {
				b.Fatal(err)
			}
			c.Close(ctx)
			if err := be.Manager.FinalizeTemplate(ctx, "suite"); err != nil {
				b.Fatal(err)
			}
			stop := profileFirstRun(b, len(modes) > 1, mode)
			first, w1 := suiteRun(ctx, b, be, tests)
			stop()
			r0 := time.Now()
			for time.Since(r0) < 2*time.Minute {
				ts, _ := be.Manager.Stats()
				if len(ts) == 1 && ts[0].Pool.ByState[pool.Ready] >= min(tests, ts[0].Pool.Target) {
					break
				}
				time.Sleep(100 * time.Millisecond)
			}
			ts, _ := be.Manager.Stats()
			b.Logf("pool refilled in %v: %+v", time.Since(r0).Round(time.Millisecond), ts[0].Pool)
			second, w2 := suiteRun(ctx, b, be, tests)
			floor := floorRun(ctx, b, be, tests)
			b.Logf("%s, PostgreSQL %d, %d tests on 4 workers, %d rows, %d cores, load %s: floor %v; first run %v (%.2fx, wait p50 %v p99 %v); second run %v (%.2fx, wait p50 %v p99 %v)",
				mode, o.PG.Major, tests, rows, runtime.NumCPU(), loadAvg(), floor.Round(time.Millisecond),
				first.Round(time.Millisecond), first.Seconds()/floor.Seconds(), q(w1, 0.5), q(w1, 0.99),
				second.Round(time.Millisecond), second.Seconds()/floor.Seconds(), q(w2, 0.5), q(w2, 0.99))
			b.ReportMetric(first.Seconds()/floor.Seconds(), "first/floor")
			b.ReportMetric(second.Seconds()/floor.Seconds(), "second/floor")
		})
	}
}

// profileFirstRun starts a CPU profile into PGFORK_BENCH_PROFILE, when set
// (with ".<mode>" appended when several ways run, so that none overwrites
// another's), and returns what stops it.
func profileFirstRun(b *testing.B, several bool, mode string) func() {
	path := os.Getenv("PGFORK_BENCH_PROFILE")
	if path == "" {
		return func() {}
	}
	if several {
		path += "." + mode
	}
	f, err := os.Create(path)
	if err != nil {
		b.Fatal(err)
	}
	if err := pprof.StartCPUProfile(f); err != nil {
		b.Fatal(err)
	}
	return func() {
		pprof.StopCPUProfile()
		if err := f.Close(); err != nil {
			b.Error(err)
		}
		b.Logf("CPU profile of the first run in %s", path)
	}
}

func envInt(name string, def int) int {
	if n, err := strconv.Atoi(os.Getenv(name)); err == nil && n > 0 {
		return n
	}
	return def
}

func loadAvg() string {
	b, _ := os.ReadFile("/proc/loadavg")
	if len(b) > 14 {
		return string(b[:14])
	}
	return string(b)
}

func q(s []time.Duration, p float64) time.Duration {
	if len(s) == 0 {
		return 0
	}
	slices.Sort(s)
	return s[min(len(s)-1, int(float64(len(s))*p))].Round(100 * time.Microsecond)
}

const benchTest = "CREATE TABLE %s(id int primary key, v text); INSERT INTO %s SELECT g, 'x' FROM generate_series(1, 100) g; UPDATE big SET v = 'y' WHERE id < 50"

func runTest(ctx context.Context, b *testing.B, be *serve.Backend, ep pool.Endpoint, table string) {
	c := connectAs(ctx, b, be.Conn, ep)
	defer c.Close(ctx)
	if _, err := c.Exec(ctx, fmt.Sprintf(benchTest, table, table)); err != nil {
		b.Fatal(err)
	}
}

// suiteRun runs the suite with a fresh database per test: its time and
// each test's wait (hand-out and give-back).
func suiteRun(ctx context.Context, b *testing.B, be *serve.Backend, tests int) (time.Duration, []time.Duration) {
	var (
		next  atomic.Int64
		mu    sync.Mutex
		waits []time.Duration
		gets  []time.Duration
		wg    sync.WaitGroup
	)
	t0 := time.Now()
	for range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for next.Add(1) <= int64(tests) {
				g0 := time.Now()
				db, err := be.Manager.GetTestDatabase(ctx, "suite")
				if err != nil {
					b.Error(err)
					return
				}
				got := time.Since(g0)
				runTest(ctx, b, be, db.Endpoint, "t")
				r0 := time.Now()
				if err := be.Manager.Recreate(ctx, "suite", db.ID); err != nil {
					b.Error(err)
					return
				}
				mu.Lock()
				waits = append(waits, got+time.Since(r0))
				gets = append(gets, got)
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	b.Logf("hand-outs alone: p50 %v p99 %v", q(gets, 0.5), q(gets, 0.99))
	return time.Since(t0), waits
}

// floorRun is the suite with no isolation: each worker takes one database
// and runs its share of the tests in it.
func floorRun(ctx context.Context, b *testing.B, be *serve.Backend, tests int) time.Duration {
	var dbs []pool.TestDatabase
	for range 4 {
		db, err := be.Manager.GetTestDatabase(ctx, "suite")
		if err != nil {
			b.Fatal(err)
		}
		dbs = append(dbs, db)
	}
	var (
		next atomic.Int64
		wg   sync.WaitGroup
	)
	t0 := time.Now()
	for _, db := range dbs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := next.Add(1); i <= int64(tests); i = next.Add(1) {
				runTest(ctx, b, be, db.Endpoint, fmt.Sprintf("t%d", i))
			}
		}()
	}
	wg.Wait()
	return time.Since(t0)
}
