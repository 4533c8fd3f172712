package main

import (
	"context"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strings"

	"github.com/jackc/pgx/v5"

	"github.com/pgfork/pgfork/instance"
	"github.com/pgfork/pgfork/internal/units"
)

// The copy section's cluster-shaped tree (issue 60): a real PostgreSQL
// cluster of clusterTreeDBs databases (about 3,000 files of a few KiB,
// the size of a test cluster on PostgreSQL 15-17), where the copy engine's
// per-file cost shows and the large-file tree's does not. pgfork copy is
// measured against cp -a (--reflink=always where the filesystem clones)
// with and without one syncfs of the destination (sync -f), interleaved,
// from a warm page cache.
//
//	PGFORK_BENCH_COPY_CLUSTER_DBS  databases besides the 3 of initdb (default 8)
//	PGFORK_BENCH_COPY_CLUSTER_RUNS runs per contender (default 9)

// clusterCopyBound is issue 60's target: pgfork copy of a cluster-shaped
// tree within this multiple of cp -a (+ syncfs).
const clusterCopyBound = 1.2

// benchClusterCopyOn measures the cluster-shaped tree on one filesystem
// (parent is a directory on it; reflink says whether it clones).
func benchClusterCopyOn(ctx context.Context, r *Report, fsName, parent, bin string, reflink bool) error {
	dbs := copyEnvInt("PGFORK_BENCH_COPY_CLUSTER_DBS", 8)
	runs := max(copyEnvInt("PGFORK_BENCH_COPY_CLUSTER_RUNS", 9), 1)
	pg, user, err := benchPostgres("PGFORK_BENCH_PG_BIN")
	if err != nil {
		return err
	}
	dir, err := os.MkdirTemp(parent, "pgfork-bench-copy-cluster-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	_ = os.Chmod(dir, 0o755)
	src := filepath.Join(dir, "src")
	if err := instance.InitDB(ctx, instance.InitOptions{BinDir: pg.BinDir, Env: pg.Env(), DataDir: src, User: user, NoSync: true}); err != nil {
		return err
	}
	in, err := instance.Start(ctx, instance.Config{BinDir: pg.BinDir, Env: pg.Env(), DataDir: src, User: user, Profile: instance.Test})
	if err != nil {
		return err
	}
	conn, err := pgx.Connect(ctx, in.ConnString("postgres", "postgres"))
	if err == nil {
		for i := range dbs {
			if _, err = conn.Exec(ctx, fmt.Sprintf("CREATE DATABASE bench_%d", i)); err != nil {
				break
			}
		}
		conn.Close(ctx)
	}
	if serr := in.Stop(ctx, instance.Fast); err == nil {
		err = serr
	}
	if err != nil {
		return fmt.Errorf("making the cluster: %w", err)
	}
	files, bytes := 0, int64(0)
	_ = filepath.WalkDir(src, func(_ string, d fs.DirEntry, err error) error {
		if err == nil && d.Type().IsRegular() {
			if fi, ierr := d.Info(); ierr == nil {
				files++
				bytes += fi.Size()
			}
		}
		return nil
	})

	cpFlag := "--reflink=never"
	if reflink {
		cpFlag = "--reflink=always"
	}
	cp := "cp -a " + cpFlag
	contenders := []copyContender{
		{name: cp, cmd: func(s, d string) []string { return []string{"cp", "-a", cpFlag, s, d} }},
		{name: cp + " && sync -f", durable: true, cmd: func(s, d string) []string {
			return []string{"sh", "-c", `cp -a ` + cpFlag + ` "$1" "$2" && sync -f "$2"`, "sh", s, d}
		}},
		{name: "pgfork copy --sync none", cmd: func(s, d string) []string { return []string{bin, "copy", "-q", "--sync", "none", s, d} }},
		{name: "pgfork copy --sync syncfs", durable: true, cmd: func(s, d string) []string {
			return []string{bin, "copy", "-q", "--sync", "syncfs", s, d}
		}},
		{name: "pgfork copy (default: --sync fsync)", durable: true, cmd: func(s, d string) []string { return []string{bin, "copy", "-q", s, d} }},
	}
	dst := filepath.Join(dir, "dst")
	prepare := func() error {
		if err := os.RemoveAll(dst); err != nil {
			return err
		}
		// Warm: the source stays in the page cache, as a template cluster
		// that serve, up and branches copy again and again does; what was
		// written before is on disk, so no run pays for another's.
		_ = exec.Command("sync").Run()
		return nil
	}
	cases := make([]Case, len(contenders))
	for i, ct := range contenders {
		cases[i] = Case{Setup: func(int) error { return prepare() }, Fn: func(int) error {
			args := ct.cmd(src, dst)
			out, err := exec.CommandContext(ctx, args[0], args[1:]...).CombinedOutput()
			if err != nil {
				return fmt.Errorf("%s: %v: %s", ct.name, err, strings.TrimSpace(copyLastLine(string(out))))
			}
			return nil
		}}
	}
	samples, err := MeasureInterleaved(runs, cases...)
	if err != nil {
		return err
	}
	_ = os.RemoveAll(dst)
	bare, bareSync := samples[0].Median(), samples[1].Median()
	var rows [][]string
	for i, ct := range contenders {
		base := bare
		if ct.durable {
			base = bareSync
		}
		rows = append(rows, []string{ct.name, Dur(samples[i].Median()), Dur(samples[i].Quantile(0)) + " – " + Dur(samples[i].Quantile(1)),
			Times(samples[i].Median(), base)})
	}
	r.Notef("### %s: a cluster-shaped tree (PostgreSQL %s, %d databases: %d files, %s; %d runs each, interleaved)",
		fsName, pg.Version, dbs+3, files, units.Bytes(bytes), runs)
	r.Notef("Baseline and floor: `%s` (no sync) for `--sync none`, `%s && sync -f` (one syncfs) for the durable ones; "+
		"bound: %.1fx of it (issue 60).", cp, cp, clusterCopyBound)
	r.Table([]string{"contender", "median", "min – max", "vs cp (durable: vs cp && sync -f)"}, rows)
	none, syncfs, fsync := samples[2].Median(), samples[3].Median(), samples[4].Median()
	r.Target(float64(none) <= clusterCopyBound*float64(bare), "%s, cluster-shaped tree: pgfork copy --sync none ≤ %.1fx %s: %s vs %s = %s",
		fsName, clusterCopyBound, cp, Dur(none), Dur(bare), Times(none, bare))
	r.Target(float64(syncfs) <= clusterCopyBound*float64(bareSync), "%s, cluster-shaped tree: pgfork copy --sync syncfs ≤ %.1fx %s && sync -f: %s vs %s = %s",
		fsName, clusterCopyBound, cp, Dur(syncfs), Dur(bareSync), Times(syncfs, bareSync))
	r.Notef("What each file's fsync costs here (pgfork copy's default, the durability promise of `--sync fsync`): %s against one syncfs (%s vs %s).",
		Times(fsync, syncfs), Dur(fsync), Dur(syncfs))
	return nil
}
