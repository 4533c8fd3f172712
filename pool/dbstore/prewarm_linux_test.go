package dbstore

import (
	"context"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgfork/pgfork/instance"
	"github.com/pgfork/pgfork/internal/pgtest"
	"github.com/pgfork/pgfork/internal/testenv"
	"github.com/pgfork/pgfork/pgdata"
	"github.com/pgfork/pgfork/pool"
)

// resident is the fraction of the pages of the files in dir that are in
// the page cache (mincore): the system catalogs' with catalogs, else the
// others (relations of the template's own).
func resident(t *testing.T, dir string, catalogs bool) float64 {
	t.Helper()
	return testenv.Resident(t, dir, func(n string) bool { return pgdata.CatalogFile(n) == catalogs && (catalogs || relationFile(n)) })
}

// relationFile says whether name is a relation's file (a number, with an
// optional fork and segment).
func relationFile(name string) bool {
	base := name
	if i := strings.IndexAny(base, "._"); i >= 0 {
		base = base[:i]
	}
	n, err := strconv.Atoi(base)
	return err == nil && n > 0
}

// TestPrewarmReadsClonesAhead (issue 33): a database cloned on a reflink
// filesystem (PostgreSQL 18, file_copy_method = clone) is a new inode whose
// pages are not cached; the creator's Prewarm reads it ahead (a small one
// whole: the template's own table too), so the first test on it does not
// wait for them. A clone made by a bare CREATE DATABASE stays cold (what
// Prewarm changes).
func TestPrewarmReadsClonesAhead(t *testing.T) {
	dirs := testenv.RequireMajors(t, 2)
	bin := dirs[len(dirs)-1]
	data := filepath.Join(testenv.XFSDir(t), "data")
	srv := pgtest.Server{BinDir: bin, Settings: map[string]string{"file_copy_method": "clone"}}
	pgtest.InitDB(t, data, srv)
	if v, err := pgdata.Version(data); err != nil || v < 18 {
		t.Skipf("the newest PostgreSQL of the test environment is %d (%v): no clone", v, err)
	}
	inst := pgtest.Start(t, data, srv)
	ctx := context.Background()
	admin := adminWithTemplate(t, inst)
	tc, err := OpenAdmin(ctx, inst.ConnString("postgres", "tpl"), 1)
	if err != nil {
		t.Fatal(err)
	}
	_, err = tc.Exec(ctx, "CREATE TABLE items AS SELECT g, md5(g::text) AS v FROM generate_series(1, 20000) g")
	tc.Close()
	if err != nil {
		t.Fatal(err)
	}
	for _, sql := range []string{"CHECKPOINT", "CREATE DATABASE bare TEMPLATE tpl STRATEGY FILE_COPY"} {
		if _, err := admin.Exec(ctx, sql); err != nil {
			t.Fatal(err)
		}
	}
	cr := &SQLCreator{Admin: admin, Strategy: StrategyClone, CanClone: true}
	if err := cr.Probe(ctx); err != nil {
		t.Fatal(err)
	}
	got, err := cr.Create(ctx, "warm", "tpl", "")
	if err != nil || got != StrategyClone {
		t.Fatalf("create: %q, %v", got, err)
	}
	New(admin, cr).(pool.Prewarmer).Prewarm(ctx, "warm", got) // as the pool calls it: through the store
	dirOf := func(db string) string { return databaseDir(t, admin, data, db) }
	// Read-ahead is asynchronous: wait for it.
	for _, catalogs := range []bool{true, false} {
		what := map[bool]string{true: "catalog pages", false: "pages of the template's table"}[catalogs]
		var warm float64
		testenv.WaitFor(t, "the creator's clone's "+what+" to be read ahead", func() bool {
			warm = resident(t, dirOf("warm"), catalogs)
			return warm > 0.9
		})
		bare := resident(t, dirOf("bare"), catalogs)
		t.Logf("%s cached: %.0f%% of the creator's clone, %.0f%% of a bare CREATE DATABASE's", what, warm*100, bare*100)
		if warm < 0.9 || bare > 0.5 {
			t.Fatalf("%s cached: %.2f of the creator's clone (want ≥ 0.9), %.2f of a bare clone (want ≤ 0.5)", what, warm, bare)
		}
	}
}

