package main

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/pgfork/pgfork/clone"
	"github.com/pgfork/pgfork/instance"
	"github.com/pgfork/pgfork/internal/units"
	"github.com/pgfork/pgfork/pgbin"
)

// The upgrade scenario reproduces seed 002's table on this machine: pgbench
// clusters of several scales upgraded from the old major (15) to the newest
// installed one by pg_dump | psql, pg_dump -Fd -j | pg_restore -j,
// pg_upgrade --copy, --link and --clone, and by `pgfork upgrade` (auto) with
// and without its rehearsal; plus a cluster of many small databases.
//
// Every contender starts from its own offline copy of a source cluster that
// is built once per scale (copies are reflinks on XFS, so they cost nothing
// and are not timed), and is timed to a usable new cluster: initdb with the
// old cluster's settings, the transfer, and for the pg_upgrade baselines
// what pg_upgrade tells the user to do next (start the server, vacuumdb
// --all --analyze-in-stages --missing-stats-only on 18+, stop). pgfork does
// the same steps itself. Everything runs on the XFS test filesystem.
//
//	PGFORK_BENCH_UPGRADE_SCALES  pgbench scales (default 10,50,100)
//	PGFORK_BENCH_UPGRADE_RUNS    runs of the slow contenders: dump/restore, --copy (default 1: long on 2 cores)
//	PGFORK_BENCH_UPGRADE_FAST_RUNS runs of --link, --clone and pgfork (default 3)
//	PGFORK_BENCH_UPGRADE_LOADED_SCALE pgbench scale of the cluster upgraded under load (700 ≈ 10.5 GB;
//	                             default 0: skipped; see upgrade_loaded.go)
//	PGFORK_BENCH_UPGRADE_DBS     databases in the many-databases cluster (default 1000; 0 skips it)
//	PGFORK_BENCH_UPGRADE_DIR     working directory on XFS (default $PGFORK_TEST_XFS or /mnt/pgfork-test/xfs)
//	PGFORK_BENCH_UPGRADE_EXT4    working directory for dump/restore and --copy, which need no
//	                             XFS and would fill the shared XFS image (default /var/tmp)
func init() {
	register(Scenario{Name: "upgrade", Issue: "pgfork upgrade vs pg_dump and pg_upgrade modes (issue 6)", Run: runUpgradeBench})
}

type upgBench struct {
	old, new pgbin.Installation
	user     *instance.OSUser
	bin      string // pgfork binary
	work     string
	ext4     string // working directory for the slow contenders, which need no XFS
	runs     int
	fastRuns int
}

