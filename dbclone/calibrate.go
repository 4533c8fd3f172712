package dbclone

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"sort"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgfork/pgfork/internal/errs"
	"github.com/pgfork/pgfork/internal/units"
)

// CalibrateOptions shape Calibrate.
type CalibrateOptions struct {
	// SizeMB is the size of the scratch template's data (default 64).
	SizeMB int
	// Runs per measurement; the median is kept (default 3).
	Runs int
	// Target is the server; nil: Inspect (without clone).
	Target *Target
	// Progress, when set, receives one line per step.
	Progress func(msg string)
	// Previous is an earlier calibration of the same server (e.g. the one
	// stored for it). Its Points at other shared_buffers sizes let this one
	// measure the per-GB-of-shared_buffers costs instead of taking them from
	// the built-in constants. Ignored when it was measured on another
	// server (SystemID) or with another fsync setting.
	Previous *Calibration
}

// Calibrate measures the advisor's constants on the server conn is connected
// to: it creates scratch databases named pgfork_calib_* (an empty template
// and one with SizeMB of data), copies each with every available strategy,
// times CHECKPOINT with clean and dirty buffers, and drops all it made, even
// on failure. It needs CREATEDB and the right to run CHECKPOINT (superuser
// or pg_checkpoint).
//
// A checkpoint's cost is separated into what it costs with no dirty buffer
// and what each dirty MB adds by timing CHECKPOINT with few and with many
// buffers dirtied (counted by pg_buffercache when installed, else the size
// of the data written). The cost of a clean checkpoint grows with
// shared_buffers (each one scans every buffer header), which one server at
// one size cannot tell from its fixed part: when opts.Previous holds a
// measurement at another shared_buffers size, the per-GB costs are the
// slopes between the sizes; otherwise they are the built-in ones and the
// fixed parts are what remains.
func Calibrate(ctx context.Context, conn *pgx.Conn, opts CalibrateOptions) (*Calibration, error) {
	if opts.SizeMB <= 0 {
		opts.SizeMB = 64
	}
	if opts.Runs <= 0 {
		opts.Runs = 3
	}
	say := func(format string, args ...any) {
		if opts.Progress != nil {
			opts.Progress(fmt.Sprintf(format, args...))
		}
	}
	t := opts.Target
	if t == nil {
		var err error
		if t, err = Inspect(ctx, conn, false); err != nil {
			return nil, err
		}
	}
	if t.Version < 15 {
		return nil, errs.New(errs.Unsupported, "calibration needs PostgreSQL 15 or later (CREATE DATABASE STRATEGY); this server is %d", t.Version).
			WithHint("before 15 there is only one strategy: nothing to choose")
	}
	if _, err := conn.Exec(ctx, "CHECKPOINT"); err != nil {
		return nil, sqlErr(ctx, err, "calibration needs to run CHECKPOINT").
			WithHint("connect as a superuser or a member of pg_checkpoint")
	}
	prefix := fmt.Sprintf("pgfork_calib_%d_%04x", os.Getpid(), rand.IntN(1<<16))
	small, big, copyName := prefix+"_empty", prefix+"_data", prefix+"_copy"
	cleanup := func() {
		c := context.WithoutCancel(ctx)
		for _, n := range []string{copyName, small, big} {
			_, _ = conn.Exec(c, "DROP DATABASE IF EXISTS "+quote(n)+" WITH (FORCE)")
		}
	}
	defer cleanup()

	say("creating scratch templates %s and %s (%d MB)", small, big, opts.SizeMB)
	for _, n := range []string{small, big} {
		if _, err := conn.Exec(ctx, CreateDatabaseSQL(n, "template0", "")+" STRATEGY FILE_COPY"); err != nil {
			return nil, createErr(ctx, conn, err, n, "template0", FileCopy)
		}
	}
	if err := fill(ctx, conn, big, opts.SizeMB); err != nil {
		return nil, err
	}
	sizes := map[string]float64{}
	for _, n := range []string{small, big} {
		var b int64
		if err := conn.QueryRow(ctx, `SELECT pg_database_size($1)`, n).Scan(&b); err != nil {
			return nil, sqlErr(ctx, err, "cannot size %q", n)
		}
		sizes[n] = float64(b) / (1 << 20)
	}
	strategies := []Strategy{WalLog, FileCopy}
	if supported(Clone, t) == nil {
		strategies = append(strategies, Clone)
	}
	times := map[Strategy]map[string]float64{}
	for _, s := range strategies {
		times[s] = map[string]float64{}
		for _, tmpl := range []string{small, big} {
			var sample []float64
			// One warm-up run, not counted: it sets hint bits and makes the
			// kernel write back the template's files (a reflink must).
			for i := -1; i < opts.Runs; i++ {
				if _, err := conn.Exec(ctx, "CHECKPOINT"); err != nil {
					return nil, sqlErr(ctx, err, "checkpoint failed")
				}
				t0 := time.Now()
				if err := execCreate(ctx, conn, copyName, tmpl, s, CreateOptions{}, t); err != nil {
					return nil, createErr(ctx, conn, err, copyName, tmpl, s)
				}
				if i >= 0 {
					sample = append(sample, msSince(t0))
				}
				if _, err := conn.Exec(ctx, "DROP DATABASE "+quote(copyName)); err != nil {
					return nil, sqlErr(ctx, err, "cannot drop %q", copyName)
				}
			}
			times[s][tmpl] = median(sample)
			say("samples %v", sample)
			say("%-9s from %-6s (%6.1f MB): %7.1f ms", s, map[string]string{small: "empty", big: "data"}[tmpl], sizes[tmpl], times[s][tmpl])
		}
	}
	// Checkpoints: clean, then with few and with many dirty buffers.
	var clean []float64
	for i := 0; i < opts.Runs; i++ {
		t0 := time.Now()
		if _, err := conn.Exec(ctx, "CHECKPOINT"); err != nil {
			return nil, sqlErr(ctx, err, "checkpoint failed")
		}
		clean = append(clean, msSince(t0))
	}
	hiMB := min(opts.SizeMB, int(t.SharedBuffers>>20)/4)
	loMB := max(hiMB/8, 1)
	type level struct{ mb, ms float64 }
	var levels []level
	for _, want := range []int{loMB, hiMB} {
		if hiMB <= 0 || (len(levels) > 0 && want <= loMB) {
			continue
		}
		var ts, ds []float64
		for i := 0; i < opts.Runs; i++ {
			written, err := dirty(ctx, conn, big, want)
			if err != nil {
				return nil, err
			}
			d, src := dirtyBytes(ctx, conn, t)
			if src != "pg_buffercache" || d <= 0 {
				d = written
			}
			t0 := time.Now()
			if _, err := conn.Exec(ctx, "CHECKPOINT"); err != nil {
				return nil, sqlErr(ctx, err, "checkpoint failed")
			}
			ts, ds = append(ts, msSince(t0)), append(ds, float64(d)/(1<<20))
		}
		levels = append(levels, level{median(ds), median(ts)})
		say("checkpoint with %.1f MB dirty: %.2f ms (samples %v)", median(ds), median(ts), ts)
	}
	c := Builtin(t.Fsync, t.CanClone)
	c.Source = fmt.Sprintf("calibrated %s on PostgreSQL %d (shared_buffers %s, fsync=%s)", time.Now().Format(time.RFC3339),
		t.Version, units.Bytes(t.SharedBuffers), onOff(t.Fsync))
	c.Measured, c.SystemID, c.Fsync = time.Now().UTC(), t.SystemID, t.Fsync
	gb := float64(t.SharedBuffers) / (1 << 30)
	dMB := sizes[big] - sizes[small]
	slope := func(s Strategy) float64 { return max((times[s][big]-times[s][small])/dMB, 0) }
	pt := CalibrationPoint{SharedBuffers: t.SharedBuffers, Checkpoint: median(clean), EmptyMB: sizes[small],
		WalLog: times[WalLog][small], FileCopy: times[FileCopy][small], Clone: times[Clone][small]}
	c.Points = mergePoints(opts.Previous, t, pt)
	c.CheckpointPerGB, c.WalLogPerGB, c.PerGBMeasured = perGB(c.Points, c.CheckpointPerGB, c.WalLogPerGB)
	c.WalLogPerMB = slope(WalLog)
	c.WalLogFixed = max(times[WalLog][small]-sizes[small]*c.WalLogPerMB-gb*c.WalLogPerGB, 0)
	// Both checkpoints of FILE_COPY, at this size, minus their scan.
	c.CheckpointFixed = max(2*median(clean)-gb*c.CheckpointPerGB, 0)
	ckpt := c.CheckpointFixed + gb*c.CheckpointPerGB
	c.CopyPerMB = slope(FileCopy)
	c.CopyFixed = max(times[FileCopy][small]-sizes[small]*c.CopyPerMB-ckpt, 0)
	if _, ok := times[Clone]; ok {
		c.ClonePerMB = slope(Clone)
		c.CloneFixed = max(times[Clone][small]-sizes[small]*c.ClonePerMB-ckpt, 0)
	}
	switch {
	case len(levels) == 2 && levels[1].mb > levels[0].mb:
		c.DirtyPerMB = max((levels[1].ms-levels[0].ms)/(levels[1].mb-levels[0].mb), 0)
	case len(levels) > 0 && levels[0].mb > 0:
		c.DirtyPerMB = max(levels[0].ms-median(clean), 0) / levels[0].mb
	}
	how := "built-in (calibrate again at another shared_buffers size to measure them)"
	if c.PerGBMeasured {
		how = fmt.Sprintf("measured between %d shared_buffers sizes", len(c.Points))
	}
	say("checkpoint (clean) %.2f ms; writing dirty buffers %.3f ms/MB; per GB of shared_buffers: checkpoints %.2f ms, wal_log %.2f ms, %s",
		median(clean), c.DirtyPerMB, c.CheckpointPerGB, c.WalLogPerGB, how)
	return c, nil
}

