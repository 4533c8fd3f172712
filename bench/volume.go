package main

import (
	"context"
	"fmt"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/pgfork/pgfork/clone"
	"github.com/pgfork/pgfork/pgbin"
)

// The volume scenario (issue 20): a realistic suite on an ext4 directory —
// a ~180 MB template, tests on 4 workers, each taking a fresh database,
// running a short transaction and giving it back — by the pattern projects
// write by hand (CREATE DATABASE … TEMPLATE + DROP), by pgfork serve on
// ext4, and by pgfork serve on a reflink volume made for the run (its
// creation time included), on PostgreSQL 18 and 15. Issue 33: on each
// serve the suite runs first on the fresh serve, then laterRuns times more
// in turns with its floor (the same suite, each worker reusing one database
// taken once: no isolation), each once the run before ended for the pool
// and the pool has settled (the second run and the floor: the medians),
// next to the bare CREATE DATABASE … STRATEGY FILE_COPY rate on the same
// cluster.
//
// Scale: PGFORK_BENCH_VOLUME_TESTS (default 80: issue 33's CI-shaped
// suite, 80 writing tests on 4 workers and a ~187 MB template; until
// then 400, more ready databases than a pool holds by default on 2 cores,
// so that its second run measured the creation rate, not the pool).
func init() {
	register(Scenario{Name: "volume", Issue: "a reflink volume on ext4 hosts (issue 20)", Run: runVolumeBench})
}

// volRows is the template's rows: 740,000 make it ~180 MB (the serve
// scenario's table, more rows).
var volRows = 740_000

// volSetup makes the template.
func volSetup() string {
	return fmt.Sprintf("CREATE TABLE big AS SELECT g AS id, repeat(md5(g::text), 6) AS v FROM generate_series(1, %d) g; CREATE INDEX ON big(id)", volRows)
}

const volWorkers = 4

var (
	volTests = 80 // pgfork serve, both placements
	volHand  = 40 // the hand-written pattern: scaled down, extrapolated to volTests
	// volBare is how many databases the bare CREATE DATABASE rate is taken
	// over, volWorkers sessions at once.
	volBare = 40
)

// PGFORK_BENCH_VOLUME_TESTS scales the scenario (a trial run): that many
// tests, a quarter of them by hand, as many bare creations (at most 40);
// PGFORK_BENCH_VOLUME_ROWS the template (at least 100 rows: tests update 49).
func init() {
	if n, err := strconv.Atoi(os.Getenv("PGFORK_BENCH_VOLUME_TESTS")); err == nil && n >= volWorkers {
		volTests, volHand, volBare = n, max(n/4, volWorkers), max(min(n, 40), volWorkers)
	}
	if n, err := strconv.Atoi(os.Getenv("PGFORK_BENCH_VOLUME_ROWS")); err == nil && n >= 100 {
		volRows = n
	}
	if v := os.Getenv("PGFORK_BENCH_VOLUME_MAJORS"); v != "" {
		volMajors = nil
		for _, f := range strings.Fields(strings.ReplaceAll(v, ",", " ")) {
			if n, err := strconv.Atoi(f); err == nil {
				volMajors = append(volMajors, n)
			}
		}
	}
	volExt4 = os.Getenv("PGFORK_BENCH_VOLUME_EXT4") != "0"
	volPerf = os.Getenv("PGFORK_BENCH_VOLUME_PERF")
}

// Trial knobs (not the report's shape): PGFORK_BENCH_VOLUME_MAJORS the
// majors measured ("15", "15 17"; default 18 and 15);
// PGFORK_BENCH_VOLUME_EXT4=0 leaves out serve on ext4 and the hand-written
// pattern (the volume's part alone); PGFORK_BENCH_VOLUME_PERF=DIR records
// the first run on the volume with `perf record -g` of serve and every
// process it starts (DIR/perf-PG<major>.data, for `perf report`).
var (
	volMajors = []int{18, 15}
	volExt4   = true
	volPerf   string
)

// volHash is the suite's template hash.
const volHash = "volsuite"

// volRun is one contender's suite.
type volRun struct {
	total   time.Duration // setup included (serve start, volume creation, template)
	suite   time.Duration // the tests alone
	tests   int
	perTest Sample  // get + give back, per test (pgfork) or CREATE + DROP (by hand)
	ready   int     // pgfork: databases ready or being made when the run began
	busy    float64 // share of the cores busy during the suite (-1: not measured)
	// pgfork: the CPU time serve took during the suite, its own and its
	// descendants' (the PostgreSQL servers it started, their backends),
	// and the bench's own (the tests' clients).
	serveCPU, serverCPU, clientCPU time.Duration
	// clusters is how many test clusters serve started during the suite
	// (cloned clusters; -1: not known).
	clusters int
}

// cpu is the CPU time of the suite's processes: serve, its servers, the
// tests' clients.
func (v volRun) cpu() time.Duration { return v.serveCPU + v.serverCPU + v.clientCPU }