func runUpgradeBench(ctx context.Context, r *Report) error {
	var scales []int
	for _, s := range strings.Split(envOr("PGFORK_BENCH_UPGRADE_SCALES", "10,50,100"), ",") {
		if n, err := strconv.Atoi(strings.TrimSpace(s)); err == nil && n > 0 { // "0": no pgbench scales
			scales = append(scales, n)
		}
	}
	runs := max(copyEnvInt("PGFORK_BENCH_UPGRADE_RUNS", 1), 1)
	ndbs := copyEnvInt("PGFORK_BENCH_UPGRADE_DBS", 1000)
	base := envOr("PGFORK_BENCH_UPGRADE_DIR", envOr("PGFORK_TEST_XFS", "/mnt/pgfork-test/xfs"))

	b := &upgBench{runs: runs, fastRuns: max(copyEnvInt("PGFORK_BENCH_UPGRADE_FAST_RUNS", 3), 1)}
	var err error
	if b.old, err = findPG(15); err != nil {
		return fmt.Errorf("PostgreSQL 15: %w", err)
	}
	all, _ := pgbin.Discover(pgbin.Options{StateDir: envOr("PGFORK_TEST_HOME", "/var/tmp/pgfork-test/home")})
	for _, in := range all {
		if in.Major > b.old.Major && in.Major > b.new.Major {
			b.new = in
		}
	}
	if b.new.BinDir == "" {
		return fmt.Errorf("no PostgreSQL newer than 15 found: run `pgfork pg install 18`")
	}
	if b.user, err = instance.ResolveUser(""); err != nil {
		return err
	}
	if fs, _ := clone.FSType(base); fs != "xfs" {
		r.Notef("warning: %s is %q, not XFS: clone mode is unavailable and copies are real copies", base, fs)
	}
	if b.work, err = os.MkdirTemp(base, "pgfork-bench-upgrade-"); err != nil {
		return err
	}
	defer os.RemoveAll(b.work)
	_ = os.Chmod(b.work, 0o755)
	if b.ext4, err = os.MkdirTemp(envOr("PGFORK_BENCH_UPGRADE_EXT4", "/var/tmp"), "pgfork-bench-upgrade-"); err != nil {
		return err
	}
	defer os.RemoveAll(b.ext4)
	_ = os.Chmod(b.ext4, 0o755)
	b.bin = filepath.Join(b.work, "pgfork")
	if out, err := goBuild(ctx, b.bin); err != nil {
		return fmt.Errorf("building pgfork: %v\n%s", err, out)
	}
	r.Notef("PostgreSQL %s → %s, on %s (XFS with reflink, a loop image; dump/restore and --copy on ext4 in %s, to spare the shared XFS image); %d run(s) per contender for dump/restore and --copy (PGFORK_BENCH_UPGRADE_RUNS), medians shown. "+
		"--link, --clone and pgfork run %d times each, in turns after the slow ones, and every run starts after a sync (no dirty data of the previous one). Each time runs from a stopped old cluster to a usable new one: initdb matching the old cluster, the transfer, and for the pg_upgrade "+
		"baselines the steps pg_upgrade prints at the end (start, vacuumdb --all --analyze-in-stages --missing-stats-only, stop); "+
		"\"pg_upgrade alone\" is the pg_upgrade command by itself. The dump/restore targets run with fsync=off, as in the seed.",
		b.old.Version, b.new.Version, base, b.ext4, runs, b.fastRuns)

	header := []string{"scale", "size", "pg_dump \\| psql", "pg_dump -Fd -j2 \\| pg_restore -j2", "pg_upgrade --copy", "pg_upgrade --link",
		"pg_upgrade --clone", "pgfork auto", "pgfork auto + rehearsal", "pgfork vs --link", "pgfork vs dump"}
	var rows [][]string
	var alone [][]string
	for _, scale := range scales {
		row, al, err := b.scale(ctx, r, scale)
		if err != nil {
			return fmt.Errorf("scale %d: %w", scale, err)
		}
		rows = append(rows, row)
		alone = append(alone, al)
		r.Table(header, rows[len(rows)-1:])
	}
	if len(rows) > 0 {
		r.Notef("All scales:")
		r.Table(header, rows)
		r.Notef("pg_upgrade by itself (without initdb, start and vacuumdb):")
		r.Table([]string{"scale", "--copy", "--link", "--clone"}, alone)
	}
	if ls := copyEnvInt("PGFORK_BENCH_UPGRADE_LOADED_SCALE", 0); ls > 0 {
		if err := b.loaded(ctx, r, ls); err != nil {
			return fmt.Errorf("scale %d under load: %w", ls, err)
		}
	}
	if ndbs > 0 {
		if err := b.manyDBs(ctx, r, ndbs); err != nil {
			return fmt.Errorf("%d databases: %w", ndbs, err)
		}
	}
	return nil
}

func envOr(k, def string) string {
	if v := os.Getenv(k); v != "" {
		return v
	}
	return def
}

// run runs a PostgreSQL tool as the PostgreSQL OS user in dir.
func (b *upgBench) run(ctx context.Context, in pgbin.Installation, dir, tool string, args ...string) error {
	cmd := b.user.Command(ctx, in.Env(), in.Tool(tool), args...)
	cmd.Dir = dir
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("%s %s: %v\n%s", tool, strings.Join(args, " "), err, lastLines(out.String(), 20))
	}
	return nil
}

func lastLines(s string, n int) string {
	l := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(l) > n {
		l = l[len(l)-n:]
	}
	return strings.Join(l, "\n")
}

// dir makes a fresh directory owned by the PostgreSQL user, on XFS (or
// under b.ext4 for names starting with "ext4-").
func (b *upgBench) dir(name string) (string, error) {
	d := filepath.Join(b.work, name)
	if strings.HasPrefix(name, "ext4-") {
		d = filepath.Join(b.ext4, name)
	}
	_ = os.RemoveAll(d)
	return d, b.user.MkdirOwned(d, 0o755)
}

