package main

// Scenario "branches": branches handed out by `pgfork serve` (issue 26),
// measured through the library serve uses (branches.Manager) on XFS with
// reflink. The source is what the issue asks for: a standby kept by
// pgfork (pg_basebackup -R of a primary, started on the volume) of a
// primary under a steady pgbench load during every measurement. For each
// size: a branch from the request to its first query, for 1, 5 and 10 at
// once, against pg_basebackup + start of the same standby; reset;
// snapshot; the standby's lag while 10 branches run pgbench (against the
// same 10 branches idle); the disk 20 branches use after each writes 1% of
// the source's pages.
//
// Environment:
//
//	PGFORK_BENCH_BRANCHES_SCALES    pgbench scales of the sources, comma-separated (default 70, ≈ 1 GB;
//	                                the issue's full run is 70,350: 1 GB and 5 GB)
//	PGFORK_BENCH_BRANCHES_LOAD_TPS  the primary's pgbench load, transactions per second (default 100)
//	PGFORK_TEST_XFS                 the XFS reflink filesystem (scripts/test-env.sh)
//	PGFORK_TEST_PG_BINS             PostgreSQL bin directories (the first is used)

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgfork/pgfork/branches"
	"github.com/pgfork/pgfork/clone"
	"github.com/pgfork/pgfork/cluster"
	"github.com/pgfork/pgfork/instance"
	"github.com/pgfork/pgfork/internal/statedir"
	"github.com/pgfork/pgfork/internal/units"
	"github.com/pgfork/pgfork/pgbin"
)

func init() {
	register(Scenario{Name: "branches", Issue: "branches from serve: create to first query, reset, snapshot, standby lag, disk (issue 26)", Run: runBranchesBench})
}

// branchesBench is one run's setting, shared by its sizes.
type branchesBench struct {
	pg   pgbin.Installation
	user *instance.OSUser
	xfs  string
	tps  int
}

func branchFirstQuery(ctx context.Context, url string) error {
	c, err := pgx.Connect(ctx, url)
	if err != nil {
		return err
	}
	defer c.Close(ctx)
	var n int
	return c.QueryRow(ctx, "SELECT count(*) FROM pgbench_branches").Scan(&n)
}

func runBranchesBench(ctx context.Context, r *Report) error {
	var scales []int
	for _, f := range strings.Split(envOr("PGFORK_BENCH_BRANCHES_SCALES", "70"), ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n < 1 {
			return fmt.Errorf("PGFORK_BENCH_BRANCHES_SCALES: bad scale %q", f)
		}
		scales = append(scales, n)
	}
	xfs := os.Getenv("PGFORK_TEST_XFS")
	if xfs == "" {
		return fmt.Errorf("PGFORK_TEST_XFS is not set: run eval \"$(scripts/test-env.sh env)\"")
	}
	bin := strings.Split(os.Getenv("PGFORK_TEST_PG_BINS"), ":")[0]
	pg, err := pgbin.Find(pgbin.Options{Explicit: bin}, 0)
	if err != nil {
		return err
	}
	user, err := instance.ResolveUser("")
	if err != nil {
		return err
	}
	bb := &branchesBench{pg: pg, user: user, xfs: xfs, tps: max(copyEnvInt("PGFORK_BENCH_BRANCHES_LOAD_TPS", 100), 1)}
	r.Notef("PostgreSQL %s; XFS with reflink (a 40 GB loop image). The machine has 2 cores shared with 3 other helpers running benches and tests at the same time: absolute times are noisy, the baseline is measured in the same run under the same load. Load average at start: %s.",
		pg.Version, loadAvg())
	r.Notef("Each source is a standby that pgfork keeps (pg_basebackup -R of a primary, started on the XFS volume), and the primary runs pgbench at %d transactions per second (2 clients, -R) during every measurement below.", bb.tps)
	for _, s := range scales {
		if err := bb.runSize(ctx, r, s); err != nil {
			return err
		}
	}
	r.Table([]string{"reference (not measured here: needs ZFS or LVM and Docker)", "published figure"}, [][]string{
		{"DBLab Engine thin clone of a 1 TiB database (ZFS)", "about 10 s (DBLab Engine README, github.com/postgres-ai/database-lab-engine)"},
		{"DBLab Engine thin clone of a 10 TiB database (ZFS)", "under 2 s (Database Lab v3 README, pkg.go.dev/gitlab.com/postgres-ai/database-lab/v3)"},
		{"DBLab thin clone time against database size", "independent of size (postgres.ai/docs/questions-and-answers)"},
	})
	r.Notef("Load average at end: %s.", loadAvg())
	return nil
}

