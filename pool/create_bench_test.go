package pool_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgfork/pgfork/internal/pgtest"
	"github.com/pgfork/pgfork/internal/testenv"
	"github.com/pgfork/pgfork/pool"
	"github.com/pgfork/pgfork/pool/dbstore"
)

// BenchmarkCreateRate measures issue 33's question: how many databases per
// second the pool makes against the bare rate of the same server, side by
// side in one run (the machine is shared: several rounds, medians).
//
//   - bare: c sessions each running CREATE DATABASE … STRATEGY FILE_COPY
//     and DROP DATABASE, n databases in all;
//   - create: a pool of n (Initial = Max = n, Parallel = c) filling up from
//     empty, through serve's store (advisor, tracking, every check);
//   - recreate: the same pool's n databases all given back for
//     recreation at once, until n are ready again (each a DROP and a
//     CREATE, as bare).
//
// Sub-benchmarks per server: PostgreSQL 18 on the XFS reflink mount with
// file_copy_method = clone, and PostgreSQL 15 there too (no clone: a full
// copy). PGFORK_BENCH_TEMPLATE_MB sizes the template (default 20),
// PGFORK_BENCH_ROUNDS the rounds (default 5). Run:
//
//	go test -run '^$' -bench CreateRate -benchtime 1x ./pool/
func BenchmarkCreateRate(b *testing.B) {
	mb := envInt("PGFORK_BENCH_TEMPLATE_MB", 20)
	rounds := envInt("PGFORK_BENCH_ROUNDS", 5)
	for _, major := range []string{"18", "15"} {
		b.Run("pg"+major, func(b *testing.B) {
			bin := binFor(b, major)
			s := startBenchPG(b, bin, major)
			s.mustExec(b, "postgres", "CREATE DATABASE tpl")
			s.mustExec(b, "tpl", fmt.Sprintf("CREATE TABLE items AS SELECT g AS id, repeat('x', 200) AS pad FROM generate_series(1, %d) g; CREATE INDEX ON items(id)", mb*3500))
			s.mustExec(b, "postgres", "ALTER DATABASE tpl ALLOW_CONNECTIONS false")
			s.mustExec(b, "postgres", "CHECKPOINT")
			for _, c := range []int{2, 4} {
				const n = 16
				var bare, bareBoth, direct, create, recreate []float64
				for range b.N * rounds {
					bc, bb := bareRate(b, s, c, n)
					bare, bareBoth = append(bare, bc), append(bareBoth, bb)
					direct = append(direct, storeRate(b, s, major == "18", c, n))
					cr, rr := poolRates(b, s, major == "18", c, n)
					create, recreate = append(create, cr), append(recreate, rr)
				}
				mb, mbb, md, mc, mr := median(bare), median(bareBoth), median(direct), median(create), median(recreate)
				b.Logf("PostgreSQL %s, %d MB template, concurrency %d, %d rounds of %d: bare CREATE %.1f db/s %v, CREATE+DROP %.1f db/s %v; store.Create %.1f db/s (%.2fx) %v; pool create %.1f db/s (%.2fx bare CREATE) %v; pool recreate %.1f db/s (%.2fx bare CREATE+DROP, %.2fx bare CREATE) %v",
					major, mbOf(b, s), c, rounds, n, mb, round1(bare), mbb, round1(bareBoth), md, md/mb, round1(direct), mc, mc/mb, round1(create), mr, mr/mbb, mr/mb, round1(recreate))
				b.ReportMetric(mb, fmt.Sprintf("bare-db/s-c%d", c))
				b.ReportMetric(mbb, fmt.Sprintf("bare-create+drop-db/s-c%d", c))
				b.ReportMetric(mc, fmt.Sprintf("create-db/s-c%d", c))
				b.ReportMetric(mr, fmt.Sprintf("recreate-db/s-c%d", c))
			}
		})
	}
}

func envInt(name string, def int) int {
	if n, err := strconv.Atoi(os.Getenv(name)); err == nil && n > 0 {
		return n
	}
	return def
}

func binFor(t testing.TB, major string) string {
	for _, d := range testenv.PGBinDirs(t) {
		if strings.Contains(d, "/"+major+"/") || strings.Contains(d, "/"+major+".") {
			return d
		}
	}
	t.Skipf("no PostgreSQL %s in the test environment", major)
	return ""
}