// buildSource initdbs an old cluster and fills it with fill (running).
func (b *upgBench) buildSource(ctx context.Context, name string, fill func(inst *instance.Instance, sock string) error) (string, error) {
	d, err := b.dir(name)
	if err != nil {
		return "", err
	}
	data := filepath.Join(d, "data")
	if err := instance.InitDB(ctx, instance.InitOptions{BinDir: b.old.BinDir, Env: b.old.Env(), DataDir: data, User: b.user, NoSync: true}); err != nil {
		return "", err
	}
	inst, err := instance.Start(ctx, instance.Config{BinDir: b.old.BinDir, Env: b.old.Env(), DataDir: data, User: b.user, Profile: instance.Test,
		Settings: map[string]string{"max_wal_size": "4GB", "checkpoint_timeout": "30min"}, LogFile: filepath.Join(d, "server.log")})
	if err != nil {
		return "", err
	}
	ferr := fill(inst, inst.SocketDir)
	if err := inst.Stop(ctx, instance.Fast); err != nil && ferr == nil {
		ferr = err
	}
	return data, ferr
}

// copyOf makes an offline copy of a stopped source (a reflink clone on XFS).
func (b *upgBench) copyOf(ctx context.Context, src, name string) (string, error) {
	d, err := b.dir(name)
	if err != nil {
		return "", err
	}
	dst := filepath.Join(d, "old")
	_, err = clone.Copy(ctx, src, dst, clone.Options{Sync: clone.SyncNone})
	return dst, err
}

func (b *upgBench) initNew(ctx context.Context, dir string) (string, error) {
	nd := filepath.Join(dir, "new")
	f := false
	return nd, instance.InitDB(ctx, instance.InitOptions{BinDir: b.new.BinDir, Env: b.new.Env(), DataDir: nd, User: b.user, NoSync: true, Checksums: &f})
}

// pgUpgrade: initdb + pg_upgrade --mode (+ start, vacuumdb, stop when full).
// It returns the total and the time of pg_upgrade alone.
func (b *upgBench) pgUpgrade(ctx context.Context, src, mode string, full bool) (total, alone time.Duration, err error) {
	name := "c-" + mode
	if mode == "copy" {
		name = "ext4-c-copy"
	}
	old, err := b.copyOf(ctx, src, name)
	if err != nil {
		return 0, 0, err
	}
	dir := filepath.Dir(old)
	defer os.RemoveAll(dir)
	syscall.Sync() // start every contender with no dirty data of the previous one
	t0 := time.Now()
	nd, err := b.initNew(ctx, dir)
	if err != nil {
		return 0, 0, err
	}
	t1 := time.Now()
	if err := b.run(ctx, b.new, dir, "pg_upgrade", "-b", b.old.BinDir, "-B", b.new.BinDir, "-d", old, "-D", nd, "--"+mode); err != nil {
		return 0, 0, err
	}
	alone = time.Since(t1)
	if full {
		inst, err := instance.Start(ctx, instance.Config{BinDir: b.new.BinDir, Env: b.new.Env(), DataDir: nd, User: b.user, LogFile: filepath.Join(dir, "new.log")})
		if err != nil {
			return 0, 0, err
		}
		args := []string{"--all", "--analyze-in-stages", "-h", inst.SocketDir, "-p", strconv.Itoa(inst.Port), "-U", "postgres"}
		if b.new.Major >= 18 {
			args = append(args, "--missing-stats-only")
		}
		err = b.run(ctx, b.new, dir, "vacuumdb", args...)
		if serr := inst.Stop(ctx, instance.Fast); err == nil {
			err = serr
		}
		if err != nil {
			return 0, 0, err
		}
	}
	return time.Since(t0), alone, nil
}

// pgfork runs `pgfork upgrade` on a copy of src.
func (b *upgBench) pgfork(ctx context.Context, src string, rehearse bool) (time.Duration, error) {
	old, err := b.copyOf(ctx, src, "c-pgfork")
	if err != nil {
		return 0, err
	}
	dir := filepath.Dir(old)
	defer os.RemoveAll(dir)
	args := []string{"upgrade", old, filepath.Join(dir, "new"), "--to", strconv.Itoa(b.new.Major),
		"--old-bindir", b.old.BinDir, "--new-bindir", b.new.BinDir, "-q", "--json"}
	if !rehearse {
		args = append(args, "--no-rehearse")
	}
	syscall.Sync()
	t0 := time.Now()
	cmd := exec.CommandContext(ctx, b.bin, args...)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err != nil {
		return 0, fmt.Errorf("pgfork %s: %v\n%s", strings.Join(args, " "), err, lastLines(out.String(), 30))
	}
	el := time.Since(t0)
	if !strings.Contains(out.String(), `"mode": "clone"`) {
		return 0, fmt.Errorf("pgfork did not choose clone on XFS:\n%s", lastLines(out.String(), 40))
	}
	return el, nil
}