// runSize measures everything at one source size.
func (bb *branchesBench) runSize(ctx context.Context, r *Report, scale int) (err error) {
	pg, user := bb.pg, bb.user
	work, err := os.MkdirTemp(bb.xfs, "bench-branches-")
	if err != nil {
		return err
	}
	defer func() {
		_ = os.RemoveAll(work)
		_ = exec.Command("fstrim", bb.xfs).Run()
	}()
	_ = os.Chmod(work, 0o755)

	// The primary and its data.
	prim := filepath.Join(work, "primary")
	if err := instance.InitDB(ctx, instance.InitOptions{BinDir: pg.BinDir, Env: pg.Env(), DataDir: prim, User: user, NoSync: true}); err != nil {
		return err
	}
	in, err := instance.Start(ctx, instance.Config{BinDir: pg.BinDir, Env: pg.Env(), DataDir: prim, User: user, Profile: instance.Durable,
		Settings: map[string]string{"max_wal_size": "4GB", "wal_keep_size": "2GB"}})
	if err != nil {
		return err
	}
	defer func() { _ = in.Stop(context.Background(), instance.Fast) }()
	purl := in.ConnString("", "")
	t0 := time.Now()
	if out, err := exec.CommandContext(ctx, pg.Tool("pgbench"), "-i", "-q", "-I", "dtGvp", "-s", strconv.Itoa(scale), purl).CombinedOutput(); err != nil {
		return fmt.Errorf("pgbench -i: %v: %s", err, out)
	}
	gen := time.Since(t0)

	// The standby pgfork keeps: made by branches.Open.
	lay := statedir.Layout{Root: filepath.Join(work, "state")}
	t0 = time.Now()
	// As pgfork serve runs them: creates from the source share a snapshot
	// made at most DefaultSourceMaxAge ago.
	m, err := branches.Open(ctx, branches.Options{Layout: lay, Installation: pg, User: user, SourceMaxAge: branches.DefaultSourceMaxAge,
		Sources: []branches.Source{{Name: "src", Kind: branches.SourceStandby, PrimaryURL: purl}}})
	if err != nil {
		return err
	}
	standbyMade := time.Since(t0)
	defer func() {
		m.StopAll(context.Background())
		m.Close()
		_ = cluster.Down(context.Background(), lay, "standby.src", cluster.DownOptions{Timeout: 30 * time.Second})
	}()
	e, err := cluster.Get(lay, "standby.src")
	if err != nil {
		return err
	}
	surl := (&instance.Instance{SocketDir: e.SocketDir, Port: e.Port}).ConnString("", "")
	sdir := filepath.Join(branches.Dir(lay), "standby", "src")
	srcSize := dirBlocks(sdir)
	var dbSize int64
	if err := queryOne(ctx, surl, "SELECT pg_database_size('postgres')", &dbSize); err != nil {
		return err
	}

	// The load on the primary, for the rest of this size.
	loadCtx, stopLoad := context.WithCancel(ctx)
	defer stopLoad()
	load := exec.CommandContext(loadCtx, pg.Tool("pgbench"), "-n", "-c", "2", "-j", "2", "-R", strconv.Itoa(bb.tps), "-T", "86400", purl)
	if err := load.Start(); err != nil {
		return err
	}
	defer func() { stopLoad(); _ = load.Wait() }()
	var commits0 int64
	_ = queryOne(ctx, purl, "SELECT xact_commit FROM pg_stat_database WHERE datname = 'postgres'", &commits0)
	loadStart := time.Now()

	r.Notef("### Source of %s (pgbench scale %d)", units.Bytes(srcSize), scale)
	r.Notef("Source: a standby of %s (database %s), made by pgfork from the primary in %s (pg_basebackup -R + start); the primary's data generated apart, before, in %s (pgbench -i). Load average now: %s.",
		units.Bytes(srcSize), units.Bytes(dbSize), Dur(standbyMade), Dur(gen), loadAvg())

	me := branches.Caller{Token: "bench"}
	var seq atomic.Int64
	create := func(o branches.CreateOptions) (time.Duration, branches.Branch, error) {
		o.Name = "b" + strconv.FormatInt(seq.Add(1), 10)
		t := time.Now()
		b, err := m.Create(ctx, me, o)
		if err != nil {
			return 0, b, err
		}
		if err := branchFirstQuery(ctx, b.URL()); err != nil {
			return 0, b, err
		}
		return time.Since(t), b, nil
	}
	dropBranches := func() {
		for _, b := range m.List(me).Branches {
			_ = m.Delete(ctx, me, b.Name)
		}
	}
	dropSnapshots := func(keep string) {
		for _, s := range m.List(me).Snapshots {
			if s.Name != keep {
				_ = m.DeleteSnapshot(me, s.Name)
			}
		}
	}
	defer func() { dropBranches(); dropSnapshots("") }()
	fromSource := branches.CreateOptions{Source: "src"}

	// Baseline: pg_basebackup of the same standby, start, first query.
	var base Sample
	for i := 0; i < 2; i++ {
		dst := filepath.Join(work, "basebackup"+strconv.Itoa(i))
		t := time.Now()
		if out, err := exec.CommandContext(ctx, pg.Tool("pg_basebackup"), "-d", surl, "-D", dst, "-X", "stream", "-c", "fast").CombinedOutput(); err != nil {
			return fmt.Errorf("pg_basebackup: %v: %s", err, out)
		}
		if o := user.Owner(); o != nil {
			if err := clone.ChownTree(dst, o.UID, o.GID); err != nil {
				return err
			}
		}
		bi, err := instance.Start(ctx, instance.Config{BinDir: pg.BinDir, Env: pg.Env(), DataDir: dst, User: user, Profile: instance.Durable})
		if err != nil {
			return err
		}
		if err := branchFirstQuery(ctx, bi.ConnString("", "")); err != nil {
			return err
		}
		base = append(base, time.Since(t))
		_ = bi.Stop(ctx, instance.Fast)
		_ = os.RemoveAll(dst)
	}

	// Create: 1, 5, 10 at once, straight from the source (each branch its
	// own online clone of the standby, recovered by the branch), then from
	// one snapshot of a branch of the source (recovery paid once, when
	// that branch was made: DBLab's way of preparing a snapshot). The 10
	// from the source stay for the lag measurement.
	rows := [][]string{{"pg_basebackup of the standby + start + first query (baseline)", "1", Dur(base.Median()), Dur(base.Median()), Dur(base.Median()), "1.0x", "-"}}
	var ten []branches.Branch
	type createRun struct {
		one, worst time.Duration
		replay     []int64
	}
	createRound := func(what string, o branches.CreateOptions, keep bool) (createRun, error) {
		var cr createRun
		for _, n := range []int{1, 5, 10} {
			var mu sync.Mutex
			var s Sample
			var made []branches.Branch
			var wg sync.WaitGroup
			var firstErr error
			t := time.Now()
			for i := 0; i < n; i++ {
				wg.Add(1)
				go func() {
					defer wg.Done()
					d, b, err := create(o)
					mu.Lock()
					defer mu.Unlock()
					if err != nil && firstErr == nil {
						firstErr = err
					}
					s = append(s, d)
					made = append(made, b)
				}()
			}
			wg.Wait()
			wall := time.Since(t)
			if firstErr != nil {
				return cr, firstErr
			}
			if n == 1 {
				cr.one = s.Median()
			}
			cr.worst = max(cr.worst, s.Quantile(1))
			var rep []int64
			for _, b := range made {
				rep = append(rep, replayed(filepath.Join(branches.Dir(lay), "data", b.Name)))
			}
			cr.replay = append(cr.replay, rep...)
			rows = append(rows, []string{what, strconv.Itoa(n), Dur(s.Median()), Dur(s.Quantile(1)), Dur(wall), Ratio(base.Median(), s.Median()), units.Bytes(medianInt(rep))})
			if n == 10 && keep {
				ten = made
			} else {
				dropBranches()
			}
		}
		return cr, nil
	}
	src1, err := createRound("branch create + first query, from the source", fromSource, true)
	if err != nil {
		return err
	}
	// The 10 from the source: the standby's lag while they run pgbench.
	if err := bb.lag(ctx, r, purl, ten); err != nil {
		return err
	}
	dropBranches()
	t0 = time.Now()
	_, b0, err := create(fromSource)
	if err != nil {
		return err
	}
	if _, err := m.CreateSnapshot(ctx, me, branches.SnapshotOptions{Name: "base", Branch: b0.Name}); err != nil {
		return err
	}
	prep := time.Since(t0)
	dropBranches()
	fromSnap := branches.CreateOptions{Snapshot: "base"}
	snap1, err := createRound("branch create + first query, from a snapshot of a branch of the source", fromSnap, false)
	if err != nil {
		return err
	}
	r.Table([]string{"what", "at once", "median per branch", "slowest", "wall", "vs baseline (median)", "WAL each branch replayed at start (median)"}, rows)
	r.Notef("The snapshot \"base\" (a branch of the source, recovered and checkpointed once, then snapshotted: DBLab's way of preparing a snapshot) was made in %s, before its rows.", Dur(prep))
	for _, x := range []struct {
		what string
		c    createRun
	}{{"from the source", src1}, {"from a snapshot", snap1}} {
		r.Target(x.c.worst <= 2*time.Second, "every branch %s to first query ≤ 2 s (1, 5 and 10 at once) at %s: slowest %s, one alone %s",
			x.what, units.Bytes(srcSize), Dur(x.c.worst), Dur(x.c.one))
		r.Target(base.Median() >= 10*x.c.one, "≥ 10x pg_basebackup + start, %s, at %s: %s (%s against %s)", x.what, units.Bytes(srcSize), Ratio(base.Median(), x.c.one), Dur(x.c.one), Dur(base.Median()))
	}

	// Reset and snapshot.
	var rows2 [][]string
	var resets []time.Duration
	var snapOfBranch time.Duration
	for _, x := range []struct {
		what string
		o    branches.CreateOptions
	}{{"from the source", fromSource}, {"from the snapshot", fromSnap}} {
		_, b, err := create(x.o)
		if err != nil {
			return err
		}
		var rs, ss Sample
		for i := 0; i < 3; i++ {
			t := time.Now()
			if _, err := m.Reset(ctx, me, b.Name); err != nil {
				return err
			}
			rs = append(rs, time.Since(t))
			if x.o.Source != "" {
				t = time.Now()
				if _, err := m.CreateSnapshot(ctx, me, branches.SnapshotOptions{Name: "s" + strconv.Itoa(i), Branch: b.Name}); err != nil {
					return err
				}
				ss = append(ss, time.Since(t))
			}
		}
		resets = append(resets, rs.Median())
		rows2 = append(rows2, []string{"reset of a branch made " + x.what + " (stop, new copy of its snapshot, start, same port)", Dur(rs.Median()), Dur(rs.Quantile(1))})
		if len(ss) > 0 {
			rows2 = append(rows2, []string{"snapshot of a running branch", Dur(ss.Median()), Dur(ss.Quantile(1))})
			snapOfBranch = ss.Median()
		}
	}
	var sss Sample
	for i := 0; i < 3; i++ {
		t := time.Now()
		if _, err := m.CreateSnapshot(ctx, me, branches.SnapshotOptions{Name: "src" + strconv.Itoa(i), Source: "src"}); err != nil {
			return err
		}
		sss = append(sss, time.Since(t))
	}
	rows2 = append(rows2, []string{"snapshot of the standby source (online clone, the standby keeps running)", Dur(sss.Median()), Dur(sss.Quantile(1))})
	r.Table([]string{"what", "median of 3", "slowest"}, rows2)
	r.Target(resets[0] <= time.Second, "reset ≤ 1 s, branch made from the source, at %s: %s", units.Bytes(srcSize), Dur(resets[0]))
	r.Target(resets[1] <= time.Second, "reset ≤ 1 s, branch made from a snapshot, at %s: %s", units.Bytes(srcSize), Dur(resets[1]))
	r.Target(snapOfBranch <= time.Second, "snapshot of a branch ≤ 1 s at %s: %s", units.Bytes(srcSize), Dur(snapOfBranch))
	r.Target(sss.Median() <= time.Second, "snapshot of the source ≤ 1 s at %s: %s", units.Bytes(srcSize), Dur(sss.Median()))
	dropBranches()
	dropSnapshots("base")

	// Disk of 20 branches, each writing 1% of pgbench_accounts' pages.
	_ = exec.Command("sync").Run()
	baseCost := uniqueBytes(branches.Dir(lay)) - uniqueBytes(sdir)
	ctl, where, err := bb.diskDefaults(ctx, work, lay, srcSize)
	if err != nil {
		return err
	}
	drows := [][]string{{"the snapshot \"base\" itself, before the rows below (the pages its recovery wrote, the standby's pages it keeps)", units.Bytes(baseCost), pct(baseCost, srcSize), "", "", "", ""}, ctl}
	var targets []func()
	for _, x := range []struct {
		what string
		o    branches.CreateOptions
	}{{"from the snapshot", fromSnap}, {"from the source", fromSource}} {
		row, target, err := bb.disk(ctx, r, m, me, create, x.o, lay, srcSize, x.what)
		if err != nil {
			return err
		}
		drows = append(drows, row)
		targets = append(targets, target)
		dropBranches()
	}
	r.Notef("Disk: each branch updates one row in each of 1%% of pgbench_accounts' pages (a TID scan), then a CHECKPOINT, so its pages are on disk. Bytes are what the branches and their snapshots cost the volume: the physical blocks under the branches' directory (standby, snapshots, branches), each counted once however many files share it (the union of FIEMAP extents), minus the standby's own, after minus before. Other users of the volume do not count, nor does the standby's own WAL growing; the standby's old pages and WAL that snapshots keep after the load rewrote them do. The pg_wal and other-files columns are each branch's stat blocks not in shared extents, summed: they include XFS's speculative copy-on-write preallocation (cowextsize), which XFS gives back minutes later, so they can add up to more than the first column.")
	r.Table([]string{"disk (unique blocks under the branches' directory, FIEMAP)", "bytes", "of the source", "of it: branches' pg_wal", "branches' other files", "median WAL replayed at start", "median buffers written by the end-of-recovery checkpoint"},
		append([][]string{{"source (the standby's data directory)", units.Bytes(srcSize), "100%", "", "", "", ""}}, drows...))
	r.Notef("%s", where)
	for _, t := range targets {
		t()
	}
	var commits1 int64
	_ = queryOne(ctx, purl, "SELECT xact_commit FROM pg_stat_database WHERE datname = 'postgres'", &commits1)
	r.Notef("The primary's load ran %s at %.0f commits per second (asked for %d tps). Load average now: %s.",
		Dur(time.Since(loadStart)), float64(commits1-commits0)/time.Since(loadStart).Seconds(), bb.tps, loadAvg())
	return nil
}