// mergePoints returns the previous calibration's points at other
// shared_buffers sizes (when it is of the same server and fsync setting)
// and p, sorted by size.
func mergePoints(prev *Calibration, t *Target, p CalibrationPoint) []CalibrationPoint {
	out := []CalibrationPoint{p}
	if prev != nil && prev.Fsync == t.Fsync && (prev.SystemID == t.SystemID || prev.SystemID == 0 || t.SystemID == 0) {
		for _, q := range prev.Points {
			if q.SharedBuffers != p.SharedBuffers && q.SharedBuffers > 0 {
				out = append(out, q)
			}
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].SharedBuffers < out[j].SharedBuffers })
	return out
}

// perGB fits the per-GB-of-shared_buffers costs to points at two or more
// shared_buffers sizes (least squares over the sizes): the two checkpoints
// of FILE_COPY cost twice the slope of a clean CHECKPOINT, and wal_log's is
// the slope of its copy of the empty template. Sizes less than 256 MB apart
// (or one size) tell nothing: the defaults are returned.
func perGB(pts []CalibrationPoint, ckptDefault, walDefault float64) (ckpt, wal float64, measured bool) {
	if len(pts) < 2 || float64(pts[len(pts)-1].SharedBuffers-pts[0].SharedBuffers) < 256<<20 {
		return ckptDefault, walDefault, false
	}
	fit := func(y func(CalibrationPoint) float64) float64 {
		var sx, sy, sxx, sxy float64
		n := float64(len(pts))
		for _, p := range pts {
			x := float64(p.SharedBuffers) / (1 << 30)
			sx, sy, sxx, sxy = sx+x, sy+y(p), sxx+x*x, sxy+x*y(p)
		}
		return (n*sxy - sx*sy) / (n*sxx - sx*sx)
	}
	ckpt = max(2*fit(func(p CalibrationPoint) float64 { return p.Checkpoint }), 0)
	wal = max(fit(func(p CalibrationPoint) float64 { return p.WalLog }), 0)
	return ckpt, wal, true
}

