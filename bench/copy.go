package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"io/fs"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/pgfork/pgfork/internal/units"
)

// The copy scenario: a PostgreSQL-shaped tree copied by `pgfork copy` (auto)
// against `cp -a --reflink=never` and `cp -a --reflink=always`, on ext4 and on
// XFS with reflink. Sizes are set by environment variables:
//
//	PGFORK_BENCH_COPY_SEGMENTS  number of 1 GiB segment files (default 3)
//	PGFORK_BENCH_COPY_SMALL     number of small files, 8-256 KiB (default 1000)
//	PGFORK_BENCH_COPY_RUNS      runs per contender on ext4 (default 3)
//	PGFORK_BENCH_COPY_RUNS_XFS  runs per contender on XFS (default 9: each
//	                            run there takes ~0.1 s, and reflink copies
//	                            of that length spread more than 3 runs can
//	                            settle)
//	PGFORK_BENCH_COPY_EXT4      parent directory on ext4 (default /var/tmp)
//	PGFORK_BENCH_COPY_TREES     which trees: large (the one above), cluster
//	                            (a real cluster's, copy_cluster.go); default both
func init() {
	register(Scenario{Name: "copy", Issue: "copy engine: pgfork copy vs cp -a (issue 2)", Run: runCopyBench})
}

func copyEnvInt(name string, def int) int {
	if v, err := strconv.Atoi(os.Getenv(name)); err == nil && v >= 0 {
		return v
	}
	return def
}

type copyContender struct {
	name string
	cmd  func(src, dst string) []string
	// durable: the contender makes the copy durable before it returns.
	durable bool
}