// lag samples the standby's lag with the 10 branches idle, then with each
// running pgbench.
func (bb *branchesBench) lag(ctx context.Context, r *Report, purl string, ten []branches.Branch) error {
	lagWin := 20 * time.Second
	idle, err := sampleLag(ctx, purl, lagWin, nil)
	if err != nil {
		return err
	}
	benchOut := make([][]byte, len(ten))
	busy, err := sampleLag(ctx, purl, lagWin, func(runCtx context.Context) func() {
		var wg sync.WaitGroup
		for i, b := range ten {
			wg.Add(1)
			go func() {
				defer wg.Done()
				benchOut[i], _ = exec.CommandContext(runCtx, bb.pg.Tool("pgbench"), "-n", "-c", "1", "-T", strconv.Itoa(int(lagWin/time.Second)), b.URL()).CombinedOutput()
			}()
		}
		return wg.Wait
	})
	if err != nil {
		return err
	}
	var branchTPS float64
	tpsRe := regexp.MustCompile(`tps = ([0-9.]+)`)
	for _, out := range benchOut {
		if mm := tpsRe.FindSubmatch(out); mm != nil {
			v, _ := strconv.ParseFloat(string(mm[1]), 64)
			branchTPS += v
		}
	}
	r.Table([]string{"standby lag behind the primary (sampled every 0.5 s for 20 s)", "bytes median", "bytes max", "replay_lag median", "replay_lag max"}, [][]string{
		idle.row("10 branches idle (baseline)"),
		busy.row(fmt.Sprintf("10 branches each running pgbench (1 client, %.0f tps in all)", branchTPS)),
	})
	r.Notef("Lag is the primary's pg_stat_replication for the standby: bytes = pg_current_wal_lsn() − replay_lsn, seconds = replay_lag. No target in the issue; the standby keeps following while branches run.")
	return nil
}