func msSince(t0 time.Time) float64 { return float64(time.Since(t0)) / float64(time.Millisecond) }

func median(v []float64) float64 {
	if len(v) == 0 {
		return 0
	}
	c := append([]float64(nil), v...)
	sort.Float64s(c)
	return c[len(c)/2]
}

// connectTo opens a second connection like conn's, to database db.
func connectTo(ctx context.Context, conn *pgx.Conn, db string) (*pgx.Conn, error) {
	cfg := conn.Config().Copy()
	cfg.Database = db
	c, err := pgx.ConnectConfig(ctx, cfg)
	if err != nil {
		return nil, sqlErr(ctx, err, "cannot connect to database %q", db)
	}
	return c, nil
}

// fill puts about mb MiB of table data into database db and checkpoints.
func fill(ctx context.Context, conn *pgx.Conn, db string, mb int) error {
	c, err := connectTo(ctx, conn, db)
	if err != nil {
		return err
	}
	defer c.Close(context.WithoutCancel(ctx))
	// About 28 rows of ~260 bytes per 8 kB page.
	rows := mb * 128 * 28
	if _, err := c.Exec(ctx, `CREATE TABLE pgfork_calib AS SELECT g AS id, repeat(md5(g::text), 6) AS pad FROM generate_series(1, $1::int) g`, rows); err != nil {
		return sqlErr(ctx, err, "cannot fill scratch database %q", db)
	}
	if _, err := c.Exec(ctx, "CREATE TABLE pgfork_dirty (id int, pad text)"); err != nil {
		return sqlErr(ctx, err, "cannot fill scratch database %q", db)
	}
	if _, err := conn.Exec(ctx, "CHECKPOINT"); err != nil {
		return sqlErr(ctx, err, "checkpoint failed")
	}
	return nil
}

// dirty leaves about mb MiB of dirty buffers in database db and returns how
// many bytes it wrote (the table's size).
func dirty(ctx context.Context, conn *pgx.Conn, db string, mb int) (int64, error) {
	c, err := connectTo(ctx, conn, db)
	if err != nil {
		return 0, err
	}
	defer c.Close(context.WithoutCancel(ctx))
	if _, err := c.Exec(ctx, `TRUNCATE pgfork_dirty`); err != nil {
		return 0, sqlErr(ctx, err, "cannot dirty buffers in %q", db)
	}
	if _, err := conn.Exec(ctx, "CHECKPOINT"); err != nil {
		return 0, sqlErr(ctx, err, "checkpoint failed")
	}
	// INSERT … SELECT (unlike CREATE TABLE AS) uses no ring buffer: the
	// pages stay dirty in shared buffers.
	if _, err := c.Exec(ctx, `INSERT INTO pgfork_dirty SELECT g, repeat(md5(g::text), 6) FROM generate_series(1, $1::int) g`, mb*128*28); err != nil {
		return 0, sqlErr(ctx, err, "cannot dirty buffers in %q", db)
	}
	var n int64
	if err := c.QueryRow(ctx, `SELECT pg_relation_size('pgfork_dirty')`).Scan(&n); err != nil {
		return 0, sqlErr(ctx, err, "cannot size the dirtied table in %q", db)
	}
	return n, nil
}