// dumpRestore: initdb + start both + (pg_dump | psql, or pg_dump -Fd -j2 and
// pg_restore -j2) of every database + stop. The old server's start is not
// timed (it runs in production).
func (b *upgBench) dumpRestore(ctx context.Context, src string, dbs []string, parallel bool) (time.Duration, error) {
	old, err := b.copyOf(ctx, src, "ext4-c-dump")
	if err != nil {
		return 0, err
	}
	dir := filepath.Dir(old)
	defer os.RemoveAll(dir)
	oi, err := instance.Start(ctx, instance.Config{BinDir: b.old.BinDir, Env: b.old.Env(), DataDir: old, User: b.user, LogFile: filepath.Join(dir, "old.log")})
	if err != nil {
		return 0, err
	}
	defer func() { _ = oi.Stop(context.WithoutCancel(ctx), instance.Fast) }()
	syscall.Sync()
	t0 := time.Now()
	nd, err := b.initNew(ctx, dir)
	if err != nil {
		return 0, err
	}
	ni, err := instance.Start(ctx, instance.Config{BinDir: b.new.BinDir, Env: b.new.Env(), DataDir: nd, User: b.user,
		Settings: map[string]string{"fsync": "off", "max_wal_size": "4GB"}, LogFile: filepath.Join(dir, "new.log")})
	if err != nil {
		return 0, err
	}
	defer func() { _ = ni.Stop(context.WithoutCancel(ctx), instance.Fast) }()
	oport, nport := strconv.Itoa(oi.Port), strconv.Itoa(ni.Port)
	for _, db := range dbs {
		if db != "postgres" {
			if err := b.run(ctx, b.new, dir, "createdb", "-h", ni.SocketDir, "-p", nport, "-U", "postgres", db); err != nil {
				return 0, err
			}
		}
		if parallel {
			dump := filepath.Join(dir, "dump-"+db)
			if err := b.run(ctx, b.new, dir, "pg_dump", "-h", oi.SocketDir, "-p", oport, "-U", "postgres", "-Fd", "-j2", "-f", dump, db); err != nil {
				return 0, err
			}
			if err := b.run(ctx, b.new, dir, "pg_restore", "-h", ni.SocketDir, "-p", nport, "-U", "postgres", "-j2", "-d", db, dump); err != nil {
				return 0, err
			}
			continue
		}
		sh := fmt.Sprintf("%q -h %q -p %s -U postgres %q | %q -q -h %q -p %s -U postgres -v ON_ERROR_STOP=1 -d %q >/dev/null",
			b.new.Tool("pg_dump"), oi.SocketDir, oport, db, b.new.Tool("psql"), ni.SocketDir, nport, db)
		cmd := b.user.Command(ctx, b.new.Env(), "/bin/sh", "-c", "set -e; "+sh)
		cmd.Dir = dir
		if out, err := cmd.CombinedOutput(); err != nil {
			return 0, fmt.Errorf("pg_dump | psql %s: %v\n%s", db, err, lastLines(string(out), 20))
		}
	}
	// Statistics, as after pg_upgrade to a major without kept statistics.
	if err := b.run(ctx, b.new, dir, "vacuumdb", "--all", "--analyze-in-stages", "-h", ni.SocketDir, "-p", nport, "-U", "postgres"); err != nil {
		return 0, err
	}
	if err := ni.Stop(ctx, instance.Fast); err != nil {
		return 0, err
	}
	return time.Since(t0), nil
}