// TestFinalizeWritesCatalogCache (issue 33): finalize leaves the template
// with its catalog cache file (pg_internal.init), which every FILE_COPY
// copy then carries, so a test's first connection need not build the
// caches, even when the template's migrations invalidated the file (here:
// VACUUM FULL pg_class, which gives pg_class a new file).
func TestFinalizeWritesCatalogCache(t *testing.T) {
	data := filepath.Join(testenv.Dir(t), "data")
	srv := pgtest.Server{BinDir: testenv.PGBinDirs(t)[0]}
	pgtest.InitDB(t, data, srv)
	inst := pgtest.Start(t, data, srv)
	ctx := context.Background()
	admin := adminWithTemplate(t, inst)
	tc, err := pgx.Connect(ctx, inst.ConnString("postgres", "tpl"))
	if err != nil {
		t.Fatal(err)
	}
	_, err = tc.Exec(ctx, "CREATE TABLE items (id int PRIMARY KEY)")
	if err == nil {
		_, err = tc.Exec(ctx, "VACUUM FULL pg_class")
	}
	_ = tc.Close(ctx)
	if err != nil {
		t.Fatal(err)
	}
	initFile := func(db string) string { return filepath.Join(databaseDir(t, admin, data, db), "pg_internal.init") }
	if _, err := os.Stat(initFile("tpl")); err == nil {
		t.Fatal("the template kept its catalog cache file through VACUUM FULL pg_class: the test shows nothing")
	}
	cr := &SQLCreator{Admin: admin, Strategy: StrategyFileCopy}
	if err := cr.Probe(ctx); err != nil {
		t.Fatal(err)
	}
	st := New(admin, cr)
	if err := st.FinalizeTemplate(ctx, "tpl"); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(initFile("tpl")); err != nil {
		t.Fatalf("finalize left the template without its catalog cache file: %v", err)
	}
	if _, err := cr.Create(ctx, "copy", "tpl", ""); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(initFile("copy")); err != nil {
		t.Fatalf("a copy made after finalize has no catalog cache file: %v", err)
	}
	c, err := pgx.Connect(ctx, inst.ConnString("postgres", "copy"))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close(ctx)
	var n int
	if err := c.QueryRow(ctx, "SELECT count(*) FROM items").Scan(&n); err != nil || n != 0 {
		t.Fatalf("the copy's table: %d rows, %v", n, err)
	}
}

// adminWithTemplate opens an admin pool on inst and creates database tpl.
func adminWithTemplate(t *testing.T, inst *instance.Instance) *pgxpool.Pool {
	t.Helper()
	ctx := context.Background()
	admin, err := OpenAdmin(ctx, inst.ConnString("postgres", "postgres"), 2)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(admin.Close)
	if _, err := admin.Exec(ctx, "CREATE DATABASE tpl"); err != nil {
		t.Fatal(err)
	}
	return admin
}

// databaseDir is database db's directory in data directory data.
func databaseDir(t *testing.T, admin *pgxpool.Pool, data, db string) string {
	t.Helper()
	var oid uint32
	if err := admin.QueryRow(context.Background(), "SELECT oid FROM pg_database WHERE datname = $1", db).Scan(&oid); err != nil {
		t.Fatal(err)
	}
	return filepath.Join(data, "base", strconv.FormatUint(uint64(oid), 10))
}

