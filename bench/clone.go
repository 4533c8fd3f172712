package main

// Scenario "clone": a copy of a running ~2 GB cluster under write load,
// `pgfork clone --online` against `pg_basebackup -D … -X stream -c fast`, on
// XFS with reflink and on ext4.
//
// Environment:
//
//	PGFORK_BENCH_CLONE_SCALE    pgbench scale of the source (default 130, ~2 GB)
//	PGFORK_BENCH_CLONE_RUNS     runs per contender (default 3)
//	PGFORK_BENCH_CLONE_EXT4     directory on ext4 for the cached source and copies (default /var/tmp/pgfork-bench-clone)
//	PGFORK_BENCH_CLONE_PG_BIN   PostgreSQL bin directory (default /usr/lib/postgresql/15/bin)
//	PGFORK_BENCH_CLONE_PREPARE  "1": only build the cached sources, measure nothing
//	PGFORK_TEST_XFS             the XFS reflink filesystem (scripts/test-env.sh)
//
// The source is built once per scale (initdb + pgbench -i, a few minutes at
// scale 130) and reused by later runs: <dir>/src-s<scale>, marked complete by
// <dir>/src-s<scale>.ready.

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgfork/pgfork/instance"
	"github.com/pgfork/pgfork/internal/units"
	"github.com/pgfork/pgfork/pgbin"
)

func init() {
	register(Scenario{Name: "clone", Issue: "online clone of a running cluster under load: pgfork clone --online vs pg_basebackup (issue 3)", Run: runCloneBench})
}

type cloneBenchEnv struct {
	pg    pgbin.Installation
	user  *instance.OSUser
	bin   string // pgfork binary
	scale int
}