func runCopyBench(ctx context.Context, r *Report) error {
	segments := copyEnvInt("PGFORK_BENCH_COPY_SEGMENTS", 3)
	small := copyEnvInt("PGFORK_BENCH_COPY_SMALL", 1000)
	runs := max(copyEnvInt("PGFORK_BENCH_COPY_RUNS", 3), 1)
	xfsRuns := max(copyEnvInt("PGFORK_BENCH_COPY_RUNS_XFS", 9), 1)
	ext4Parent := os.Getenv("PGFORK_BENCH_COPY_EXT4")
	if ext4Parent == "" {
		ext4Parent = "/var/tmp"
	}

	work, err := os.MkdirTemp("", "pgfork-bench-copy-bin-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(work)
	bin := filepath.Join(work, "pgfork")
	if out, err := goBuild(ctx, bin); err != nil {
		return fmt.Errorf("building pgfork: %v\n%s", err, out)
	}

	root := os.Geteuid() == 0
	r.Notef("Tree: %d small files (8-256 KiB, random sizes) in base/<db>/ plus %d segment files of 1 GiB, random data "+
		"(PGFORK_BENCH_COPY_SEGMENTS / _SMALL to change). Runs per contender, interleaved: %d on ext4, %d on XFS; times are medians. "+
		"Each run starts from an empty destination%s.", small, segments, runs, xfsRuns,
		map[bool]string{true: " with the page cache dropped (`sync; echo 3 > /proc/sys/vm/drop_caches`), so sources are read cold (the pgfork and cp binaries are run once after the drop so that program loading is not timed)",
			false: "; not root, so the page cache is NOT dropped (warm reads)"}[root])
	r.Notef("`pgfork copy` runs with `--sync none` to match `cp -a` (neither fsyncs); the durable ones compare " +
		"`pgfork copy` at its default `--sync fsync` (every file and directory fsynced, files 64 at a time once all are copied) " +
		"and at `--sync syncfs` (one syncfs of the whole destination filesystem) with `cp -a --reflink=never && sync -f`.")

	contenders := []copyContender{
		{name: "cp -a --reflink=never", cmd: func(s, d string) []string { return []string{"cp", "-a", "--reflink=never", s, d} }},
		{name: "cp -a --reflink=always", cmd: func(s, d string) []string { return []string{"cp", "-a", "--reflink=always", s, d} }},
		{name: "pgfork copy (auto, --sync none)", cmd: func(s, d string) []string { return []string{bin, "copy", "-q", "--sync", "none", s, d} }},
		{name: "cp -a --reflink=never && sync -f", durable: true, cmd: func(s, d string) []string {
			return []string{"sh", "-c", `cp -a --reflink=never "$1" "$2" && sync -f "$2"`, "sh", s, d}
		}},
		{name: "pgfork copy (auto, --sync fsync)", durable: true, cmd: func(s, d string) []string { return []string{bin, "copy", "-q", s, d} }},
		{name: "pgfork copy (auto, --sync syncfs)", durable: true, cmd: func(s, d string) []string {
			return []string{bin, "copy", "-q", "--sync", "syncfs", s, d}
		}},
	}

	type fsRun struct {
		name, parent string
		runs         int
	}
	fss := []fsRun{{"ext4", ext4Parent, runs}}
	if x := os.Getenv("PGFORK_TEST_XFS"); x != "" {
		fss = append(fss, fsRun{"xfs", x, xfsRuns})
	} else {
		r.Notef("XFS half skipped: $PGFORK_TEST_XFS is not set (run `eval \"$(scripts/test-env.sh env)\"` as root after `scripts/test-env.sh up`).")
	}
	r.Notef("Load average at start: %s (2 cores and one disk shared with other work; times grow with contention).", loadAvg())
	trees := os.Getenv("PGFORK_BENCH_COPY_TREES")
	if trees == "" {
		trees = "large,cluster"
	}
	for _, f := range fss {
		if strings.Contains(trees, "large") {
			if err := benchCopyOn(ctx, r, f.name, f.parent, bin, contenders, segments, small, f.runs, root); err != nil {
				return fmt.Errorf("%s: %w", f.name, err)
			}
		}
		if strings.Contains(trees, "cluster") {
			if err := benchClusterCopyOn(ctx, r, f.name, f.parent, bin, f.name == "xfs"); err != nil {
				return fmt.Errorf("%s, cluster-shaped tree: %w", f.name, err)
			}
		}
	}
	r.Notef("Load average at the end: %s.", loadAvg())
	return nil
}

// loadAvg returns the 1, 5 and 15 minute load averages, or "unknown".
func loadAvg() string {
	b, err := os.ReadFile("/proc/loadavg")
	if f := strings.Fields(string(b)); err == nil && len(f) >= 3 {
		return strings.Join(f[:3], " ")
	}
	return "unknown"
}

func benchCopyOn(ctx context.Context, r *Report, fsName, parent, bin string, contenders []copyContender, segments, small, runs int, root bool) error {
	dir, err := os.MkdirTemp(parent, "pgfork-bench-copy-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	src := filepath.Join(dir, "src")
	total, err := makePGTree(src, segments, small)
	if err != nil {
		return err
	}
	fmt.Printf("%s: source tree of %s written in %s\n", fsName, units.Bytes(total), dir)
	dst := filepath.Join(dir, "dst")
	prepare := func() error {
		if err := os.RemoveAll(dst); err != nil {
			return err
		}
		_ = exec.Command("sync").Run()
		if root {
			_ = os.WriteFile("/proc/sys/vm/drop_caches", []byte("3\n"), 0o200)
		}
		// Cold data, warm programs: load both binaries back into the cache.
		_ = exec.Command(bin, "version").Run()
		_ = exec.Command("cp", "--version").Run()
		return nil
	}
	samples := make([]Sample, len(contenders))
	failed := make([]string, len(contenders))
	for i := 0; i < runs; i++ {
		for c, ct := range contenders {
			if failed[c] != "" {
				continue
			}
			if err := ctx.Err(); err != nil {
				return err
			}
			s, err := Measure(1, func(int) error { return prepare() }, func(int) error {
				args := ct.cmd(src, dst)
				out, err := exec.CommandContext(ctx, args[0], args[1:]...).CombinedOutput()
				if err != nil {
					return fmt.Errorf("%v: %s", err, strings.TrimSpace(copyLastLine(string(out))))
				}
				return nil
			})
			if err != nil {
				failed[c] = err.Error()
				continue
			}
			samples[c] = append(samples[c], s...)
		}
	}

	// One more pgfork run with --json to report what it did.
	_ = prepare()
	out, err := exec.CommandContext(ctx, bin, "copy", "--json", "--sync", "none", src, dst).Output()
	var sum struct {
		Files       int64            `json:"files"`
		Bytes       int64            `json:"bytes"`
		SharedBytes int64            `json:"shared_bytes"`
		Methods     map[string]int64 `json:"methods"`
	}
	if err == nil && json.Unmarshal(out, &sum) == nil {
		r.Notef("%s: pgfork copied %d files, %s; methods %v; %s shared with the source by copy-on-write.",
			fsName, sum.Files, units.Bytes(sum.Bytes), sum.Methods, units.Bytes(sum.SharedBytes))
	}
	_ = os.RemoveAll(dst)

	base := samples[0].Median()
	reflink := samples[1].Median()
	rows := [][]string{}
	for c, ct := range contenders {
		if failed[c] != "" {
			rows = append(rows, []string{ct.name, "fails: " + failed[c], "", "", ""})
			continue
		}
		m := samples[c].Median()
		vsReflink := "n/a"
		if failed[1] == "" {
			vsReflink = Ratio(reflink, m)
		}
		rows = append(rows, []string{ct.name, Dur(m), Dur(samples[c].Quantile(0)) + " – " + Dur(samples[c].Quantile(1)),
			Ratio(base, m), vsReflink})
	}
	r.Notef("### %s (%s, %d runs)", fsName, units.Bytes(total), runs)
	r.Table([]string{"contender", "median", "min – max", "speed-up vs cp --reflink=never", "vs cp --reflink=always"}, rows)

	pg := samples[2].Median()
	pgDurable := samples[4].Median()
	cpDurable := samples[3].Median()
	if failed[4] == "" && failed[2] == "" {
		cost := "nothing measurable"
		if pgDurable > pg {
			cost = Dur(pgDurable - pg)
		}
		msg := fmt.Sprintf("Durability costs %s on %s: pgfork copy --sync fsync %s vs --sync none %s", cost, fsName, Dur(pgDurable), Dur(pg))
		if failed[5] == "" {
			msg += fmt.Sprintf(", --sync syncfs %s", Dur(samples[5].Median()))
		}
		r.Notef("%s.", msg)
	}
	if err := syncProfile(ctx, r, fsName, src, dir, runs); err != nil {
		return fmt.Errorf("sync profile: %w", err)
	}
	switch fsName {
	case "xfs":
		if failed[2] == "" && failed[0] == "" {
			r.Target(float64(base)/float64(pg) >= 50, "on XFS pgfork copy is at least 50x faster than cp --reflink=never: %s vs %s (%s)",
				Dur(pg), Dur(base), Ratio(base, pg))
		}
		if failed[2] == "" && failed[1] == "" {
			r.Target(pg <= reflink*105/100, "on XFS pgfork copy is no slower than cp --reflink=always (5%% noise allowed): %s vs %s (%s)",
				Dur(pg), Dur(reflink), Ratio(reflink, pg))
		}
	default:
		if failed[2] == "" && failed[0] == "" {
			r.Target(pg <= base*105/100, "on %s pgfork copy is no slower than cp -a (5%% noise allowed): %s vs %s (%s; aim 1.3x)",
				fsName, Dur(pg), Dur(base), Ratio(base, pg))
		}
		if failed[4] == "" && failed[3] == "" {
			r.Notef("Durable: pgfork copy (fsync) %s vs cp -a && sync -f %s (%s).", Dur(pgDurable), Dur(cpDurable), Ratio(cpDurable, pgDurable))
		}
	}
	return nil
}

// syncProfile shows where the time of a durable copy goes: the small files
// of the tree (the segments would only add their write time) copied with
// io.Copy (copy_file_range: a reflink on XFS, an in-kernel copy on ext4)
// and fsynced (a) each right after its copy by 2 workers, as pgfork did
// before, and (b) all copied first, then fsynced 1, 8 and 64 at a time, as
// it does now. Totals are medians; fsync latencies are from the last run.
func syncProfile(ctx context.Context, r *Report, fsName, src, dir string, runs int) error {
	var files []string
	err := filepath.WalkDir(src, func(p string, d fs.DirEntry, err error) error {
		if err != nil || !d.Type().IsRegular() {
			return err
		}
		if fi, err := d.Info(); err == nil && fi.Size() < 1<<20 {
			files = append(files, p)
		}
		return nil
	})
	if err != nil {
		return err
	}
	type variant struct {
		name          string
		inline        bool
		workers, sync int
	}
	variants := []variant{
		{"copy + fsync each file, 2 workers (before)", true, 2, 0},
		{"copy all, then fsync 1 at a time", false, 2, 1},
		{"copy all, then fsync 8 at a time", false, 2, 8},
		{"copy all, then fsync 64 at a time (now)", false, 2, 64},
	}
	totals := make([]Sample, len(variants))
	syncs := make([]Sample, len(variants))
	lat := make([]Sample, len(variants))
	dst := filepath.Join(dir, "sync-profile")
	for range runs {
		for i, v := range variants {
			if err := ctx.Err(); err != nil {
				return err
			}
			if err := os.RemoveAll(dst); err != nil {
				return err
			}
			_ = exec.Command("sync").Run()
			if err := os.Mkdir(dst, 0o700); err != nil {
				return err
			}
			l := make(Sample, len(files))
			fds := make([]*os.File, len(files))
			fsyncOne := func(k int) error {
				t := time.Now()
				err := fds[k].Sync()
				l[k] = time.Since(t)
				if cerr := fds[k].Close(); err == nil {
					err = cerr
				}
				return err
			}
			copyOne := func(k int) error {
				in, err := os.Open(files[k])
				if err != nil {
					return err
				}
				defer in.Close()
				out, err := os.OpenFile(filepath.Join(dst, strconv.Itoa(k)), os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
				if err != nil {
					return err
				}
				fds[k] = out
				if _, err := io.Copy(out, in); err != nil {
					out.Close()
					return err
				}
				if v.inline {
					return fsyncOne(k)
				}
				return nil
			}
			start := time.Now()
			if err := parallel(len(files), v.workers, copyOne); err != nil {
				return err
			}
			syncStart := time.Now()
			if !v.inline {
				if err := parallel(len(files), v.sync, fsyncOne); err != nil {
					return err
				}
			}
			d, err := os.Open(dst)
			if err == nil {
				err = d.Sync()
				d.Close()
			}
			if err != nil {
				return err
			}
			totals[i] = append(totals[i], time.Since(start))
			syncs[i] = append(syncs[i], time.Since(syncStart))
			lat[i] = l
		}
	}
	_ = os.RemoveAll(dst)
	var rows [][]string
	for i, v := range variants {
		syncCol := "(inside copy)"
		if !v.inline {
			syncCol = Dur(syncs[i].Median())
		}
		rows = append(rows, []string{v.name, Dur(totals[i].Median()), syncCol,
			Dur(lat[i].Median()), Dur(lat[i].Quantile(0.99)), Dur(lat[i].Quantile(1))})
	}
	r.Notef("#### %s: where the fsync time goes (%d files of 8-256 KiB, copy_file_range, %d runs)", fsName, len(files), runs)
	r.Table([]string{"how", "total (median)", "fsync phase", "one fsync p50", "p99", "max"}, rows)
	return nil
}

// parallel runs fn(0..n-1) on the given number of goroutines and returns
// the first error.
func parallel(n, workers int, fn func(int) error) error {
	next := make(chan int)
	errc := make(chan error, workers)
	for range workers {
		go func() {
			var first error
			for k := range next {
				if first == nil {
					first = fn(k)
				}
			}
			errc <- first
		}()
	}
	for k := range n {
		next <- k
	}
	close(next)
	var first error
	for range workers {
		if err := <-errc; err != nil && first == nil {
			first = err
		}
	}
	return first
}

func copyLastLine(s string) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	return lines[len(lines)-1]
}

// makePGTree writes a PostgreSQL-shaped tree: small relation files in
// base/<db>/, a few global files, and 1 GiB segments (<relfilenode>.<n>).
func makePGTree(root string, segments, small int) (int64, error) {
	rng := rand.New(rand.NewPCG(2024, 7))
	buf := make([]byte, 1<<20)
	for i := range buf {
		buf[i] = byte(rng.Uint32())
	}
	write := func(p string, size int64) error {
		if err := os.MkdirAll(filepath.Dir(p), 0o700); err != nil {
			return err
		}
		f, err := os.OpenFile(p, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o600)
		if err != nil {
			return err
		}
		for off := int64(0); off < size; {
			n := min(int64(len(buf)), size-off)
			buf[0], buf[1] = byte(off>>20), byte(rng.Uint32()) // no two blocks alike
			if _, err := f.Write(buf[:n]); err != nil {
				f.Close()
				return err
			}
			off += n
		}
		return f.Close()
	}
	var total int64
	for i := 0; i < small; i++ {
		size := int64(8<<10) * int64(1+rng.IntN(32)) // 8 KiB .. 256 KiB, whole pages
		p := filepath.Join(root, "base", strconv.Itoa(1+i%4*16383), strconv.Itoa(16384+i))
		if err := write(p, size); err != nil {
			return 0, err
		}
		total += size
	}
	for i := 0; i < segments; i++ {
		name := "24576"
		if i > 0 {
			name += "." + strconv.Itoa(i)
		}
		if err := write(filepath.Join(root, "base", "16384", name), 1<<30); err != nil {
			return 0, err
		}
		total += 1 << 30
	}
	if err := os.MkdirAll(filepath.Join(root, "pg_wal"), 0o700); err != nil {
		return 0, err
	}
	if err := write(filepath.Join(root, "global", "pg_control"), 8192); err != nil {
		return 0, err
	}
	_ = exec.Command("sync").Run()
	return total + 8192, nil
}