// disk creates 20 branches, has each update a contiguous 1% of
// pgbench_accounts and checkpoint (so its pages are on disk, not only in
// its WAL and shared buffers), and returns the rows of what they added:
// the unique blocks under the branches' directory (standby, snapshots,
// branches; other users of the volume do not count), and where they went.
// It stops early, and says so, when the volume runs short.
func (bb *branchesBench) disk(ctx context.Context, r *Report, m *branches.Manager, me branches.Caller,
	create func(branches.CreateOptions) (time.Duration, branches.Branch, error), o branches.CreateOptions,
	lay statedir.Layout, srcSize int64, what string) (row []string, target func(), err error) {
	dir := branches.Dir(lay)
	_ = exec.Command("sync").Run()
	sdir := filepath.Join(dir, "standby", "src")
	before := uniqueBytes(dir) - uniqueBytes(sdir)
	var names []string
	made := 0
	for i := 0; i < 20; i++ {
		if free := fsFree(dir); free < 4<<30 {
			r.Notef("Disk, %s: stopped after %d branches: only %s left on the volume.", what, made, units.Bytes(free))
			break
		}
		_, b, err := create(o)
		if err != nil {
			return nil, nil, err
		}
		names = append(names, b.Name)
		if err := writePages(ctx, b.URL(), i); err != nil {
			return nil, nil, err
		}
		made++
	}
	_ = exec.Command("sync").Run()
	used := uniqueBytes(dir) - uniqueBytes(sdir) - before
	var walOwn, dataOwn int64
	var rep, bufs []int64
	for _, n := range names {
		bd := filepath.Join(dir, "data", n)
		w := ownBytes(filepath.Join(bd, "pg_wal"))
		walOwn += w
		dataOwn += ownBytes(bd) - w
		rep = append(rep, replayed(bd))
		bufs = append(bufs, endOfRecoveryBuffers(bd))
	}
	label := fmt.Sprintf("**%d branches %s**", made, what)
	target = func() {
		r.Target(made == 20 && used <= srcSize/4, "20 branches %s add ≤ 25%% of the source: %d branches add %s (%s) to a source of %s",
			what, made, units.Bytes(used), pct(used, srcSize), units.Bytes(srcSize))
	}
	return []string{label, units.Bytes(used), pct(used, srcSize), units.Bytes(walOwn), units.Bytes(dataOwn),
		units.Bytes(medianInt(rep)), strconv.FormatInt(medianInt(bufs), 10)}, target, nil
}