func runCloneBench(ctx context.Context, r *Report) error {
	scale := max(copyEnvInt("PGFORK_BENCH_CLONE_SCALE", 130), 1)
	runs := max(copyEnvInt("PGFORK_BENCH_CLONE_RUNS", 3), 1)
	ext4 := os.Getenv("PGFORK_BENCH_CLONE_EXT4")
	if ext4 == "" {
		ext4 = "/var/tmp/pgfork-bench-clone"
	}
	pg, user, err := benchPostgres("PGFORK_BENCH_CLONE_PG_BIN")
	if err != nil {
		return err
	}
	work, err := os.MkdirTemp("", "pgfork-bench-clone-bin-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(work)
	e := &cloneBenchEnv{pg: pg, user: user, bin: filepath.Join(work, "pgfork"), scale: scale}
	if out, err := goBuild(ctx, e.bin); err != nil {
		return fmt.Errorf("building pgfork: %v\n%s", err, out)
	}

	type target struct{ name, dir string }
	targets := []target{{"ext4", ext4}}
	if x := os.Getenv("PGFORK_TEST_XFS"); x != "" {
		targets = append([]target{{"xfs", filepath.Join(x, "pgfork-bench-clone")}}, targets...)
	} else {
		r.Notef("PGFORK_TEST_XFS is not set: XFS not measured (run scripts/test-env.sh)")
	}
	for _, t := range targets {
		if err := e.user.MkdirOwned(t.dir, 0o755); err != nil {
			return err
		}
	}
	// Build the source once on ext4; the XFS one is a plain copy of it.
	ext4Src, err := e.prepare(ctx, ext4, "")
	if err != nil {
		return err
	}
	srcs := map[string]string{}
	for _, t := range targets {
		if t.name == "ext4" {
			srcs[t.name] = ext4Src
		} else if srcs[t.name], err = e.prepare(ctx, t.dir, ext4Src); err != nil {
			return err
		}
	}
	if os.Getenv("PGFORK_BENCH_CLONE_PREPARE") == "1" {
		r.Notef("PGFORK_BENCH_CLONE_PREPARE=1: sources prepared, nothing measured")
		return nil
	}

	r.Notef("Source: a PostgreSQL %s cluster of pgbench scale %d (%s on disk without pg_wal), durable settings, running `pgbench -c 2 -j 2` "+
		"(tpcb-like) for the whole measurement. %d runs per contender, alternating; times are medians, from command start "+
		"to exit. Both make the copy durable (pgfork's default `--sync fsync`; pg_basebackup fsyncs by default) and both "+
		"ask for a fast checkpoint. The page cache is not dropped (the source is running and hot either way). "+
		"PGFORK_BENCH_CLONE_SCALE / _RUNS change the size and the number of runs.", pg.Version, scale, units.Bytes(dirSize(ext4Src)), runs)
	r.Notef("Load average at start: %s.", loadAvg())

	var rows [][]string
	for _, t := range targets {
		res, err := e.measure(ctx, srcs[t.name], t.dir, runs)
		if err != nil {
			return fmt.Errorf("%s: %w", t.name, err)
		}
		pm, bm := res.pgfork.Median(), res.basebackup.Median()
		rows = append(rows, []string{t.name, Dur(pm), Dur(bm), Ratio(bm, pm), units.Bytes(res.bytes), units.Bytes(res.shared),
			res.phases, joinDurs(res.pgfork), joinDurs(res.basebackup)})
		r.Notef("%s: the last pgfork clone started and %s", t.name, res.check)
		if t.name == "xfs" {
			r.Target(pm <= 3*time.Second && bm >= 10*pm, "XFS: pgfork clone --online %s (target ≤ 3 s) and %s faster than pg_basebackup (target ≥ 10x)", Dur(pm), Ratio(bm, pm))
		} else {
			r.Target(pm <= bm, "ext4: pgfork clone --online %s vs pg_basebackup %s (target: no slower)", Dur(pm), Dur(bm))
		}
	}
	r.Notef("Load average at the end: %s.", loadAvg())
	r.Table([]string{"filesystem", "pgfork clone --online", "pg_basebackup -X stream -c fast", "speed-up", "copied", "shared (CoW)", "pgfork phases (last run)", "pgfork runs", "pg_basebackup runs"}, rows)
	return nil
}

func joinDurs(s Sample) string {
	var p []string
	for _, d := range s {
		p = append(p, Dur(d))
	}
	return strings.Join(p, ", ")
}

// dirSize is the size of a data directory's files, WAL left out.
func dirSize(dir string) int64 {
	var n int64
	_ = filepath.Walk(dir, func(p string, fi os.FileInfo, err error) error {
		if err == nil && fi.IsDir() && p == filepath.Join(dir, "pg_wal") {
			return filepath.SkipDir
		}
		if err == nil && fi.Mode().IsRegular() {
			n += fi.Size()
		}
		return nil
	})
	return n
}

// prepare returns dir/src-s<scale>, building it when not already complete:
// from copyOf (cp -a) when given, else with initdb and pgbench -i.
func (e *cloneBenchEnv) prepare(ctx context.Context, dir, copyOf string) (string, error) {
	src := filepath.Join(dir, fmt.Sprintf("src-s%d", e.scale))
	ready := src + ".ready"
	if _, err := os.Stat(ready); err == nil {
		return src, nil
	}
	_ = os.RemoveAll(src)
	t0 := time.Now()
	if copyOf != "" {
		fmt.Printf("copying the source to %s...\n", src)
		if out, err := exec.CommandContext(ctx, "cp", "-a", copyOf, src).CombinedOutput(); err != nil {
			return "", fmt.Errorf("cp -a %s %s: %v\n%s", copyOf, src, err, out)
		}
	} else {
		fmt.Printf("building a pgbench scale %d source in %s (once; a few minutes)...\n", e.scale, src)
		if err := instance.InitDB(ctx, instance.InitOptions{BinDir: e.pg.BinDir, Env: e.pg.Env(), DataDir: src, User: e.user, NoSync: true}); err != nil {
			return "", err
		}
		in, err := instance.Start(ctx, instance.Config{BinDir: e.pg.BinDir, Env: e.pg.Env(), DataDir: src, User: e.user,
			Profile: instance.Test, Settings: map[string]string{"max_wal_size": "8GB"}, LogFile: src + ".log"})
		if err != nil {
			return "", err
		}
		_, err = e.run(ctx, e.pg.Tool("pgbench"), "-h", in.SocketDir, "-p", fmt.Sprint(in.Port), "-U", "postgres", "-i", "-q", "-s", fmt.Sprint(e.scale), "postgres")
		if serr := in.Stop(context.WithoutCancel(ctx), instance.Fast); err == nil {
			err = serr
		}
		if err != nil {
			return "", err
		}
	}
	if err := os.WriteFile(ready, nil, 0o644); err != nil {
		return "", err
	}
	fmt.Printf("source ready in %s\n", time.Since(t0).Round(time.Second))
	return src, nil
}

func (e *cloneBenchEnv) run(ctx context.Context, name string, args ...string) (string, error) {
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Env = append(os.Environ(), e.pg.Env()...)
	var out, errOut bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errOut
	if err := cmd.Run(); err != nil {
		return "", fmt.Errorf("%s %s: %v\n%s%s", filepath.Base(name), strings.Join(args, " "), err, out.String(), errOut.String())
	}
	return out.String(), nil
}

type cloneBenchResult struct {
	pgfork, basebackup Sample
	bytes, shared      int64
	phases, check      string
}

// measure runs the contenders against src (started, under pgbench load),
// writing their copies into dir.
func (e *cloneBenchEnv) measure(ctx context.Context, src, dir string, runs int) (*cloneBenchResult, error) {
	in, err := instance.Start(ctx, instance.Config{BinDir: e.pg.BinDir, Env: e.pg.Env(), DataDir: src, User: e.user,
		Profile: instance.Durable, LogFile: src + ".log"})
	if err != nil {
		return nil, err
	}
	defer in.Stop(context.WithoutCancel(ctx), instance.Fast)
	conn := []string{"-h", in.SocketDir, "-p", fmt.Sprint(in.Port), "-U", "postgres"}
	lctx, stopLoad := context.WithCancel(ctx)
	load := exec.CommandContext(lctx, e.pg.Tool("pgbench"), append(conn, "-n", "-c", "2", "-j", "2", "-T", "100000", "postgres")...)
	load.Env = append(os.Environ(), e.pg.Env()...)
	if err := load.Start(); err != nil {
		stopLoad()
		return nil, err
	}
	defer func() { stopLoad(); _ = load.Wait() }()
	time.Sleep(3 * time.Second)

	pgforkDst, bbDst := filepath.Join(dir, "clone-pgfork"), filepath.Join(dir, "clone-basebackup")
	clean := func(paths ...string) error {
		for _, p := range paths {
			if err := os.RemoveAll(p); err != nil {
				return err
			}
		}
		_ = exec.Command("sync").Run()
		return nil
	}
	res := &cloneBenchResult{}
	for i := 0; i < runs; i++ {
		var out string
		s, err := Measure(1, func(int) error { return clean(pgforkDst, pgforkDst+".tblspc") }, func(int) error {
			var err error
			out, err = e.run(ctx, e.bin, "clone", "--online", "--json", "-q", "--pg-bin", e.pg.BinDir, src, pgforkDst)
			return err
		})
		if err != nil {
			return nil, err
		}
		res.pgfork = append(res.pgfork, s...)
		var jr struct {
			Bytes  int64              `json:"bytes"`
			Shared int64              `json:"shared_bytes"`
			Phases map[string]float64 `json:"phases_ms"` // docs/cli.md: durations in ms
		}
		if err := json.Unmarshal([]byte(out), &jr); err != nil {
			return nil, fmt.Errorf("pgfork clone --json: %v\n%s", err, out)
		}
		res.bytes, res.shared = jr.Bytes, jr.Shared
		var ph []string
		for _, n := range []string{"backup start", "copy", "backup stop", "wal", "finish"} {
			ph = append(ph, n+" "+Dur(time.Duration(jr.Phases[n]*float64(time.Millisecond))))
		}
		res.phases = strings.Join(ph, ", ")

		s, err = Measure(1, func(int) error { return clean(bbDst) }, func(int) error {
			_, err := e.run(ctx, e.pg.Tool("pg_basebackup"), append(conn, "-D", bbDst, "-X", "stream", "-c", "fast")...)
			return err
		})
		if err != nil {
			return nil, err
		}
		res.basebackup = append(res.basebackup, s...)
	}
	// The last pgfork clone must be usable: start it and check pgbench's invariant.
	_ = os.RemoveAll(bbDst)
	res.check, err = e.checkClone(ctx, pgforkDst)
	if err != nil {
		return nil, err
	}
	_ = os.RemoveAll(pgforkDst)
	return res, nil
}

func (e *cloneBenchEnv) checkClone(ctx context.Context, dst string) (string, error) {
	t0 := time.Now()
	cl, err := instance.Start(ctx, instance.Config{BinDir: e.pg.BinDir, Env: e.pg.Env(), DataDir: dst, User: e.user, Profile: instance.Test})
	if err != nil {
		return "", fmt.Errorf("the pgfork clone does not start: %w", err)
	}
	startup := time.Since(t0)
	defer cl.Stop(context.WithoutCancel(ctx), instance.Immediate)
	c, err := pgx.Connect(ctx, cl.ConnString("", ""))
	if err != nil {
		return "", err
	}
	defer c.Close(ctx)
	var a, h, n int64
	if err := c.QueryRow(ctx, `SELECT (SELECT coalesce(sum(abalance),0) FROM pgbench_accounts),
		(SELECT coalesce(sum(delta),0) FROM pgbench_history), (SELECT count(*) FROM pgbench_history)`).Scan(&a, &h, &n); err != nil {
		return "", err
	}
	if a != h {
		return "", fmt.Errorf("pgbench invariant broken in the clone: sum(abalance) %d != sum(delta) %d", a, h)
	}
	return fmt.Sprintf("recovered in %s; pgbench's invariant holds (sum(abalance) = sum(delta) = %d over %d history rows)", Dur(startup), a, n), nil
}