// TestRecoverRewritesCatalogCache: the server removes every catalog cache
// file when it starts, so a template finalized before a restart has none
// until Recover writes it again, and leaves the template closed.
func TestRecoverRewritesCatalogCache(t *testing.T) {
	data := filepath.Join(testenv.Dir(t), "data")
	srv := pgtest.Server{BinDir: testenv.PGBinDirs(t)[0]}
	pgtest.InitDB(t, data, srv)
	ctx := context.Background()
	inst, stop := pgtest.StartShared(t, data, srv)
	admin := adminWithTemplate(t, inst)
	initFile := func(admin *pgxpool.Pool) string {
		return filepath.Join(databaseDir(t, admin, data, "tpl"), "pg_internal.init")
	}
	cr := &SQLCreator{Admin: admin, Strategy: StrategyFileCopy}
	st := New(admin, cr)
	if _, _, err := st.Recover(ctx, "p", "p_test_", true); err != nil {
		t.Fatal(err)
	}
	if err := st.FinalizeTemplate(ctx, "tpl"); err != nil {
		t.Fatal(err)
	}
	if err := st.Save(ctx, "p", pool.Record{Hash: "h", Name: "tpl", State: "finalized"}); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(initFile(admin)); err != nil {
		t.Fatalf("finalize left no catalog cache file: %v", err)
	}
	admin.Close()
	stop()

	inst = pgtest.Start(t, data, srv)
	admin, err := OpenAdmin(ctx, inst.ConnString("postgres", "postgres"), 2)
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close()
	if _, err := os.Stat(initFile(admin)); err == nil {
		t.Fatal("the template kept its catalog cache file through a restart: the test shows nothing")
	}
	st = New(admin, &SQLCreator{Admin: admin, Strategy: StrategyFileCopy})
	if _, _, err := st.Recover(ctx, "p", "p_test_", true); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(initFile(admin)); err != nil {
		t.Fatalf("Recover left the finalized template without its catalog cache file: %v", err)
	}
	var allow bool
	var limit int
	if err := admin.QueryRow(ctx, "SELECT datallowconn, datconnlimit FROM pg_database WHERE datname = 'tpl'").Scan(&allow, &limit); err != nil {
		t.Fatal(err)
	}
	if allow || limit != -1 {
		t.Fatalf("after Recover the template takes connections %v, limit %d: want false, -1", allow, limit)
	}
}