// writePages updates one row in each of 1% of pgbench_accounts' pages
// (the i-th 1%) and checkpoints, so that the branch has written 1% of the
// table's pages and they are on disk, not only in its WAL and buffers.
func writePages(ctx context.Context, url string, i int) error {
	c, err := pgx.Connect(ctx, url)
	if err != nil {
		return err
	}
	defer c.Close(ctx)
	var pages int64
	if err := c.QueryRow(ctx, "SELECT relpages FROM pg_class WHERE relname = 'pgbench_accounts'").Scan(&pages); err != nil {
		return err
	}
	n := max(pages/100, 1)
	if _, err := c.Exec(ctx, `UPDATE pgbench_accounts SET abalance = abalance + 1
		WHERE ctid = ANY (ARRAY(SELECT format('(%s,1)', p)::tid FROM generate_series($1::bigint, $2::bigint) p))`, int64(i)*n, int64(i+1)*n-1); err != nil {
		return err
	}
	_, err = c.Exec(ctx, "CHECKPOINT")
	return err
}

// diskDefaults is the control of the disk measurement: 20 copies of the
// snapshot "base" started as branches by cluster.StartBranch (what the
// Manager calls) with PostgreSQL's default WAL settings instead of the
// Manager's branch settings, each writing 1% of the pages like the others.
func (bb *branchesBench) diskDefaults(ctx context.Context, work string, lay statedir.Layout, srcSize int64) ([]string, string, error) {
	dir := filepath.Join(work, "control")
	if err := os.Mkdir(dir, 0o755); err != nil {
		return nil, "", err
	}
	clay := statedir.Layout{Root: filepath.Join(work, "control-state")}
	defer os.RemoveAll(dir)
	var names []string
	defer func() {
		for _, n := range names {
			_ = cluster.Down(context.Background(), clay, n, cluster.DownOptions{Timeout: 30 * time.Second})
		}
	}()
	_ = exec.Command("sync").Run()
	sdir := filepath.Join(branches.Dir(lay), "standby", "src")
	before := uniqueBytes(branches.Dir(lay), dir) - uniqueBytes(sdir)
	var walOwn, dataOwn int64
	var copyT, startT Sample
	for i := 0; i < 20; i++ {
		d := filepath.Join(dir, "c"+strconv.Itoa(i))
		t := time.Now()
		if _, err := clone.Copy(ctx, filepath.Join(branches.Dir(lay), "snap", "base"), d, clone.Options{Sync: clone.SyncFS}); err != nil {
			return nil, "", err
		}
		copyT = append(copyT, time.Since(t))
		t = time.Now()
		st, err := cluster.StartBranch(ctx, clay, cluster.BranchOptions{Name: "c" + strconv.Itoa(i), DataDir: d, Kind: cluster.KindClone,
			Source: "bench", BinDir: bb.pg.BinDir, Env: bb.pg.Env(), PGVersion: bb.pg.Version, PGMajor: bb.pg.Major, User: bb.user,
			Settings: map[string]string{"wal_init_zero": "on", "wal_compression": "off"}})
		if err != nil {
			return nil, "", err
		}
		startT = append(startT, time.Since(t))
		names = append(names, st.Name)
		if err := writePages(ctx, st.URL, i); err != nil {
			return nil, "", err
		}
	}
	_ = exec.Command("sync").Run()
	used := uniqueBytes(branches.Dir(lay), dir) - uniqueBytes(sdir) - before
	for _, n := range names {
		d := filepath.Join(dir, n)
		w := ownBytes(filepath.Join(d, "pg_wal"))
		walOwn += w
		dataOwn += ownBytes(d) - w
	}
	note := fmt.Sprintf("Where a branch's start goes (the control's 20, one at a time): the reflink copy of the snapshot (clone.Copy, then syncfs) takes %s (median), the server's start %s.",
		Dur(copyT.Median()), Dur(startT.Median()))
	return []string{"20 copies of the snapshot started with PostgreSQL's default WAL settings (wal_init_zero on, wal_compression off): the control", units.Bytes(used), pct(used, srcSize),
		units.Bytes(walOwn), units.Bytes(dataOwn), "", ""}, note, nil
}