// startBenchPG starts a cluster of bin on the XFS reflink mount (with
// file_copy_method = clone on 18), as serve's managed cluster runs.
func startBenchPG(t testing.TB, bin, major string) *pg {
	t.Helper()
	settings := map[string]string{"max_connections": "200"}
	if major >= "18" {
		settings["file_copy_method"] = "clone"
	}
	srv := pgtest.Server{BinDir: bin, Settings: settings}
	data := filepath.Join(testenv.XFSDir(t), "data")
	pgtest.InitDB(t, data, srv)
	s := &pg{inst: pgtest.Start(t, data, srv)}
	var err error
	s.admin, err = pgxpool.New(context.Background(), s.url("postgres"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.admin.Close)
	return s
}

func mbOf(t testing.TB, s *pg) int64 {
	var n int64
	if err := s.admin.QueryRow(context.Background(), "SELECT pg_database_size('tpl')").Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n >> 20
}

// bareRate: c sessions make n databases in all with the bare CREATE
// DATABASE … STRATEGY FILE_COPY, then drop them with DROP DATABASE; it
// returns databases per second for the creations alone and for both (what
// a recreation does).
func bareRate(t testing.TB, s *pg, c, n int) (create, both float64) {
	t.Helper()
	ctx := context.Background()
	conns := make([]*pgx.Conn, c)
	for i := range conns {
		var err error
		if conns[i], err = pgx.Connect(ctx, s.url("postgres")); err != nil {
			t.Fatal(err)
		}
		defer conns[i].Close(ctx)
	}
	run := func(sql string) time.Duration {
		var next atomic.Int64
		var wg sync.WaitGroup
		errc := make(chan error, c)
		start := time.Now()
		for i := range c {
			wg.Add(1)
			go func(conn *pgx.Conn) {
				defer wg.Done()
				for {
					k := next.Add(1)
					if k > int64(n) {
						return
					}
					if _, err := conn.Exec(ctx, fmt.Sprintf(sql, k)); err != nil {
						errc <- err
						return
					}
				}
			}(conns[i])
		}
		wg.Wait()
		took := time.Since(start)
		close(errc)
		for err := range errc {
			t.Fatal(err)
		}
		return took
	}
	cr := run("CREATE DATABASE bare_%d TEMPLATE tpl STRATEGY FILE_COPY")
	dr := run("DROP DATABASE bare_%d")
	return float64(n) / cr.Seconds(), float64(n) / (cr + dr).Seconds()
}

// storeRate: c goroutines make n databases in all with serve's store
// (creator and tracking) without a pool, then drop them (not timed);
// databases per second.
func storeRate(t testing.TB, s *pg, canClone bool, c, n int) float64 {
	t.Helper()
	ctx := context.Background()
	admin, err := dbstore.OpenAdmin(ctx, s.url("postgres"), int32(2*c+8))
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close()
	cr := &dbstore.SQLCreator{Admin: admin, Strategy: dbstore.StrategyAuto, CanClone: canClone}
	if err := cr.Probe(ctx); err != nil {
		t.Fatal(err)
	}
	store := dbstore.New(admin, cr)
	if _, _, err := store.Recover(ctx, "bs", "bs_test_", true); err != nil {
		t.Fatal(err)
	}
	if _, err := store.Create(ctx, "bs_test_warm", "tpl", ""); err != nil { // the advisor's first look
		t.Fatal(err)
	}
	var next atomic.Int64
	var wg sync.WaitGroup
	errc := make(chan error, c)
	start := time.Now()
	for range c {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for k := next.Add(1); k <= int64(n); k = next.Add(1) {
				if _, err := store.Create(ctx, fmt.Sprintf("bs_test_%d", k), "tpl", ""); err != nil {
					errc <- err
					return
				}
			}
		}()
	}
	wg.Wait()
	took := time.Since(start)
	close(errc)
	for err := range errc {
		t.Fatal(err)
	}
	if _, _, err := store.Recover(ctx, "bs", "bs_test_", true); err != nil { // drops them
		t.Fatal(err)
	}
	return float64(n) / took.Seconds()
}

// poolRates: a pool of n databases through serve's store fills from
// empty (create rate), then all n are given back for recreation at once
// (recreate rate); databases per second.
func poolRates(t testing.TB, s *pg, canClone bool, c, n int) (create, recreate float64) {
	t.Helper()
	ctx := context.Background()
	admin, err := dbstore.OpenAdmin(ctx, s.url("postgres"), int32(2*c+8))
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close()
	cr := &dbstore.SQLCreator{Admin: admin, Strategy: dbstore.StrategyAuto, CanClone: canClone}
	if err := cr.Probe(ctx); err != nil {
		t.Fatal(err)
	}
	store := dbstore.New(admin, cr)
	if _, _, err := store.Recover(ctx, "bp", "bp_test_", true); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	p := pool.New(pool.Config{Hash: "h", Template: "tpl", Name: func(id int) string { return fmt.Sprintf("bp_test_%03d", id) },
		Initial: n, Max: n, Parallel: c, IdleTimeout: -1}, store)
	defer func() { _ = p.Close(ctx, true) }()
	ready := func() bool { st := p.Stats(); return st.ByState[pool.Ready] == n && st.Total == n }
	pollUntil(t, ready)
	create = float64(n) / time.Since(start).Seconds()
	var dbs []pool.DB
	for range n {
		db, err := p.Acquire(ctx)
		if err != nil {
			t.Fatal(err)
		}
		dbs = append(dbs, db)
	}
	start = time.Now()
	for _, db := range dbs {
		if err := p.Recreate(db.ID); err != nil {
			t.Fatal(err)
		}
	}
	pollUntil(t, ready)
	recreate = float64(n) / time.Since(start).Seconds()
	return create, recreate
}

// pollUntil polls every millisecond (a benchmark's resolution), for at
// most two minutes.
func pollUntil(t testing.TB, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(2 * time.Minute)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatal("not reached within 2 minutes")
		}
		time.Sleep(time.Millisecond)
	}
}

func median(xs []float64) float64 {
	s := slices.Clone(xs)
	slices.Sort(s)
	if len(s) == 0 {
		return 0
	}
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

func round1(xs []float64) []float64 {
	out := make([]float64, len(xs))
	for i, x := range xs {
		out[i] = float64(int(x*10+0.5)) / 10
	}
	return out
}