// adoptedAfterRestart fills a pool of n copies of a one-table template,
// stops it cleanly (the copies are left ready), restarts the server and
// checks that the copies left lost their catalog cache files; it returns
// the server's admin pool, the copies' names, the path of a database's
// catalog cache file, and open, which opens a pool manager of cfg (with
// Initial and Max n) on the restarted server, which adopts them.
func adoptedAfterRestart(t *testing.T, n int, cfg pool.ManagerConfig) (admin *pgxpool.Pool, left []string, initFile func(string) string, open func() *pool.Manager) {
	t.Helper()
	data := filepath.Join(testenv.Dir(t), "data")
	// Autovacuum off: its workers connect to each database in turn, and
	// would write the files themselves.
	srv := pgtest.Server{BinDir: testenv.PGBinDirs(t)[0], Settings: map[string]string{"autovacuum": "off"}}
	pgtest.InitDB(t, data, srv)
	ctx := context.Background()
	const hash = "cc"
	cfg.Initial, cfg.Max = n, n
	openOn := func(admin *pgxpool.Pool) *pool.Manager {
		t.Helper()
		cr := &SQLCreator{Admin: admin, Strategy: StrategyFileCopy}
		if err := cr.Probe(ctx); err != nil {
			t.Fatal(err)
		}
		m, err := pool.NewManager(cfg, New(admin, cr))
		if err != nil {
			t.Fatal(err)
		}
		if err := m.Open(ctx); err != nil {
			t.Fatal(err)
		}
		return m
	}
	inst, stop := pgtest.StartShared(t, data, srv)
	admin, err := OpenAdmin(ctx, inst.ConnString("postgres", "postgres"), 4)
	if err != nil {
		t.Fatal(err)
	}
	m := openOn(admin)
	tpl, err := m.InitializeTemplate(ctx, hash)
	if err != nil {
		t.Fatal(err)
	}
	tc, err := pgx.Connect(ctx, inst.ConnString("postgres", tpl.Database))
	if err != nil {
		t.Fatal(err)
	}
	_, err = tc.Exec(ctx, "CREATE TABLE items (id int PRIMARY KEY)")
	_ = tc.Close(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := m.FinalizeTemplate(ctx, hash); err != nil {
		t.Fatal(err)
	}
	testenv.WaitFor(t, "the pool to fill", func() bool { return readyCount(m) >= n })
	if err := m.Close(ctx); err != nil {
		t.Fatal(err)
	}
	admin.Close()
	stop()

	inst = pgtest.Start(t, data, srv)
	admin, err = OpenAdmin(ctx, inst.ConnString("postgres", "postgres"), 4)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(admin.Close)
	initFile = func(db string) string { return filepath.Join(databaseDir(t, admin, data, db), "pg_internal.init") }
	rows, err := admin.Query(ctx, "SELECT datname FROM pg_database WHERE starts_with(datname, $1)", cfg.Prefix+"_test_")
	if err != nil {
		t.Fatal(err)
	}
	left, err = pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil || len(left) != n {
		t.Fatalf("left ready by the clean stop: %v (%v), want %d", left, err, n)
	}
	for _, db := range left {
		if _, err := os.Stat(initFile(db)); err == nil {
			t.Fatalf("%s kept its catalog cache file through a restart: the test shows nothing", db)
		}
	}
	return admin, left, initFile, func() *pool.Manager { return openOn(admin) }
}

// readyCount is how many databases m's pools have ready.
func readyCount(m *pool.Manager) int {
	ts, _ := m.Stats()
	k := 0
	for _, x := range ts {
		k += x.Pool.ByState[pool.Ready]
	}
	return k
}

// TestReadyAcrossRestartGetCatalogCache: the test copies a clean stop
// left ready lose their catalog cache files when the server restarts (as
// every database does), and the pool that adopts them at the next start
// writes them again, before any test takes one.
func TestReadyAcrossRestartGetCatalogCache(t *testing.T) {
	const n = 3
	ctx := context.Background()
	admin, left, initFile, open := adoptedAfterRestart(t, n, pool.ManagerConfig{Prefix: "pcc", Parallel: 2, GetTimeout: 30 * time.Second})
	m := open()
	defer func() { _ = m.Close(ctx) }()
	if got := readyCount(m); got != n {
		t.Fatalf("adopted ready: %d, want the %d left", got, n)
	}
	for _, db := range left {
		testenv.WaitFor(t, db+", adopted ready after the restart, to get its catalog cache file", func() bool {
			_, err := os.Stat(initFile(db))
			return err == nil
		})
	}
	// They are still the pool's, ready, with no session left behind once
	// the pool is done with them (a backend takes a moment to exit).
	testenv.WaitFor(t, "the pool to finish warming", func() bool {
		ts, _ := m.Stats()
		return ts[0].Pool.Warming == 0
	})
	if got := readyCount(m); got != n {
		t.Fatalf("after writing their caches: %d ready, want %d", got, n)
	}
	testenv.WaitFor(t, "no session left on the test copies", func() bool {
		var sessions int
		err := admin.QueryRow(ctx, "SELECT count(*) FROM pg_stat_activity WHERE starts_with(datname, 'pcc_test_')").Scan(&sessions)
		if err != nil {
			t.Fatal(err)
		}
		return sessions == 0
	})
}

// TestAdoptedWarmedAheadOfARun: while a run goes on, the pool writes the
// catalog cache files of the adopted copies handed out next (WarmAhead of
// them) and not of every one a restart adopted: a learned demand's
// hundreds, connected to at once, competed with the run's tests for the
// cores (issue 33). The run's hand-outs move that window on.
//
// The counts leave out the copies taken: whether the warmer reached them
// before their test did depends on the machine's load. Each wait is for a
// count the pool reaches whatever the load, and the last is for an event
// that only the take after it can cause (a make check at load 5–6 once
// read the count after the take, when the warmer had already written the
// copy that entered the window, and waited for nothing).
func TestAdoptedWarmedAheadOfARun(t *testing.T) {
	const n = pool.WarmAhead + 8
	ctx := context.Background()
	// A run gap longer than the test: the run it starts does not end.
	_, left, initFile, open := adoptedAfterRestart(t, n, pool.ManagerConfig{Prefix: "pca", Parallel: 2, GetTimeout: 30 * time.Second, RunGap: 10 * time.Minute})
	m := open()
	defer func() { _ = m.Close(ctx) }()
	taken := map[string]bool{}
	take := func() string {
		t.Helper()
		db, err := m.GetTestDatabase(ctx, "cc")
		if err != nil {
			t.Fatal(err)
		}
		taken[db.DB.Name] = true
		return db.DB.Name
	}
	has := func(db string) bool {
		_, err := os.Stat(initFile(db))
		return err == nil
	}
	// written counts the ready copies (not taken) with their file.
	written := func() int {
		k := 0
		for _, db := range left {
			if !taken[db] && has(db) {
				k++
			}
		}
		return k
	}
	// Two takes start a run; the window is then the next WarmAhead of the
	// ready ones. Before the run the warmer wrote the files of those handed
	// out first, the two taken among them: of the ready ones, those it
	// wrote then are the first of the window (unless the test stalled for
	// dozens of connections between the open and the takes: then there is
	// no window left to see).
	take()
	take()
	if before := written(); before > pool.WarmAhead {
		t.Skipf("before the run began the warmer wrote %d of the %d ready copies' files, beyond the window of %d: nothing left to see", before, n-2, pool.WarmAhead)
	}
	testenv.WaitFor(t, "the window's ready copies (the next WarmAhead handed out) to get their catalog cache file during a run", func() bool {
		return written() >= pool.WarmAhead
	})
	time.Sleep(500 * time.Millisecond) // a warmer going on beyond the window would write more meanwhile
	if got := written(); got != pool.WarmAhead {
		t.Fatalf("during a run, %d of the %d ready adopted copies got their catalog cache file: want the next %d only", got, n-2, pool.WarmAhead)
	}
	// A take moves the window on by one: the copy taken is the window's
	// first (written), and the one that enters it gets its file.
	if db := take(); !has(db) {
		t.Fatalf("the copy taken, %s, was handed out first but had no catalog cache file", db)
	}
	testenv.WaitFor(t, "a take during the run to move the warmed window on (the copy that entered it to get its file)", func() bool {
		return written() == pool.WarmAhead
	})
	time.Sleep(500 * time.Millisecond) // as above
	if got := written(); got != pool.WarmAhead {
		t.Fatalf("after a take during a run, %d of the %d ready adopted copies have their catalog cache file: want the next %d only", got, n-3, pool.WarmAhead)
	}
}

// TestFreshReadyCopiesWarmed: once the pool has filled and nothing waits,
// it connects to each fresh ready copy once (Warm), so that a test's first
// connection does not pay for the server's caches of a database nobody
// opened; it leaves no session behind and the copies stay ready.
func TestFreshReadyCopiesWarmed(t *testing.T) {
	// Autovacuum off: its workers connect to each database in turn.
	srv := pgtest.Server{BinDir: testenv.PGBinDirs(t)[0], Settings: map[string]string{"autovacuum": "off"}}
	inst := pgtest.New(t, srv)
	ctx := context.Background()
	admin, err := OpenAdmin(ctx, inst.ConnString("postgres", "postgres"), 4)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(admin.Close)
	cr := &SQLCreator{Admin: admin, Strategy: StrategyFileCopy}
	if err := cr.Probe(ctx); err != nil {
		t.Fatal(err)
	}
	const hash, n = "wm", 4
	m, err := pool.NewManager(pool.ManagerConfig{Prefix: "pwm", Initial: n, Max: n, Parallel: 2, GetTimeout: 30 * time.Second}, New(admin, cr))
	if err != nil {
		t.Fatal(err)
	}
	if err := m.Open(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = m.Close(ctx) })
	if _, err := m.InitializeTemplate(ctx, hash); err != nil {
		t.Fatal(err)
	}
	if err := m.FinalizeTemplate(ctx, hash); err != nil {
		t.Fatal(err)
	}
	settled := func() (ready, warming int) {
		ts, _ := m.Stats()
		for _, x := range ts {
			ready += x.Pool.ByState[pool.Ready]
			warming += x.Pool.Warming
		}
		return ready, warming
	}
	testenv.WaitFor(t, "the pool to settle (all ready, none to warm)", func() bool {
		ready, warming := settled()
		return ready == n && warming == 0
	})
	// Each copy had one session (the pool's), and has none now: the
	// server counts a session when it ends.
	testenv.WaitFor(t, "each ready copy to have had one session (the warmer's), ended", func() bool {
		rows, err := admin.Query(ctx, `SELECT d.datname, s.sessions, s.numbackends FROM pg_database d
			JOIN pg_stat_database s ON s.datid = d.oid WHERE starts_with(d.datname, 'pwm_test_') ORDER BY 1`)
		if err != nil {
			t.Fatal(err)
		}
		type stat struct {
			Name             string
			Sessions, Active int64
		}
		got, err := pgx.CollectRows(rows, pgx.RowToStructByPos[stat])
		if err != nil {
			t.Fatal(err)
		}
		ok := len(got) == n
		for _, s := range got {
			if s.Sessions > 1 {
				t.Fatalf("ready copies and their sessions (want %d, each with one ended): %+v", n, got)
			}
			ok = ok && s.Sessions == 1 && s.Active == 0
		}
		return ok
	})
	if ready, _ := settled(); ready != n {
		t.Fatalf("after warming: %d ready, want %d", ready, n)
	}
	// The warm's statement itself runs (the pool ignores its errors).
	var name string
	if err := admin.QueryRow(ctx, "SELECT datname FROM pg_database WHERE starts_with(datname, 'pwm_test_') LIMIT 1").Scan(&name); err != nil {
		t.Fatal(err)
	}
	if err := New(admin, cr).(pool.Warmer).Warm(ctx, name, true); err != nil {
		t.Fatalf("warming %s: %v", name, err)
	}
}