func medianInt(v []int64) int64 {
	if len(v) == 0 {
		return 0
	}
	s := append([]int64(nil), v...)
	sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
	return s[len(s)/2]
}

var (
	redoStartRe = regexp.MustCompile(`redo starts at ([0-9A-F]+)/([0-9A-F]+)`)
	redoDoneRe  = regexp.MustCompile(`redo done at ([0-9A-F]+)/([0-9A-F]+)`)
	endCkptRe   = regexp.MustCompile(`(?s)checkpoint starting: end-of-recovery.*?checkpoint complete: wrote ([0-9]+) buffers`)
)

// replayed is how much WAL a branch replayed at its first start, from its
// server log (0 when it replayed none).
func replayed(dataDir string) int64 {
	b, _ := os.ReadFile(filepath.Join(dataDir, instance.LogFileName))
	s, d := redoStartRe.FindSubmatch(b), redoDoneRe.FindSubmatch(b)
	if s == nil || d == nil {
		return 0
	}
	lsn := func(hi, lo []byte) int64 {
		h, _ := strconv.ParseInt(string(hi), 16, 64)
		l, _ := strconv.ParseInt(string(lo), 16, 64)
		return h<<32 | l
	}
	return max(lsn(d[1], d[2])-lsn(s[1], s[2]), 0)
}