// lastCluster is the sequence number of the newest test cluster of a
// cloned-clusters serve under home (its directory's name ends in .N), -1
// when there is none.
func lastCluster(home string) int {
	last := -1
	for depth := 0; depth <= 4; depth++ {
		m, _ := filepath.Glob(filepath.Join(append(append([]string{home}, repeatStar(depth)...), "clusters", "tests", "*.*")...))
		for _, d := range m {
			if n, err := strconv.Atoi(d[strings.LastIndexByte(d, '.')+1:]); err == nil && n > last {
				last = n
			}
		}
	}
	return last
}

func (v volRun) rate() float64 { return float64(v.tests) / v.suite.Seconds() }

// suiteTotal extrapolates to volTests tests at the measured rate.
func (v volRun) suiteTotal() time.Duration {
	return v.total - v.suite + time.Duration(float64(v.suite)*float64(volTests)/float64(v.tests))
}

func runVolumeBench(ctx context.Context, r *Report) error {
	if os.Geteuid() != 0 {
		return fmt.Errorf("the volume scenario needs root (loop devices)")
	}
	r.Notef("Load average at start: %s (2 cores and one disk shared with other work; times grow with contention).", loadAvg())
	defer func() { r.Notef("Load average at the end: %s.", loadAvg()) }()
	if volTests != 80 || volRows != 740_000 || !volExt4 || len(volMajors) != 2 {
		r.Notef("SCALED (PGFORK_BENCH_VOLUME_TESTS, _ROWS, _MAJORS, _EXT4): %d tests per suite (default 80), template of %d rows (default 740000), majors %v, serve on ext4 and by hand measured: %v: a trial, not the report.", volTests, volRows, volMajors, volExt4)
	}
	runDir := os.Getenv("PGFORK_TEST_RUN_DIR")
	if runDir == "" {
		runDir = "/var/tmp"
	}
	tmp, err := os.MkdirTemp(runDir, "pgfork-bench-volume-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(tmp)
	_ = os.Chmod(tmp, 0o755)
	fsType, err := clone.FSType(tmp)
	if err != nil {
		return err
	}
	if fsType != "ext4" {
		fsType += " (not ext4)"
	}
	bin := filepath.Join(tmp, "pgfork")
	if out, err := goBuild(context.Background(), bin); err != nil {
		return fmt.Errorf("go build: %v: %s", err, out)
	}
	r.Notef("Suite: %d tests on %d workers, each gets a fresh database from a template (%q; ~180 MB at 740000 rows), connects, runs a short transaction "+
		"(creates and fills a table, updates 49 rows of the template's), gives it back (pgfork: POST …/recreate; by hand: DROP DATABASE). "+
		"Run directory %s on %s. Scaled to finish in about 10 minutes here: the hand-written pattern runs %d tests and its suite time is "+
		"extrapolated to %d at its measured rate (it is steady: every test pays one CREATE DATABASE). Totals include each contender's setup "+
		"(serve start with its managed PostgreSQL, template build; the volume's creation for the volume). On each serve the suite runs first, then %d more times "+
		"in turns with as many runs of its floor (run, floor, run, floor …: the floor drifts with the machine's load), each once the pool has settled "+
		"(\"second run\" and floor: the run of median suite time of each).",
		volTests, volWorkers, volSetup(), tmp, fsType, volHand, volTests, laterRuns)
	var missed []string
	for _, major := range volMajors {
		inst, err := findPG(major)
		if err != nil {
			r.Notef("PostgreSQL %d not measured: %v", major, err)
			continue
		}
		m, err := volumeBenchMajor(ctx, r, bin, tmp, inst.BinDir, major)
		if err != nil {
			return fmt.Errorf("PostgreSQL %d: %w", major, err)
		}
		missed = append(missed, m...)
	}
	if len(missed) > 0 {
		r.Notef("Missed: %s.", strings.Join(missed, "; "))
	} else {
		r.Notef("Every target met.")
	}
	return nil
}

func volumeBenchMajor(ctx context.Context, r *Report, bin, tmp, pgBin string, major int) ([]string, error) {
	port := 17000 + major
	// pgfork serve on ext4; the hand-written pattern runs on the same server
	// (its managed PostgreSQL, data on ext4) once pgfork's suite is over.
	extHome := filepath.Join(tmp, fmt.Sprintf("ext4-%d", major))
	if err := os.Mkdir(extHome, 0o755); err != nil {
		return nil, err
	}
	var hand, ext, ext2, extFloor volRun
	var extBare float64
	if volExt4 {
		var err error
		ext, ext2, extFloor, err = volServeSuite(ctx, bin, extHome, port, pgBin, "", nil, func(p *serveProc, d benchDB) error {
			var err error
			if extBare, err = bareCreateRate(ctx, d, volWorkers, volBare); err != nil {
				return fmt.Errorf("bare CREATE DATABASE: %w", err)
			}
			hand, err = volHandSuite(ctx, d)
			return err
		})
		if err != nil {
			return nil, fmt.Errorf("pgfork serve on ext4: %w", err)
		}
	}
	// The volume part runs on its own: the ext4 serve's copies (its pool of
	// full copies, up to a quarter of the free disk) leave the page cache
	// and the disk with their files, before the volume (an image file on the
	// same disk) is read (serveProc.release says what they cost it).
	if err := os.RemoveAll(extHome); err != nil {
		return nil, err
	}
	syscall.Sync()
	// pgfork serve on a volume made for the run.
	volHome := filepath.Join(tmp, fmt.Sprintf("vol-%d", major))
	if err := os.Mkdir(volHome, 0o755); err != nil {
		return nil, err
	}
	var created time.Duration
	var used int64
	var volBareRun bareRun
	var bareCl clusterRun // before 18: bare copies of the template's cluster
	slots := 0
	defer func() { _ = exec.Command(bin, "--state-dir", volHome, "volume", "rm").Run() }()
	perf := ""
	if volPerf != "" {
		perf = filepath.Join(volPerf, fmt.Sprintf("perf-PG%d.data", major))
	}
	vol, vol2, volFloor, err := volServeSuite(ctx, bin, volHome, port+100, pgBin, perf, func() error {
		t0 := time.Now()
		out, err := exec.CommandContext(ctx, bin, "--state-dir", volHome, "volume", "create").CombinedOutput()
		created = time.Since(t0)
		if err != nil {
			return fmt.Errorf("volume create: %v: %s", err, out)
		}
		return nil
	}, func(p *serveProc, d benchDB) error {
		var err error
		if volBareRun, err = bareCreate(ctx, d, volWorkers, volBare); err != nil {
			return fmt.Errorf("bare CREATE DATABASE: %w", err)
		}
		var s syscall.Statfs_t
		if err := syscall.Statfs(filepath.Join(volHome, "volume"), &s); err != nil {
			return err
		}
		used = int64(s.Blocks-s.Bfree) * int64(s.Bsize)
		if major >= 18 {
			return nil
		}
		// Before 18 serve copies its template's cluster (docs/server.md,
		// "Cloned clusters"): what a bare copy of it costs bounds that.
		data, n, err := templateCluster(volHome)
		if err != nil {
			return err
		}
		slots = n
		pg, user, err := benchPostgres("")
		if err == nil {
			pg, err = pgbin.Find(pgbin.Options{Explicit: pgBin}, 0)
		}
		if err != nil {
			return err
		}
		if bareCl, err = bareClusters(ctx, data, pg, user, 3*runtime.NumCPU(), runtime.NumCPU()); err != nil {
			return fmt.Errorf("bare cluster copies: %w", err)
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("pgfork serve on the volume: %w", err)
	}
	r.Notef("PostgreSQL %d: volume created in %s; space used on it after the suite: %.0f MiB (XFS log and metadata included).",
		major, Dur(created), float64(used)/(1<<20))
	hTotal := hand.suiteTotal()
	if volExt4 {
		r.Table([]string{fmt.Sprintf("PG %d: how the tests get their databases", major), fmt.Sprintf("suite total (%d tests)", volTests), "tests run", "DBs/s", "per test p50", "per test p99", "vs by hand"}, [][]string{
			{"by hand: CREATE DATABASE … TEMPLATE (default strategy) + DROP, on ext4", Dur(hTotal) + " (extrapolated)", fmt.Sprint(hand.tests), fmt.Sprintf("%.1f", hand.rate()), Dur(hand.perTest.Median()), Dur(hand.perTest.Quantile(0.99)), "1.0x"},
			{"pgfork serve, state on ext4", Dur(ext.total), fmt.Sprint(ext.tests), fmt.Sprintf("%.1f", ext.rate()), Dur(ext.perTest.Median()), Dur(ext.perTest.Quantile(0.99)), Ratio(hTotal, ext.total)},
			{"pgfork serve, state on the volume (creation included)", Dur(vol.total), fmt.Sprint(vol.tests), fmt.Sprintf("%.1f", vol.rate()), Dur(vol.perTest.Median()), Dur(vol.perTest.Quantile(0.99)), Ratio(hTotal, vol.total)},
		})
	}
	// Against the floor (issue 33): the same suite on the same serve, each
	// worker reusing one database (no isolation); the suites alone, setup
	// excluded, and pgfork's fresh databases per second next to the bare
	// CREATE DATABASE … STRATEGY FILE_COPY rate on the same cluster.
	floorRow := func(f volRun, where string) FloorRow {
		return FloorRow{Name: "floor: each worker reuses one database, state on " + where, Suite: f.suite} // waits for no database
	}
	runRow := func(v volRun, name string) FloorRow {
		return FloorRow{Name: name, Suite: v.suite, Wait: v.perTest, Rate: v.rate()}
	}
	if volExt4 {
		r.FloorTable(fmt.Sprintf("PG %d, state on ext4", major), extBare, floorRow(extFloor, "ext4"),
			runRow(ext, "pgfork serve, first run on a fresh serve"), runRow(ext2, "pgfork serve, second run on the same serve"),
			FloorRow{Name: "by hand: CREATE DATABASE … TEMPLATE + DROP (extrapolated)", Suite: hTotal, Wait: hand.perTest, Rate: hand.rate()})
	}
	volBareDBs := volBareRun.rate
	r.FloorTable(fmt.Sprintf("PG %d, state on the volume", major), volBareDBs, floorRow(volFloor, "the volume"),
		runRow(vol, "pgfork serve, first run on a fresh serve"), runRow(vol2, "pgfork serve, second run on the same serve"))
	r.Notef("PG %d: suite = the tests alone (serve start and template build excluded); wait per test: for pgfork get + give back "+
		"(GET …/tests and POST …/recreate), by hand CREATE DATABASE + DROP DATABASE; the floor waits for no database. Each later run starts once the run before has ended for the pool (its run gap, 2 s without a hand-out, passed: the demand it took is learned) and the pool has settled (nothing creating, recreating or warming): the pause between two runs of a suite, also before each floor run (the later runs and the floor runs alternate); the second run is the later run of median suite time, the floor the median of its runs. "+
		"Bare rate: %d sessions running CREATE DATABASE … STRATEGY FILE_COPY from a copy of the template on the same cluster (the server's file_copy_method; drops not timed), %d databases.",
		major, volWorkers, volBare)
	var missed []string
	target := func(met bool, format string, args ...any) {
		r.Target(met, format, args...)
		if !met {
			missed = append(missed, fmt.Sprintf(format, args...))
		}
	}
	floorTarget := func(what string, run, floor time.Duration, limit float64) {
		if !r.FloorTarget(what, run, floor, limit) {
			missed = append(missed, fmt.Sprintf("%s ≤ %.1fx its floor (%s)", what, limit, Times(run, floor)))
		}
	}
	// Issue 20's targets were ratios of whole suites, setup included, to
	// the hand-written pattern and to serve on ext4; issue 33 replaced them
	// by the floor's (below), since a suite at its floor could not meet
	// some of them: printed with that ceiling, the ratios stay in the
	// tables above.
	atFloor := func(v, f volRun) time.Duration { return v.total - v.suite + f.suite } // the setup, then the suite at its floor
	if volExt4 {
		r.Notef("PG %d, issue 20's ratios (its targets until issue 33 replaced them by the floor's): the suite on the volume %.1fx faster than by hand on ext4 (was ≥ 20x; "+
			"at its floor, with the same setup of %s, it would be %.1fx), %.1fx faster than serve on ext4 (was ≥ 5x; at the floors, %.1fx); "+
			"per-test overhead with the pool drained p50 %s, p99 %s (was ≤ 30 ms, ≤ 100 ms); fresh databases per second %.1fx by hand's (was ≥ 20x).",
			major, float64(hTotal)/float64(vol.total), Dur(vol.total-vol.suite), float64(hTotal)/float64(atFloor(vol, volFloor)),
			float64(ext.total)/float64(vol.total), float64(atFloor(ext, extFloor))/float64(atFloor(vol, volFloor)),
			Dur(vol.perTest.Median()), Dur(vol.perTest.Quantile(0.99)), vol.rate()/hand.rate())
	}
	// Issue 33's.
	floorMax := 3.0 // 3x on 18, 4x on 15 (full copies before 18)
	if major < 18 {
		floorMax = 4
	}
	floorTarget(fmt.Sprintf("PG %d: suite on the volume, first run on a fresh serve,", major), vol.suite, volFloor.suite, floorMax)
	// From 18 the pool's copies are the bare rate's own CREATE DATABASE …
	// STRATEGY FILE_COPY (clones); before, serve makes them otherwise.
	if b := creationBound(vol.tests, vol.ready, volBareDBs); b > 0 && major >= 18 {
		r.Notef("PG %d, bound of the first run on the volume: it takes %d fresh databases and %d were ready or being made when it began; the other %d, made at the bare rate "+
			"(%.1f/s, the cluster idle, this run) take %s alone, %s the floor, even if its tests took no time (at most %.1f fresh databases/s, %.2fx bare). "+
			"Cores busy during the first run: %s (during the floor: %s, the second run: %s, the bare rate: %s).",
			major, vol.tests, vol.ready, vol.tests-vol.ready, volBareDBs, Dur(b), Times(b, volFloor.suite), float64(vol.tests)/b.Seconds(), float64(vol.tests)/b.Seconds()/volBareDBs,
			busyCell(vol.busy), busyCell(volFloor.busy), busyCell(vol2.busy), busyCell(volBareRun.busy))
		if ct := volBareRun.coreTime(); ct > 0 && volFloor.busy > 0 {
			// The creations and the tests share the cores: the run needs
			// both one's and the other's core time.
			n := runtime.NumCPU()
			tests := time.Duration(volFloor.busy * float64(n) * float64(volFloor.suite))
			made := time.Duration(vol.tests-vol.ready) * ct
			least := (tests + made) / time.Duration(n)
			r.Notef("PG %d, bound by the cores: a bare creation took %s of the %d cores' time, the %d the run makes %s; the tests' own work, the floor's %s of the cores' time; "+
				"together at least %s on %d cores kept busy, %s the floor (at most %.1f fresh databases/s, %.2fx bare).",
				major, Dur(ct), n, vol.tests-vol.ready, Dur(made), Dur(tests), Dur(least), n, Times(least, volFloor.suite),
				float64(vol.tests)/least.Seconds(), float64(vol.tests)/least.Seconds()/volBareDBs)
		}
	}
	if c, least := clusterBound(vol.tests, vol.ready, slots, bareCl, time.Duration(volFloor.busy*float64(runtime.NumCPU())*float64(volFloor.suite))); least > 0 && volFloor.busy > 0 {
		n := runtime.NumCPU()
		wall := time.Duration(c) * bareCl.wall / time.Duration(bareCl.copies)
		r.Notef("PG %d, bound of the first run on the volume by the cores: it takes %d fresh databases and %d were ready or being made when it began; "+
			"a test cluster of this template holds %d, so the other %d need %d clusters. A bare copy of the template's cluster (%d files: `cp -a --reflink=always`, "+
			"its server started, a first connection to each of its databases but template1, the server stopped immediately, `rm -rf`; %d copies, %d at once, this run) took %s of the cores' time each (%s of wall, %d at once; cores busy %s), "+
			"the %d clusters %s; the tests' own work, the floor's %s of the cores' time; together at least %s on %d cores kept busy, %s the floor "+
			"(the copies alone, %d at once: %s). Serve's own work per cluster (renaming its databases, retiring them) is not in it. "+
			"Cores busy during the first run: %s (during the floor: %s, the second run: %s).",
			major, vol.tests, vol.ready, slots, vol.tests-vol.ready, c, bareCl.files, bareCl.copies, n, Dur(bareCl.coreTime()), Dur(bareCl.wall/time.Duration(bareCl.copies)*time.Duration(n)), n, busyCell(bareCl.busy),
			c, Dur(time.Duration(c)*bareCl.coreTime()), Dur(time.Duration(volFloor.busy*float64(n)*float64(volFloor.suite))), Dur(least), n, Times(least, volFloor.suite),
			n, Dur(wall), busyCell(vol.busy), busyCell(volFloor.busy), busyCell(vol2.busy))
		// The same bound in CPU time of the processes alone (the copies',
		// the floor's, the first run's): other work on the machine (shared
		// by other engineers) counts in no term of it, nor does the
		// kernel's own threads' work for any of them.
		made := fmt.Sprint(vol.clusters)
		if vol.clusters < 0 {
			made = "?"
		}
		cpuLeast := time.Duration(c)*bareCl.processCPU() + volFloor.cpu()
		r.Notef("PG %d, the first run in CPU time of the processes alone: serve %s, the PostgreSQL servers it started (their backends included) %s, the tests' clients %s: %s, "+
			"with %s test clusters started during the run (the bound counts %d); a bare copy's processes (cp, its server and the connections, rm) took %s each, "+
			"the floor's (serve, its servers, the clients) %s: the bound in CPU time %s, the first run %s of it.",
			major, Dur(vol.serveCPU), Dur(vol.serverCPU), Dur(vol.clientCPU), Dur(vol.cpu()), made, c, Dur(bareCl.processCPU()), Dur(volFloor.cpu()),
			Dur(cpuLeast), Times(vol.cpu(), cpuLeast))
		// Issue 60's target, judged in CPU time: the bound by the cores
		// above takes the share of the cores busy, which on a machine
		// shared with other work counts that work in the bare copies'
		// time (one copy measured at 2.4 s instead of 0.3 s under a load
		// of 10), and the first run's wall time grows with that load too.
		// The processes' own CPU time leaves both out; the wall ratio is
		// printed beside it, meaningful on a quiet machine.
		target(vol.cpu() > 0 && float64(vol.cpu()) <= 1.25*float64(cpuLeast),
			"PG %d: suite on the volume, first run on a fresh serve, ≤ 1.25x its bound by the cores (issue 60), in CPU time: %s vs %s = %s (wall time against the bound above: %s vs %s = %s)",
			major, Dur(vol.cpu()), Dur(cpuLeast), Times(vol.cpu(), cpuLeast), Dur(vol.suite), Dur(least), Times(vol.suite, least))
	}
	floorTarget(fmt.Sprintf("PG %d: suite on the volume, second run on the same serve,", major), vol2.suite, volFloor.suite, 1.5)
	target(vol2.perTest.Median() <= 5*time.Millisecond && vol2.perTest.Quantile(0.99) <= 50*time.Millisecond,
		"PG %d: per-test wait on the volume, second run: p50 ≤ 5 ms (%s), p99 ≤ 50 ms (%s)", major, Dur(vol2.perTest.Median()), Dur(vol2.perTest.Quantile(0.99)))
	if major >= 18 {
		target(vol.rate() >= 0.7*volBareDBs, "PG %d: fresh databases per second on the volume ≥ 0.7x the bare CREATE DATABASE rate at %d sessions (%.1f vs %.1f/s, %.2fx)",
			major, volWorkers, vol.rate(), volBareDBs, vol.rate()/volBareDBs)
	}
	if major >= 18 && volExt4 {
		target(float64(hTotal) >= 10*float64(ext.total), "PG %d: suite on ext4 without a volume ≥ 10x faster than by hand (%.1fx; \"no slower than today\": compare with the committed report)",
			major, float64(hTotal)/float64(ext.total))
		r.Notef("PG %d, ceiling of the ratio on ext4: serve's start and the template's build took %s alone; with the suite at its floor (%s) the total would be %s, %.1fx faster than by hand. "+
			"The first run made its fresh databases at %.1f/s, %.2fx the bare CREATE DATABASE … STRATEGY FILE_COPY rate on the same cluster (%.1f/s: full copies on ext4).",
			major, Dur(ext.total-ext.suite), Dur(extFloor.suite), Dur(atFloor(ext, extFloor)), float64(hTotal)/float64(atFloor(ext, extFloor)), ext.rate(), ext.rate()/extBare, extBare)
		// What 10x asks of the run: the setup as measured, the run in what
		// is left, its databases not ready at the start made meanwhile.
		if left := hTotal/10 - (ext.total - ext.suite); left <= 0 {
			r.Notef("PG %d: 10x by hand on ext4 needs the whole suite within %s, less than serve's start and the template's build took alone.", major, Dur(hTotal/10))
		} else if need := ext.tests - ext.ready; need > 0 {
			r.Notef("PG %d: 10x by hand on ext4 needs the whole suite within %s: after the setup, the run within %s (%s its floor), and its %d fresh databases not ready when it began made at %.1f/s or more, "+
				"%.1fx the bare rate of full copies on ext4.", major, Dur(hTotal/10), Dur(left), Times(left, extFloor.suite), need, float64(need)/left.Seconds(), float64(need)/left.Seconds()/extBare)
		}
	}
	if volExt4 {
		r.Notef("PG %d on ext4 (no floor target there, for comparison): first run %s its floor, second run %s.", major, Times(ext.suite, extFloor.suite), Times(ext2.suite, extFloor.suite))
	}
	return missed, nil
}

// volServeSuite starts pgfork serve --managed with its state in home (after
// before, timed with it), builds the template and runs the suite on it:
// the first run on the fresh serve, then laterRuns more in turns with as
// many runs of its floor (alternateRuns), each once the run before it has
// ended for the pool and the pool has settled (the pause between two runs
// of a suite); second and floor are the runs of median suite time. after
// runs with a handed-out database before the server stops.
func volServeSuite(ctx context.Context, bin, home string, port int, pgBin, perf string, before func() error, after func(*serveProc, benchDB) error) (first, second, floor volRun, err error) {
	t0 := time.Now()
	if before != nil {
		if err := before(); err != nil {
			return first, second, floor, err
		}
	}
	p, err := startServe(bin, home, port, "--managed", "--pg-bin", pgBin)
	if err != nil {
		return first, second, floor, err
	}
	defer func() { _ = p.stop() }()
	if err := p.template(ctx, volHash, volSetup()); err != nil {
		return first, second, floor, err
	}
	stopPerf := func() {}
	if perf != "" {
		if stopPerf, err = perfRecord(p.pid, perf); err != nil {
			return first, second, floor, err
		}
	}
	first, err = volSuite(ctx, p)
	stopPerf()
	if err != nil {
		return first, second, floor, err
	}
	first.total = time.Since(t0)
	if err := p.runEnded(ctx, volHash, 2*time.Minute); err != nil {
		return first, second, floor, fmt.Errorf("after the first run: %w", err)
	}
	later, floors, err := alternateRuns(func() error { return p.afterRun(ctx, 2*time.Minute) },
		func() (volRun, error) { return volSuite(ctx, p) },
		func() (volRun, error) { return volFloorSuite(ctx, p) })
	if err != nil {
		return first, second, floor, fmt.Errorf("later runs and floors: %w", err)
	}
	second = medianBy(later, volSuiteTook)
	second.total = second.suite
	floor = medianBy(floors, volSuiteTook)
	if err := p.afterRun(ctx, 2*time.Minute); err != nil {
		return first, second, floor, fmt.Errorf("after the floors: %w", err)
	}
	if after != nil {
		var d benchDB
		if err := p.call("GET", "/api/v1/templates/"+volHash+"/tests", "", &d); err != nil {
			return first, second, floor, err
		}
		if err := after(p, d); err != nil {
			return first, second, floor, err
		}
	}
	return first, second, floor, nil
}

// volSuiteTook is a volRun's suite time, medianBy's key.
func volSuiteTook(v volRun) time.Duration { return v.suite }

// volSuite runs volTests tests on volWorkers workers against serve p, each
// timed get + recreate.
func volSuite(ctx context.Context, p *serveProc) (volRun, error) {
	const hash = volHash
	var (
		next atomic.Int64
		mu   sync.Mutex
		per  Sample
		wg   sync.WaitGroup
		ferr atomic.Value
	)
	// What the pool had made, or was making, before the run: the rest of
	// its fresh databases are made during it (creationBound).
	ps, err := p.pools()
	if err != nil {
		return volRun{}, err
	}
	ready := 0
	for _, t := range ps {
		if t.Hash == hash {
			ready = t.Databases["ready"] + t.Databases["creating"]
		}
	}
	t0 := readTreeCPU(p.pid)
	self0 := selfCPU()
	k0 := lastCluster(filepath.Dir(p.log))
	c0 := readCPU()
	s0 := time.Now()
	for range volWorkers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for next.Add(1) <= int64(volTests) {
				g0 := time.Now()
				var d benchDB
				if err := p.call("GET", "/api/v1/templates/"+hash+"/tests", "", &d); err != nil {
					ferr.Store(err)
					return
				}
				got := time.Since(g0)
				if err := quickTest(ctx, d.url()); err != nil {
					ferr.Store(err)
					return
				}
				b0 := time.Now()
				if err := p.call("POST", fmt.Sprintf("/api/v1/templates/%s/tests/%d/recreate", hash, d.ID), "", nil); err != nil {
					ferr.Store(err)
					return
				}
				mu.Lock()
				per = append(per, got+time.Since(b0))
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	if e, ok := ferr.Load().(error); ok {
		b, _ := os.ReadFile(p.log)
		lines := strings.Split(strings.TrimSpace(string(b)), "\n")
		return volRun{}, fmt.Errorf("%w (log tail: %s)", e, strings.Join(lines[max(0, len(lines)-5):], " | "))
	}
	run := volRun{suite: time.Since(s0), tests: volTests, perTest: per, ready: ready, busy: readCPU().busySince(c0)}
	run.serveCPU, run.serverCPU = readTreeCPU(p.pid).since(t0)
	run.clientCPU = selfCPU() - self0
	run.clusters = -1
	if k1 := lastCluster(filepath.Dir(p.log)); k0 >= 0 && k1 >= k0 {
		run.clusters = k1 - k0
	}
	run.total = run.suite
	sort.Slice(run.perTest, func(i, j int) bool { return run.perTest[i] < run.perTest[j] })
	return run, nil
}

// volHandSuite is the hand-written pattern on the server d lives on, as its
// (superuser) role: a plain copy of the template's content, then per test
// CREATE DATABASE … TEMPLATE (default strategy), the test, DROP DATABASE.
func volHandSuite(ctx context.Context, d benchDB) (volRun, error) {
	admin, err := pgx.Connect(ctx, d.url())
	if err != nil {
		return volRun{}, err
	}
	defer admin.Close(ctx)
	src := pgx.Identifier{d.Database.Config.Database}.Sanitize()
	if _, err := admin.Exec(ctx, "CREATE DATABASE bench_hand_src TEMPLATE "+src); err != nil {
		return volRun{}, err
	}
	var (
		next atomic.Int64
		mu   sync.Mutex
		per  Sample
		wg   sync.WaitGroup
		ferr atomic.Value
	)
	s0 := time.Now()
	for range volWorkers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c, err := pgx.Connect(ctx, d.url())
			if err != nil {
				ferr.Store(err)
				return
			}
			defer c.Close(ctx)
			for i := next.Add(1); i <= int64(volHand); i = next.Add(1) {
				name := fmt.Sprintf("bench_hand_%d", i)
				c0 := time.Now()
				if _, err := c.Exec(ctx, "CREATE DATABASE "+name+" TEMPLATE bench_hand_src"); err != nil {
					ferr.Store(err)
					return
				}
				created := time.Since(c0)
				u, _ := url.Parse(d.url())
				u.Path = "/" + name
				if err := quickTest(ctx, u.String()); err != nil {
					ferr.Store(err)
					return
				}
				d0 := time.Now()
				if _, err := c.Exec(ctx, "DROP DATABASE "+name); err != nil {
					ferr.Store(err)
					return
				}
				mu.Lock()
				per = append(per, created+time.Since(d0))
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	if e, ok := ferr.Load().(error); ok {
		return volRun{}, e
	}
	run := volRun{suite: time.Since(s0), tests: volHand, perTest: per}
	run.total = run.suite
	sort.Slice(run.perTest, func(i, j int) bool { return run.perTest[i] < run.perTest[j] })
	_, _ = admin.Exec(ctx, "DROP DATABASE bench_hand_src")
	return run, nil
}

// volFloorSuite is the suite's floor on serve p: the same volTests tests on
// volWorkers workers, each worker taking one database once and running all
// its tests in it (no isolation), giving it back at the end. Per test: the
// test alone.
func volFloorSuite(ctx context.Context, p *serveProc) (volRun, error) {
	var (
		next atomic.Int64
		mu   sync.Mutex
		per  Sample
		wg   sync.WaitGroup
		ferr atomic.Value
	)
	dbs := make([]benchDB, volWorkers)
	for i := range dbs {
		if err := p.call("GET", "/api/v1/templates/"+volHash+"/tests", "", &dbs[i]); err != nil {
			return volRun{}, err
		}
	}
	t0 := readTreeCPU(p.pid)
	self0 := selfCPU()
	c0 := readCPU()
	s0 := time.Now()
	for _, d := range dbs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := next.Add(1); i <= int64(volTests); i = next.Add(1) {
				t0 := time.Now()
				if err := quickTestTable(ctx, d.url(), fmt.Sprintf("t%d", i)); err != nil {
					ferr.Store(err)
					return
				}
				mu.Lock()
				per = append(per, time.Since(t0))
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	run := volRun{suite: time.Since(s0), tests: volTests, perTest: per, busy: readCPU().busySince(c0)}
	run.serveCPU, run.serverCPU = readTreeCPU(p.pid).since(t0)
	run.clientCPU = selfCPU() - self0
	run.total = run.suite
	for _, d := range dbs {
		_ = p.call("POST", fmt.Sprintf("/api/v1/templates/%s/tests/%d/recreate", volHash, d.ID), "", nil)
	}
	if e, ok := ferr.Load().(error); ok {
		return volRun{}, e
	}
	sort.Slice(run.perTest, func(i, j int) bool { return run.perTest[i] < run.perTest[j] })
	return run, nil
}

// bareCreateRate is the bare creation rate of the cluster d lives on:
// sessions sessions running CREATE DATABASE … STRATEGY FILE_COPY from a copy
// of d (the server's file_copy_method: clone on 18 on a reflink filesystem),
// n databases in all; databases per second, the drops after them not timed.
func bareCreateRate(ctx context.Context, d benchDB, sessions, n int) (float64, error) {
	b, err := bareCreate(ctx, d, sessions, n)
	return b.rate, err
}

// bareRun is what bareCreate measured: databases a second, and the share
// of the cores busy meanwhile (-1: not measured).
type bareRun struct {
	rate, busy float64
}

// coreTime is the time of all the cores one bare creation took (seconds of
// one core; 0 when not measured).
func (b bareRun) coreTime() time.Duration {
	if b.rate <= 0 || b.busy < 0 {
		return 0
	}
	return time.Duration(b.busy * float64(runtime.NumCPU()) / b.rate * float64(time.Second))
}

// bareCreate is bareCreateRate with the cores' busy share.
func bareCreate(ctx context.Context, d benchDB, sessions, n int) (bareRun, error) {
	admin, err := pgx.Connect(ctx, d.url())
	if err != nil {
		return bareRun{}, err
	}
	defer admin.Close(ctx)
	src := pgx.Identifier{d.Database.Config.Database}.Sanitize()
	if _, err := admin.Exec(ctx, "CREATE DATABASE bench_bare_src TEMPLATE "+src); err != nil {
		return bareRun{}, err
	}
	defer func() { _, _ = admin.Exec(context.WithoutCancel(ctx), "DROP DATABASE IF EXISTS bench_bare_src") }()
	var (
		next atomic.Int64
		wg   sync.WaitGroup
		ferr atomic.Value
	)
	c0 := readCPU()
	s0 := time.Now()
	for range sessions {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c, err := pgx.Connect(ctx, d.url())
			if err != nil {
				ferr.Store(err)
				return
			}
			defer c.Close(ctx)
			for i := next.Add(1); i <= int64(n); i = next.Add(1) {
				if _, err := c.Exec(ctx, fmt.Sprintf("CREATE DATABASE bench_bare_%d TEMPLATE bench_bare_src STRATEGY FILE_COPY", i)); err != nil {
					ferr.Store(err)
					return
				}
			}
		}()
	}
	wg.Wait()
	took := time.Since(s0)
	busy := readCPU().busySince(c0)
	for i := 1; i <= n; i++ {
		_, _ = admin.Exec(ctx, fmt.Sprintf("DROP DATABASE IF EXISTS bench_bare_%d", i))
	}
	if e, ok := ferr.Load().(error); ok {
		return bareRun{}, e
	}
	return bareRun{rate: float64(n) / took.Seconds(), busy: busy}, nil
}

// perfRecord starts `perf record -g` of process pid and the processes it
// starts from now on, into out; stop ends it (SIGINT: perf writes its data
// and exits).
func perfRecord(pid int, out string) (stop func(), err error) {
	cmd := exec.Command("perf", "record", "-g", "-q", "-o", out, "-p", strconv.Itoa(pid))
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("perf record: %w", err)
	}
	time.Sleep(500 * time.Millisecond) // perf attaches before the run begins
	return func() {
		_ = cmd.Process.Signal(os.Interrupt)
		_ = cmd.Wait()
	}, nil
}