// TestWALLogCopiesGetCatalogCache: a WAL_LOG copy is made relation by
// relation, without the template's catalog cache file, so the pool warms
// every such ready copy between runs (pool.CacheFiler), not only the next
// WarmAhead it warms for their shared buffers: a test's first connection
// to any of them finds the file.
func TestWALLogCopiesGetCatalogCache(t *testing.T) {
	data := filepath.Join(testenv.Dir(t), "data")
	srv := pgtest.Server{BinDir: testenv.PGBinDirs(t)[0], Settings: map[string]string{"autovacuum": "off"}}
	pgtest.InitDB(t, data, srv)
	inst := pgtest.Start(t, data, srv)
	ctx := context.Background()
	admin, err := OpenAdmin(ctx, inst.ConnString("postgres", "postgres"), 4)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(admin.Close)
	cr := &SQLCreator{Admin: admin, Strategy: StrategyWALLog}
	if err := cr.Probe(ctx); err != nil {
		t.Fatal(err)
	}
	const hash = "wl"
	n := pool.WarmAhead + 8
	m, err := pool.NewManager(pool.ManagerConfig{Prefix: "pwl", Initial: n, Max: n, Parallel: 2, GetTimeout: 30 * time.Second}, New(admin, cr))
	if err != nil {
		t.Fatal(err)
	}
	if err := m.Open(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = m.Close(ctx) })
	tpl, err := m.InitializeTemplate(ctx, hash)
	if err != nil {
		t.Fatal(err)
	}
	initFile := func(db string) string { return filepath.Join(databaseDir(t, admin, data, db), "pg_internal.init") }
	if _, err := cr.Create(ctx, "walcopy", tpl.Database, ""); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(initFile("walcopy")); err == nil {
		t.Fatal("a WAL_LOG copy has a catalog cache file before anyone connected: the test shows nothing")
	}
	if err := m.FinalizeTemplate(ctx, hash); err != nil {
		t.Fatal(err)
	}
	testenv.WaitFor(t, "the pool to settle (all ready, none to warm)", func() bool {
		ts, _ := m.Stats()
		return len(ts) == 1 && ts[0].Pool.ByState[pool.Ready] == n && ts[0].Pool.Warming == 0
	})
	rows, err := admin.Query(ctx, "SELECT datname FROM pg_database WHERE starts_with(datname, 'pwl_test_')")
	if err != nil {
		t.Fatal(err)
	}
	names, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	missing := 0
	for _, db := range names {
		if _, err := os.Stat(initFile(db)); err != nil {
			missing++
		}
	}
	if len(names) != n || missing > 0 {
		t.Fatalf("%d of %d ready WAL_LOG copies have no catalog cache file", missing, len(names))
	}
}