// endOfRecoveryBuffers is how many buffers a branch's end-of-recovery
// checkpoint wrote, from its server log.
func endOfRecoveryBuffers(dataDir string) int64 {
	b, _ := os.ReadFile(filepath.Join(dataDir, instance.LogFileName))
	m := endCkptRe.FindSubmatch(b)
	if m == nil {
		return 0
	}
	n, _ := strconv.ParseInt(string(m[1]), 10, 64)
	return n
}

func fsFree(dir string) int64 {
	var st syscall.Statfs_t
	if syscall.Statfs(dir, &st) != nil {
		return 0
	}
	return int64(st.Bavail) * int64(st.Bsize)
}

func pct(x, of int64) string {
	if of == 0 {
		return "-"
	}
	return fmt.Sprintf("%.1f%%", 100*float64(x)/float64(of))
}

// lagSamples are the standby's lag samples: bytes and seconds behind.
type lagSamples struct {
	bytes []float64
	secs  []float64
}

func (l lagSamples) row(what string) []string {
	med := func(v []float64) float64 {
		if len(v) == 0 {
			return 0
		}
		s := append([]float64(nil), v...)
		sort.Float64s(s)
		return s[len(s)/2]
	}
	top := func(v []float64) float64 {
		t := 0.0
		for _, x := range v {
			t = max(t, x)
		}
		return t
	}
	return []string{what, units.Bytes(int64(med(l.bytes))), units.Bytes(int64(top(l.bytes))),
		fmt.Sprintf("%.3f s", med(l.secs)), fmt.Sprintf("%.3f s", top(l.secs))}
}

