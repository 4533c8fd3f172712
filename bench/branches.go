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
		{"DBLab Engine thin clone of a 1 TiB database", "≈ 10 s (\"cloning a 1 TiB PostgreSQL database takes ~10 seconds\", DBLab Engine README, github.com/postgres-ai/database-lab-engine)"},
		{"DBLab Engine thin clone of a 10 TiB database", "< 2 s (\"cloning a 10 TiB PostgreSQL database can take less than 2 seconds\", DBLab Engine v3 README, pkg.go.dev/gitlab.com/postgres-ai/database-lab/v3)"},
		{"DBLab thin clone time vs size", "\"does not depend on the database size\" (postgres.ai/docs/questions-and-answers)"},
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
		Settings: map[string]string{"max_wal_senders": "20", "max_wal_size": "4GB", "wal_keep_size": "2GB"}})
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
	m, err := branches.Open(ctx, branches.Options{Layout: lay, Installation: pg, User: user,
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
	create := func() (time.Duration, branches.Branch, error) {
		name := "b" + strconv.FormatInt(seq.Add(1), 10)
		t := time.Now()
		b, err := m.Create(ctx, me, branches.CreateOptions{Name: name, Source: "src"})
		if err != nil {
			return 0, b, err
		}
		if err := branchFirstQuery(ctx, b.URL()); err != nil {
			return 0, b, err
		}
		return time.Since(t), b, nil
	}
	dropAll := func() {
		for _, b := range m.List(me).Branches {
			_ = m.Delete(ctx, me, b.Name)
		}
		for _, s := range m.List(me).Snapshots {
			_ = m.DeleteSnapshot(me, s.Name)
		}
	}
	defer dropAll()

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

	// Create: 1, 5, 10 at once; the 10 stay for the lag measurement.
	rows := [][]string{{"pg_basebackup of the standby + start + first query (baseline)", "1", Dur(base.Median()), Dur(base.Median()), Dur(base.Median()), "1.0x"}}
	var one time.Duration
	var worst time.Duration
	var ten []branches.Branch
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
				d, b, err := create()
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
			return firstErr
		}
		if n == 1 {
			one = s.Median()
		}
		worst = max(worst, s.Quantile(1))
		rows = append(rows, []string{"branch create + first query", strconv.Itoa(n), Dur(s.Median()), Dur(s.Quantile(1)), Dur(wall), Ratio(base.Median(), s.Median())})
		if n == 10 {
			ten = made
		} else {
			dropAll()
		}
	}
	r.Table([]string{"what", "at once", "median per branch", "slowest", "wall", "vs baseline (median)"}, rows)
	r.Target(worst <= 2*time.Second, "every branch to first query ≤ 2 s (1, 5 and 10 at once) at %s: slowest %s, one alone %s",
		units.Bytes(srcSize), Dur(worst), Dur(one))
	r.Target(base.Median() >= 10*one, "≥ 10x pg_basebackup + start at %s: %s (%s against %s)", units.Bytes(srcSize), Ratio(base.Median(), one), Dur(one), Dur(base.Median()))

	// Standby lag: 10 branches idle, then the same 10 running pgbench.
	lagWin := 20 * time.Second
	idle, err := sampleLag(ctx, purl, lagWin, nil)
	if err != nil {
		return err
	}
	var benchOut [][]byte
	busy, err := sampleLag(ctx, purl, lagWin, func(runCtx context.Context) func() {
		var wg sync.WaitGroup
		benchOut = make([][]byte, len(ten))
		for i, b := range ten {
			wg.Add(1)
			go func() {
				defer wg.Done()
				benchOut[i], _ = exec.CommandContext(runCtx, pg.Tool("pgbench"), "-n", "-c", "1", "-T", strconv.Itoa(int(lagWin/time.Second)), b.URL()).CombinedOutput()
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
	dropAll()

	// Reset and snapshot.
	_, b, err := create()
	if err != nil {
		return err
	}
	var rs, ss, sss Sample
	for i := 0; i < 3; i++ {
		t := time.Now()
		if _, err := m.Reset(ctx, me, b.Name); err != nil {
			return err
		}
		rs = append(rs, time.Since(t))
		t = time.Now()
		if _, err := m.CreateSnapshot(ctx, me, branches.SnapshotOptions{Name: "s" + strconv.Itoa(i), Branch: b.Name}); err != nil {
			return err
		}
		ss = append(ss, time.Since(t))
		t = time.Now()
		if _, err := m.CreateSnapshot(ctx, me, branches.SnapshotOptions{Name: "src" + strconv.Itoa(i), Source: "src"}); err != nil {
			return err
		}
		sss = append(sss, time.Since(t))
	}
	r.Table([]string{"what", "median of 3", "slowest"}, [][]string{
		{"reset of a branch (stop, new copy of its snapshot, start, same port)", Dur(rs.Median()), Dur(rs.Quantile(1))},
		{"snapshot of a running branch", Dur(ss.Median()), Dur(ss.Quantile(1))},
		{"snapshot of the standby source (online clone, standby keeps running)", Dur(sss.Median()), Dur(sss.Quantile(1))},
	})
	r.Target(rs.Median() <= time.Second, "reset ≤ 1 s at %s: %s", units.Bytes(srcSize), Dur(rs.Median()))
	r.Target(max(ss.Median(), sss.Median()) <= time.Second, "snapshot ≤ 1 s at %s: %s of a branch, %s of the source", units.Bytes(srcSize), Dur(ss.Median()), Dur(sss.Median()))
	dropAll()

	// Disk of 20 branches, each writing 1% of pgbench_accounts' pages.
	if err := bb.disk(ctx, r, m, me, create, work, lay, sdir, srcSize, scale); err != nil {
		return err
	}
	var commits1 int64
	_ = queryOne(ctx, purl, "SELECT xact_commit FROM pg_stat_database WHERE datname = 'postgres'", &commits1)
	r.Notef("The primary's load ran %s at %.0f commits per second (asked for %d tps). Load average now: %s.",
		Dur(time.Since(loadStart)), float64(commits1-commits0)/time.Since(loadStart).Seconds(), bb.tps, loadAvg())
	return nil
}

// disk creates 20 branches, has each update a contiguous 1% of
// pgbench_accounts and checkpoint (so its pages are on disk, not only in
// its WAL and shared buffers), and reports the filesystem's blocks used
// and where they went.
func (bb *branchesBench) disk(ctx context.Context, r *Report, m *branches.Manager, me branches.Caller,
	create func() (time.Duration, branches.Branch, error), work string, lay statedir.Layout, sdir string, srcSize int64, scale int) error {
	_ = exec.Command("sync").Run()
	before := fsUsed(work)
	standbyBefore := ownBytes(sdir)
	for i := 0; i < 20; i++ {
		_, b, err := create()
		if err != nil {
			return err
		}
		c, err := pgx.Connect(ctx, b.URL())
		if err != nil {
			return err
		}
		n := 100000 * scale / 100
		_, err = c.Exec(ctx, "UPDATE pgbench_accounts SET abalance = abalance + 1 WHERE aid > $1 AND aid <= $2", i*n, (i+1)*n)
		if err == nil {
			_, err = c.Exec(ctx, "CHECKPOINT")
		}
		c.Close(ctx)
		if err != nil {
			return err
		}
	}
	_ = exec.Command("sync").Run()
	used := fsUsed(work) - before
	dir := branches.Dir(lay)
	var walOwn, dataOwn, snapOwn int64
	for _, b := range m.List(me).Branches {
		bd := filepath.Join(dir, "data", b.Name)
		w := ownBytes(filepath.Join(bd, "pg_wal"))
		walOwn += w
		dataOwn += ownBytes(bd) - w
	}
	snaps, _ := os.ReadDir(filepath.Join(dir, "snap"))
	for _, s := range snaps {
		snapOwn += ownBytes(filepath.Join(dir, "snap", s.Name()))
	}
	standbyGrew := ownBytes(sdir) - standbyBefore
	rest := used - walOwn - dataOwn - snapOwn - standbyGrew
	r.Table([]string{"disk (filesystem blocks, df and FIEMAP)", "bytes", "of the source"}, [][]string{
		{"source (the standby's data directory)", units.Bytes(srcSize), "100%"},
		{"**20 branches, each after updating 1% of pgbench_accounts and a CHECKPOINT (df delta)**", units.Bytes(used), pct(used, srcSize)},
		{"… of it: the branches' pg_wal, blocks of their own", units.Bytes(walOwn), pct(walOwn, srcSize)},
		{"… of it: the branches' other files, blocks of their own", units.Bytes(dataOwn), pct(dataOwn, srcSize)},
		{"… of it: their origin snapshots, blocks of their own", units.Bytes(snapOwn), pct(snapOwn, srcSize)},
		{"… of it: the standby's own blocks grown (pages the load rewrote while snapshots keep the old ones)", units.Bytes(standbyGrew), pct(standbyGrew, srcSize)},
		{"… rest: blocks shared among snapshots and branches but no longer by the standby, metadata", units.Bytes(rest), pct(rest, srcSize)},
	})
	r.Target(used <= srcSize/4, "20 branches add ≤ 25%% of the source: they add %s (%s) to a source of %s", units.Bytes(used), pct(used, srcSize), units.Bytes(srcSize))
	return nil
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

func fsUsed(dir string) int64 {
	var st syscall.Statfs_t
	if syscall.Statfs(dir, &st) != nil {
		return 0
	}
	return int64(st.Blocks-st.Bfree) * int64(st.Bsize)
}
