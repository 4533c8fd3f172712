package main

// Scenario "branches": branches handed out by `pgfork serve` (issue 26),
// measured through the library serve uses (branches.Manager) on XFS with
// reflink: a branch of a running source from the request to its first
// query, for 1, 5 and 10 at once, against pg_basebackup + start of the same
// source; reset; snapshot; the disk 20 branches use after each writes 1%
// of the source's pages.
//
// Environment:
//
//	PGFORK_BENCH_BRANCHES_SCALE  pgbench scale of the source (default 50, ≈ 750 MiB; the issue's 5 GB is 350)
//	PGFORK_TEST_XFS              the XFS reflink filesystem (scripts/test-env.sh)
//	PGFORK_TEST_PG_BINS          PostgreSQL bin directories (the first is used)

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgfork/pgfork/branches"
	"github.com/pgfork/pgfork/instance"
	"github.com/pgfork/pgfork/internal/statedir"
	"github.com/pgfork/pgfork/internal/units"
	"github.com/pgfork/pgfork/pgbin"
)

func init() {
	register(Scenario{Name: "branches", Issue: "branches from serve: create to first query, reset, snapshot, disk (issue 26)", Run: runBranchesBench})
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
	scale := max(copyEnvInt("PGFORK_BENCH_BRANCHES_SCALE", 50), 1)
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
	work, err := os.MkdirTemp(xfs, "bench-branches-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(work)
	_ = os.Chmod(work, 0o755)
	src := filepath.Join(work, "src")
	if err := instance.InitDB(ctx, instance.InitOptions{BinDir: pg.BinDir, Env: pg.Env(), DataDir: src, User: user, NoSync: true}); err != nil {
		return err
	}
	in, err := instance.Start(ctx, instance.Config{BinDir: pg.BinDir, Env: pg.Env(), DataDir: src, User: user, Profile: instance.Durable,
		Settings: map[string]string{"max_wal_senders": "10", "checkpoint_timeout": "30min", "max_wal_size": "4GB"}})
	if err != nil {
		return err
	}
	defer func() { _ = in.Stop(context.Background(), instance.Fast) }()
	url := in.ConnString("", "")
	t0 := time.Now()
	if out, err := exec.CommandContext(ctx, pg.Tool("pgbench"), "-i", "-q", "-s", strconv.Itoa(scale), url).CombinedOutput(); err != nil {
		return fmt.Errorf("pgbench -i: %v: %s", err, out)
	}
	srcSize := dirBlocks(src)
	r.Notef("Source: PostgreSQL %s, pgbench scale %d (%s on disk, made in %s), running; XFS with reflink. Load average at start: %s.",
		pg.Version, scale, units.Bytes(srcSize), Dur(time.Since(t0)), loadAvg())

	lay := statedir.Layout{Root: filepath.Join(work, "state")}
	m, err := branches.Open(ctx, branches.Options{Layout: lay, Installation: pg, User: user,
		Sources: []branches.Source{{Name: "src", Kind: branches.SourceCluster, DataDir: src, ConnString: url}}})
	if err != nil {
		return err
	}
	defer m.Close()
	me := branches.Caller{Token: "bench"}
	var seq atomic.Int64
	create := func() (time.Duration, string, error) {
		name := "b" + strconv.FormatInt(seq.Add(1), 10)
		t := time.Now()
		b, err := m.Create(ctx, me, branches.CreateOptions{Name: name, Source: "src"})
		if err != nil {
			return 0, name, err
		}
		if err := branchFirstQuery(ctx, b.URL()); err != nil {
			return 0, name, err
		}
		return time.Since(t), name, nil
	}
	dropAll := func() {
		for _, b := range m.List(me).Branches {
			_ = m.Delete(ctx, me, b.Name)
		}
	}

	// Baseline: pg_basebackup of the same running source, start, first query.
	var base Sample
	for i := 0; i < 2; i++ {
		dst := filepath.Join(work, "basebackup"+strconv.Itoa(i))
		t := time.Now()
		if out, err := exec.CommandContext(ctx, pg.Tool("pg_basebackup"), "-d", url, "-D", dst, "-X", "stream", "-c", "fast").CombinedOutput(); err != nil {
			return fmt.Errorf("pg_basebackup: %v: %s", err, out)
		}
		if o := user.Owner(); o != nil {
			_ = exec.Command("chown", "-R", fmt.Sprintf("%d:%d", o.UID, o.GID), dst).Run()
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

	rows := [][]string{{"pg_basebackup + start + first query (baseline)", "1", Dur(base.Median()), Dur(base.Median()), "1.0x"}}
	var one time.Duration
	for _, n := range []int{1, 5, 10} {
		var mu sync.Mutex
		var s Sample
		var wg sync.WaitGroup
		var firstErr error
		t := time.Now()
		for i := 0; i < n; i++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				d, _, err := create()
				mu.Lock()
				defer mu.Unlock()
				if err != nil && firstErr == nil {
					firstErr = err
				}
				s = append(s, d)
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
		rows = append(rows, []string{"branch create + first query", strconv.Itoa(n), Dur(s.Median()), Dur(wall), Ratio(base.Median(), s.Median())})
		dropAll()
	}
	r.Table([]string{"what", "at once", "median per branch", "wall", "vs baseline"}, rows)
	r.Target(one <= 2*time.Second, "one branch to first query ≤ 2 s: %s", Dur(one))
	r.Target(base.Median() >= 10*one, "≥ 10x pg_basebackup + start: %s", Ratio(base.Median(), one))

	// Reset and snapshot.
	_, name, err := create()
	if err != nil {
		return err
	}
	var rs, ss Sample
	for i := 0; i < 3; i++ {
		t := time.Now()
		if _, err := m.Reset(ctx, me, name); err != nil {
			return err
		}
		rs = append(rs, time.Since(t))
		t = time.Now()
		if _, err := m.CreateSnapshot(ctx, me, branches.SnapshotOptions{Name: "s" + strconv.Itoa(i), Branch: name}); err != nil {
			return err
		}
		ss = append(ss, time.Since(t))
	}
	r.Table([]string{"what", "median of 3"}, [][]string{{"reset (stop, new copy of its snapshot, start, same port)", Dur(rs.Median())},
		{"snapshot of a running branch", Dur(ss.Median())}})
	r.Target(rs.Median() <= time.Second, "reset ≤ 1 s: %s", Dur(rs.Median()))
	r.Target(ss.Median() <= time.Second, "snapshot ≤ 1 s: %s", Dur(ss.Median()))
	dropAll()
	for i := 0; i < 3; i++ {
		_ = m.DeleteSnapshot(me, "s"+strconv.Itoa(i))
	}

	// Disk of 20 branches, each writing 1% of pgbench_accounts.
	before := fsUsed(work)
	for i := 0; i < 20; i++ {
		_, name, err := create()
		if err != nil {
			return err
		}
		b, _ := m.Get(me, name)
		c, err := pgx.Connect(ctx, b.URL())
		if err != nil {
			return err
		}
		// 1% of the table's pages: a contiguous 1% of its rows.
		n := 100000 * scale / 100
		_, err = c.Exec(ctx, "UPDATE pgbench_accounts SET abalance = abalance + 1 WHERE aid > $1 AND aid <= $2", i*n, (i+1)*n)
		c.Close(ctx)
		if err != nil {
			return err
		}
		_, _ = exec.Command("sync").CombinedOutput()
	}
	used := fsUsed(work) - before
	r.Table([]string{"what", "disk used"}, [][]string{{"source", units.Bytes(srcSize)},
		{"20 branches, each after updating 1% of pgbench_accounts (filesystem blocks used, df)", units.Bytes(used)}})
	r.Target(used <= srcSize/4, "20 branches add ≤ 25%% of the source: they add %s (%.0f%%) to a source of %s (each branch's new WAL segments count too)",
		units.Bytes(used), 100*float64(used)/float64(srcSize), units.Bytes(srcSize))
	dropAll()
	r.Table([]string{"reference (not measured here: needs ZFS and Docker)", "published figure"},
		[][]string{{"DBLab Engine 4.0 thin clone, 1 TiB database", "≈ 10 s to a ready clone (DBLab's documentation)"}})
	r.Notef("Not measured here: a 5 GB source as a standby under pgbench load and the standby's lag with 10 branches running pgbench (time ran out). Load average at end: %s.", loadAvg())
	return nil
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