// sampleLag samples the primary's view of its standby every 0.5 s for
// window, while run (if any) runs; run starts its work and returns a
// function that waits for it.
func sampleLag(ctx context.Context, purl string, window time.Duration, run func(context.Context) func()) (lagSamples, error) {
	var l lagSamples
	c, err := pgx.Connect(ctx, purl)
	if err != nil {
		return l, err
	}
	defer c.Close(context.WithoutCancel(ctx))
	wait := func() {}
	if run != nil {
		wait = run(ctx)
	}
	defer wait()
	end := time.Now().Add(window)
	for time.Now().Before(end) {
		var b, s float64
		err := c.QueryRow(ctx, `SELECT coalesce(max(pg_wal_lsn_diff(pg_current_wal_lsn(), replay_lsn)), 0)::float8,
			coalesce(max(extract(epoch FROM replay_lag)), 0)::float8
			FROM pg_stat_replication WHERE state = 'streaming' AND application_name <> 'pg_basebackup'`).Scan(&b, &s)
		if err != nil {
			return l, err
		}
		l.bytes = append(l.bytes, b)
		l.secs = append(l.secs, s)
		select {
		case <-ctx.Done():
			return l, ctx.Err()
		case <-time.After(500 * time.Millisecond):
		}
	}
	return l, nil
}

func queryOne(ctx context.Context, url, q string, dst any) error {
	c, err := pgx.Connect(ctx, url)
	if err != nil {
		return err
	}
	defer c.Close(ctx)
	return c.QueryRow(ctx, q).Scan(dst)
}

// ownBytes is the disk a tree's regular files use in blocks no other file
// shares (FIEMAP's shared flag).
func ownBytes(dir string) int64 {
	var n int64
	_ = filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil || !d.Type().IsRegular() {
			return nil
		}
		fi, err := d.Info()
		if err != nil {
			return nil
		}
		st, ok := fi.Sys().(*syscall.Stat_t)
		if !ok {
			return nil
		}
		shared, err := clone.SharedBytes(p)
		if err != nil && !errors.Is(err, fs.ErrNotExist) {
			return nil
		}
		n += max(st.Blocks*512-shared, 0)
		return nil
	})
	return n
}

func dirBlocks(dir string) int64 {
	var n int64
	_ = filepath.Walk(dir, func(_ string, fi os.FileInfo, err error) error {
		if err == nil {
			if st, ok := fi.Sys().(*syscall.Stat_t); ok {
				n += st.Blocks * 512
			}
		}
		return nil
	})
	return n
}