func (b *upgBench) scale(ctx context.Context, r *Report, scale int) (row, alone []string, err error) {
	t0 := time.Now()
	src, err := b.buildSource(ctx, fmt.Sprintf("src-%d", scale), func(inst *instance.Instance, sock string) error {
		return b.run(ctx, b.old, filepath.Dir(sock), "pgbench", "-i", "-q", "-s", strconv.Itoa(scale), "-h", sock, "-p", strconv.Itoa(inst.Port), "-U", "postgres", "postgres")
	})
	if err != nil {
		return nil, nil, err
	}
	defer os.RemoveAll(filepath.Dir(src))
	size, _ := dirBytes(src)
	r.Notef("scale %d: source cluster of %s built in %s", scale, units.Bytes(size), Dur(time.Since(t0)))

	// The slow contenders work on ext4, from an (untimed) copy there.
	srcExt4, err := b.copyOf(ctx, src, fmt.Sprintf("ext4-src-%d", scale))
	if err != nil {
		return nil, nil, err
	}
	defer os.RemoveAll(filepath.Dir(srcExt4))
	dbs := []string{"postgres"}
	results := map[string]Sample{}
	alones := map[string]Sample{}
	steps := []struct {
		name string
		fn   func() (time.Duration, error)
	}{
		{"dump", func() (time.Duration, error) { return b.dumpRestore(ctx, srcExt4, dbs, false) }},
		{"dumpj", func() (time.Duration, error) { return b.dumpRestore(ctx, srcExt4, dbs, true) }},
		{"copy", nil}, {"link", nil}, {"clone", nil},
		{"pgfork", func() (time.Duration, error) { return b.pgfork(ctx, src, false) }},
		{"pgfork+r", func() (time.Duration, error) { return b.pgfork(ctx, src, true) }},
	}
	runOnce := func(name string, fn func() (time.Duration, error)) error {
		if fn == nil {
			mode, from := name, src
			if mode == "copy" {
				from = srcExt4
			}
			fn = func() (time.Duration, error) {
				total, al, err := b.pgUpgrade(ctx, from, mode, true)
				alones[mode] = append(alones[mode], al)
				return total, err
			}
		}
		d, err := fn()
		if err != nil {
			return fmt.Errorf("%s: %w", name, err)
		}
		results[name] = append(results[name], d)
		fmt.Printf("  scale %d %-9s %s\n", scale, name, Dur(d))
		return nil
	}
	// The slow contenders first; then the fast ones in turns, so that no
	// contender benefits from running when the disk is quieter.
	for _, st := range steps {
		if st.name == "dump" || st.name == "dumpj" || st.name == "copy" {
			for i := 0; i < b.runs; i++ {
				if err := runOnce(st.name, st.fn); err != nil {
					return nil, nil, err
				}
			}
		}
	}
	for i := 0; i < b.fastRuns; i++ {
		for _, st := range steps {
			if st.name != "dump" && st.name != "dumpj" && st.name != "copy" {
				if err := runOnce(st.name, st.fn); err != nil {
					return nil, nil, err
				}
			}
		}
	}
	m := func(k string) time.Duration { return results[k].Median() }
	row = []string{strconv.Itoa(scale), units.Bytes(size), Dur(m("dump")), Dur(m("dumpj")), Dur(m("copy")), Dur(m("link")), Dur(m("clone")),
		Dur(m("pgfork")), Dur(m("pgfork+r")), fmt.Sprintf("%+.0f%%", 100*(float64(m("pgfork"))/float64(m("link"))-1)), Ratio(m("dump"), m("pgfork"))}
	alone = []string{strconv.Itoa(scale), Dur(alones["copy"].Median()), Dur(alones["link"].Median()), Dur(alones["clone"].Median())}
	if scale == 100 || scale == maxScaleEnv() {
		r.Target(float64(m("pgfork")) <= 1.10*float64(m("link")), "scale %d: pgfork auto on XFS %s vs pg_upgrade --link %s (within 10%%)", scale, Dur(m("pgfork")), Dur(m("link")))
		r.Target(m("dump") >= 5*m("pgfork"), "scale %d: pgfork auto %s ≥5x faster than pg_dump | psql %s (%s)", scale, Dur(m("pgfork")), Dur(m("dump")), Ratio(m("dump"), m("pgfork")))
		r.Target(m("pgfork+r") <= 2*m("pgfork"), "scale %d: with rehearsal %s ≤ 2x without %s (%.2fx)", scale, Dur(m("pgfork+r")), Dur(m("pgfork")), float64(m("pgfork+r"))/float64(m("pgfork")))
	}
	return row, alone, nil
}

func maxScaleEnv() int {
	best := 0
	for _, s := range strings.Split(envOr("PGFORK_BENCH_UPGRADE_SCALES", "10,50,100"), ",") {
		if n, err := strconv.Atoi(strings.TrimSpace(s)); err == nil && n > best {
			best = n
		}
	}
	return best
}

func dirBytes(dir string) (int64, error) { return dirSize(dir), nil }
