package dbclone

import (
	"context"
	"fmt"
	"sort"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgfork/pgfork/internal/errs"
	"github.com/pgfork/pgfork/internal/units"
)

// Calibration holds the constants of the advisor's cost model. Times are in
// milliseconds; "per MB" means per MiB of template (pg_database_size), "per
// GB" per GiB of shared_buffers.
//
// The model:
//
//	wal_log   = WalLogFixed + shared_buffers × WalLogPerGB + size × WalLogPerMB
//	file_copy = checkpoints + CopyFixed + size × CopyPerMB
//	clone     = checkpoints + CloneFixed + size × ClonePerMB
//	checkpoints = CheckpointFixed + shared_buffers × CheckpointPerGB + dirty × DirtyPerMB
//
// The two checkpoints of FILE_COPY each scan every buffer header, so their
// cost grows with shared_buffers even when nothing is dirty; the first also
// writes the dirty buffers. WAL_LOG reads the template through shared
// buffers and grows only a little with them.
type Calibration struct {
	// Source says where the constants come from.
	Source string `json:"source"`
	// Fsync is the fsync setting they were measured with.
	Fsync bool `json:"fsync"`
	// Measured is when they were measured (zero for built-ins).
	Measured time.Time `json:"measured,omitzero"`
	// SystemID of the server calibrated, when known.
	SystemID uint64 `json:"system_id,omitempty"`

	WalLogFixed     float64 `json:"wal_log_fixed_ms"`
	WalLogPerGB     float64 `json:"wal_log_per_gb_ms"`
	WalLogPerMB     float64 `json:"wal_log_per_mb_ms"`
	CheckpointFixed float64 `json:"checkpoint_fixed_ms"` // both checkpoints of FILE_COPY, clean buffers
	CheckpointPerGB float64 `json:"checkpoint_per_gb_ms"`
	DirtyPerMB      float64 `json:"dirty_per_mb_ms"`
	CopyFixed       float64 `json:"copy_fixed_ms"`
	CopyPerMB       float64 `json:"copy_per_mb_ms"`
	CloneFixed      float64 `json:"clone_fixed_ms"`
	ClonePerMB      float64 `json:"clone_per_mb_ms"`

	// PerGBMeasured says CheckpointPerGB and WalLogPerGB were measured on
	// this server (from calibrations at two shared_buffers sizes), not
	// taken from the built-in constants.
	PerGBMeasured bool `json:"per_gb_measured,omitempty"`
	// Points are the raw measurements at each shared_buffers size
	// calibrated (the latest per size), kept so that a calibration after
	// shared_buffers changed can separate the fixed costs from the per-GB
	// ones.
	Points []CalibrationPoint `json:"points,omitempty"`
}

// CalibrationPoint is what Calibrate measured at one shared_buffers size:
// medians in milliseconds.
type CalibrationPoint struct {
	SharedBuffers int64 `json:"shared_buffers"`
	// Checkpoint is one CHECKPOINT with (almost) no dirty buffer.
	Checkpoint float64 `json:"checkpoint_ms"`
	// EmptyMB is the size of the empty scratch template, and WalLog,
	// FileCopy, Clone (0: not measured) the copies of it.
	EmptyMB  float64 `json:"empty_mb"`
	WalLog   float64 `json:"wal_log_ms"`
	FileCopy float64 `json:"file_copy_ms"`
	Clone    float64 `json:"clone_ms,omitempty"`
}

// Built-in constants, measured on this project's benchmark machine kind (2
// vCPUs shared with other jobs, virtio disk with an ext4 root, an XFS
// reflink loop image), with fsync=off (pgfork's test profile), on
// 2026-11-21 with the machine quiet (load average below 1.2), by a scratch
// program doing what bench/db.go does (drop the previous copy, CHECKPOINT,
// time CREATE DATABASE; 7–11 interleaved rounds per strategy; medians) on
// PostgreSQL 15 and 18.6 started by the instance package, shared_buffers
// 128 MB, 2 GB and (ext4) 8 GB; templates: an empty database (7.3–7.5 MB)
// and one of ~90 MB (bench's "~100 MB", generate_series rows + an index).
//
// What they showed, and where each constant comes from:
//
//   - One CHECKPOINT with no dirty buffer: 0.4–0.6 ms at 128 MB, 3.5–4.7 ms
//     at 2 GB, 19.7 ms at 8 GB: 2.0–2.4 ms per GB of shared_buffers on ext4,
//     1.6 on XFS, the scan of every buffer header. FILE_COPY runs two:
//     CheckpointFixed 1.0; CheckpointPerGB 5 on ext4 (two checkpoints
//     4.0–4.9 ms/GB; the empty template's file_copy grew 6.8 ms/GB from 128
//     MB to 8 GB) and 3.5 on XFS (two checkpoints 3.2; the empty template's
//     copy grew 3.7 ms/GB by clone and 5.3 by file_copy in medians, 3.1 in
//     the fastest runs, 128 MB → 2 GB). The previous value, 12 ms/GB for
//     both, came from runs under heavy load and overstated the checkpoints.
//   - Dirty buffers at checkpoint: 8, 32 and 96 MB dirtied by INSERT: 0.36–
//     0.38 ms/MB (ext4), 0.41–0.6 ms/MB (XFS): DirtyPerMB 0.45.
//   - wal_log of the empty template grew 1.7 ms/GB (ext4, 128 MB → 8 GB) and
//     not measurably on XFS: WalLogPerGB 1.7 and 0.
//   - Per MB (from the empty and the ~90 MB template): wal_log 1.4–1.66,
//     file_copy 0.31–0.61, clone 0.03–0.04.
//   - Fixed costs differ by filesystem, hence two sets: on ext4 creating and
//     removing the ~300 files of a database cost 13–50 ms whatever the
//     strategy (it drifts with the disk's other load), on XFS 6–15 ms. On
//     ext4 at 128 MB file_copy beat wal_log by 1.2–3.3 ms in every run; at
//     2 GB the two were within ±3–6 ms of each other (a tie within noise).
//
// The issue's own measurements of a 905 MB template (WAL_LOG 1.9–3.1 s,
// FILE_COPY 0.5 s on PG15/ext4; FILE_COPY+clone 0.19 s on PG18/XFS) agree
// with the per-MB terms.
var (
	// BuiltinNoFsync is for servers with fsync = off (pgfork's test profile)
	// whose data directory is not known to share blocks: measured on ext4.
	// Empty template at 128 MB, quiet: wal_log 13.9 ms, file_copy 12.7 ms.
	BuiltinNoFsync = Calibration{
		Source:          "built-in (measured on the pgfork benchmark machine, ext4, fsync=off)",
		WalLogFixed:     2.5,
		WalLogPerGB:     1.7,
		WalLogPerMB:     1.55,
		CheckpointFixed: 1.0,
		CheckpointPerGB: 5,
		DirtyPerMB:      0.45,
		CopyFixed:       6.5,
		CopyPerMB:       0.55,
		CloneFixed:      4.1,
		ClonePerMB:      0.035,
	}
	// BuiltinNoFsyncReflink is for servers with fsync = off whose data
	// directory shares blocks (CanClone): measured on XFS (reflink=1).
	// Empty template: wal_log 13.9–15.6 ms at 128 MB and 2 GB; file_copy
	// 9.1–10.6 ms at 128 MB, 17.3–19.1 ms at 2 GB; clone 5.9 and 12.9 ms.
	BuiltinNoFsyncReflink = Calibration{
		Source:          "built-in (measured on the pgfork benchmark machine, XFS reflink, fsync=off)",
		WalLogFixed:     3.4,
		WalLogPerGB:     0,
		WalLogPerMB:     1.48,
		CheckpointFixed: 1.0,
		CheckpointPerGB: 3.5,
		DirtyPerMB:      0.45,
		CopyFixed:       5.3,
		CopyPerMB:       0.35,
		CloneFixed:      4.0,
		ClonePerMB:      0.035,
	}
	// BuiltinFsync is for servers with fsync = on (PostgreSQL's default).
	// Measured earlier (by TestCalibrate with PGFORK_CALIBRATE_MB=64, under
	// load; not re-measured on 2026-11-21) at shared_buffers 128 MB: wal_log
	// 21–213 ms empty, 3.8–8.0 ms/MB; file_copy 290–504 ms empty (it fsyncs
	// every file it copies and the checkpoints sync), 1.5–1.8 ms/MB; clone
	// 282 ms empty, ~0 ms/MB; dirty buffers 1.9–6.5 ms/MB at checkpoint.
	// The per-GB terms are the fsync=off ones (a clean checkpoint's buffer
	// scan does no I/O).
	BuiltinFsync = Calibration{
		Source:          "built-in (measured on the pgfork benchmark machine, fsync=on)",
		Fsync:           true,
		WalLogFixed:     60,
		WalLogPerGB:     1.7,
		WalLogPerMB:     5,
		CheckpointFixed: 5,
		CheckpointPerGB: 5,
		DirtyPerMB:      3,
		CopyFixed:       300,
		CopyPerMB:       1.6,
		CloneFixed:      250,
		ClonePerMB:      0.05,
	}
)

// Builtin returns the built-in calibration for a server's fsync setting and
// whether its data directory shares blocks (the machine kind's reflink
// filesystem, XFS, creates and removes files faster than its ext4).
func Builtin(fsync, canClone bool) *Calibration {
	c := BuiltinNoFsync
	switch {
	case fsync:
		c = BuiltinFsync
	case canClone:
		c = BuiltinNoFsyncReflink
	}
	return &c
}

// Estimate is the advisor's prediction for one strategy.
type Estimate struct {
	Strategy  Strategy      `json:"strategy"`
	Available bool          `json:"available"`
	Time      time.Duration `json:"time_ns"`
	// Model is the cost model's estimate under the calibration, before
	// scaling by what creations took (Time is Model when nothing was
	// learned); Observed counts the creations behind the scaling.
	Model    time.Duration `json:"model_ns"`
	Observed int           `json:"observed,omitempty"`
	// Why explains the estimate or why the strategy is unavailable.
	Why string `json:"why"`
}

// Advice is the advisor's choice and its reasons.
type Advice struct {
	Choice        Strategy   `json:"choice"`
	Template      string     `json:"template"`
	TemplateBytes int64      `json:"template_bytes"`
	SharedBuffers int64      `json:"shared_buffers"`
	DirtyBytes    int64      `json:"dirty_bytes"`
	DirtySource   string     `json:"dirty_source"` // "pg_buffercache", "estimate: WAL since the last checkpoint", "unknown"
	Fsync         bool       `json:"fsync"`
	Version       int        `json:"version"`
	CanClone      bool       `json:"can_clone"`
	Estimates     []Estimate `json:"estimates"`
	Reasons       []string   `json:"reasons"`
	Calibration   string     `json:"calibration"`
}

// Advise estimates what each strategy would cost for copying template on
// the server t describes, and chooses the cheapest available. cal nil (or
// measured with another fsync setting) uses the built-in constants.
func Advise(ctx context.Context, conn *pgx.Conn, template string, t *Target, cal *Calibration) (*Advice, error) {
	return AdviseLearned(ctx, conn, template, t, cal, nil)
}

// AdviseLearned is Advise with the model's estimates scaled by what the
// creations l observed took (see Learning); l may be nil.
func AdviseLearned(ctx context.Context, conn *pgx.Conn, template string, t *Target, cal *Calibration, l *Learning) (*Advice, error) {
	if err := ValidateName(template); err != nil {
		return nil, err
	}
	if t == nil {
		var err error
		if t, err = Inspect(ctx, conn, false); err != nil {
			return nil, err
		}
	}
	a := &Advice{Template: template, SharedBuffers: t.SharedBuffers, Fsync: t.Fsync, Version: t.Version, CanClone: t.CanClone}
	// One round trip when Inspect found how to count dirty buffers: auto's
	// cost is part of what it is measured by.
	q, src := t.dirtySQL, t.dirtySource
	if q == "" {
		q, src = dirtyQuery(ctx, conn, t)
	}
	var size, dirty *int64
	err := conn.QueryRow(ctx, `SELECT pg_database_size(oid), (`+q+`) FROM pg_database WHERE datname = $1`, template).Scan(&size, &dirty)
	if err != nil && err != pgx.ErrNoRows && ctx.Err() == nil {
		// Counting dirty buffers failed (e.g. Inspect's connection was to
		// another database, with pg_buffercache): advise without the count.
		src = "unknown: counting failed (" + err.Error() + ")"
		dirty = nil
		err = conn.QueryRow(ctx, `SELECT pg_database_size(oid) FROM pg_database WHERE datname = $1`, template).Scan(&size)
	}
	if err != nil {
		if err == pgx.ErrNoRows {
			return nil, errs.New(errs.NotFound, "template database %q does not exist", template).WithHint("list databases with: psql -l")
		}
		return nil, sqlErr(ctx, err, "cannot read the size of database %q", template)
	}
	if size != nil {
		a.TemplateBytes = *size
	}
	if dirty != nil {
		a.DirtyBytes = min(max(*dirty, 0), t.SharedBuffers)
	}
	a.DirtySource = src
	if cal == nil || cal.Fsync != t.Fsync {
		if cal != nil {
			a.Reasons = append(a.Reasons, fmt.Sprintf("the calibration given was measured with fsync=%s but the server has fsync=%s: using built-in constants", onOff(cal.Fsync), onOff(t.Fsync)))
		}
		cal = Builtin(t.Fsync, t.CanClone)
	}
	a.Calibration = cal.Source
	a.Choice, a.Estimates = decide(t, a.TemplateBytes, a.DirtyBytes, cal, l)
	a.Reasons = append(a.Reasons, reasons(a, t, cal)...)
	if d := l.describe(cal.Source); d != "" {
		a.Reasons = append(a.Reasons, d)
	}
	return a, nil
}

// Decide is the advisor's model without a server: the estimate of every
// strategy for copying a template of templateBytes on the server t
// describes with dirtyBytes of shared_buffers dirty, under constants c, and
// the cheapest available strategy.
func Decide(t *Target, templateBytes, dirtyBytes int64, c *Calibration) (Strategy, []Estimate) {
	return decide(t, templateBytes, dirtyBytes, c, nil)
}

func decide(t *Target, templateBytes, dirtyBytes int64, c *Calibration, l *Learning) (Strategy, []Estimate) {
	a := &Advice{TemplateBytes: templateBytes, SharedBuffers: t.SharedBuffers, DirtyBytes: dirtyBytes}
	est := estimate(a, t, c)
	for i := range est {
		e := &est[i]
		e.Model = e.Time
		f, n := l.factor(c.Source, e.Strategy, templateBytes)
		if n > 0 {
			e.Time = time.Duration(float64(e.Time) * f)
			e.Observed = n
			e.Why += fmt.Sprintf("; scaled %.2fx by %d observed creations (model %s)", f, n, e.Model.Round(100*time.Microsecond))
		}
	}
	best := -1
	for i, e := range est {
		if e.Available && (best < 0 || e.Time < est[best].Time) {
			best = i
		}
	}
	return est[best].Strategy, est
}

func onOff(b bool) string {
	if b {
		return "on"
	}
	return "off"
}

// estimate applies the cost model.
func estimate(a *Advice, t *Target, c *Calibration) []Estimate {
	mb := float64(a.TemplateBytes) / (1 << 20)
	gb := float64(a.SharedBuffers) / (1 << 30)
	dirty := float64(a.DirtyBytes) / (1 << 20)
	ms := func(v float64) time.Duration { return time.Duration(v * float64(time.Millisecond)) }
	ckpt := c.CheckpointFixed + gb*c.CheckpointPerGB + dirty*c.DirtyPerMB
	ckptWhy := fmt.Sprintf("two checkpoints %s (%s fixed + %s scanning shared_buffers %s + %s writing %s dirty)", ms(ckpt).Round(100*time.Microsecond),
		ms(c.CheckpointFixed).Round(100*time.Microsecond), ms(gb*c.CheckpointPerGB).Round(100*time.Microsecond), units.Bytes(a.SharedBuffers),
		ms(dirty*c.DirtyPerMB).Round(100*time.Microsecond), units.Bytes(a.DirtyBytes))
	wal := Estimate{Strategy: WalLog, Available: t.Version >= 15, Time: ms(c.WalLogFixed + gb*c.WalLogPerGB + mb*c.WalLogPerMB)}
	if wal.Available {
		wal.Why = fmt.Sprintf("reads %s through shared buffers and writes it to WAL: %s fixed + %s for the data + %s for shared_buffers %s",
			units.Bytes(a.TemplateBytes), ms(c.WalLogFixed).Round(100*time.Microsecond), ms(mb*c.WalLogPerMB).Round(100*time.Microsecond),
			ms(gb*c.WalLogPerGB).Round(100*time.Microsecond), units.Bytes(a.SharedBuffers))
	} else {
		wal.Why = fmt.Sprintf("PostgreSQL %d has no STRATEGY option (needs 15)", t.Version)
	}
	fc := Estimate{Strategy: FileCopy, Available: true, Time: ms(ckpt + c.CopyFixed + mb*c.CopyPerMB),
		Why: fmt.Sprintf("copies %s of files, plus %s", units.Bytes(a.TemplateBytes), ckptWhy)}
	if t.Version < 15 {
		fc.Why += "; a plain CREATE DATABASE on this version"
	}
	cl := Estimate{Strategy: Clone, Time: ms(ckpt + c.CloneFixed + mb*c.ClonePerMB)}
	switch {
	case t.Version < 18:
		cl.Why = fmt.Sprintf("needs PostgreSQL 18 (file_copy_method); this server is %d", t.Version)
	case !t.CanClone:
		cl.Why = "the data directory is not known to be on a filesystem that shares blocks (say so with --can-clone)"
	case t.FileCopyMethod != "clone" && !settable(t.FileCopyMethodContext):
		cl.Why = "file_copy_method cannot be SET by this role and is not clone"
	default:
		cl.Available = true
		cl.Why = fmt.Sprintf("shares the blocks of %s (reflink), plus %s", units.Bytes(a.TemplateBytes), ckptWhy)
	}
	return []Estimate{wal, fc, cl}
}

func reasons(a *Advice, t *Target, c *Calibration) []string {
	var r []string
	est := map[Strategy]Estimate{}
	var avail []Estimate
	for _, e := range a.Estimates {
		est[e.Strategy] = e
		if e.Available {
			avail = append(avail, e)
		}
	}
	sort.Slice(avail, func(i, j int) bool { return avail[i].Time < avail[j].Time })
	ch := est[a.Choice]
	if len(avail) > 1 {
		r = append(r, fmt.Sprintf("%s is estimated at %s, %s faster than %s (%s)", ch.Strategy, ch.Time.Round(100*time.Microsecond),
			ratio(avail[1].Time, ch.Time), avail[1].Strategy, avail[1].Time.Round(100*time.Microsecond)))
	} else {
		r = append(r, fmt.Sprintf("%s is the only strategy this server offers", ch.Strategy))
	}
	r = append(r, fmt.Sprintf("template %q is %s; shared_buffers %s; fsync %s; PostgreSQL %d", a.Template,
		units.Bytes(a.TemplateBytes), units.Bytes(a.SharedBuffers), onOff(a.Fsync), t.Version))
	r = append(r, "dirty buffers: "+units.Bytes(a.DirtyBytes)+" ("+a.DirtySource+")")
	if !est[Clone].Available {
		r = append(r, "clone unavailable: "+est[Clone].Why)
	}
	per := "built-in"
	if c.PerGBMeasured {
		per = "measured on this server"
	}
	r = append(r, fmt.Sprintf("constants: %s (per GB of shared_buffers: checkpoints %.1f ms, wal_log %.1f ms, %s)", a.Calibration, c.CheckpointPerGB, c.WalLogPerGB, per))
	return r
}

func ratio(slow, fast time.Duration) string {
	if fast <= 0 {
		return "much"
	}
	return fmt.Sprintf("%.1fx", float64(slow)/float64(fast))
}

// dirtyQuery returns an SQL expression for how many bytes of shared_buffers
// are dirty, and where the number comes from: exactly from pg_buffercache
// when it is installed in the connected database, else an estimate from the
// WAL written since the last checkpoint's redo point (capped at
// shared_buffers by the caller) when the role may read pg_control_checkpoint,
// else NULL ("unknown").
func dirtyQuery(ctx context.Context, conn *pgx.Conn, t *Target) (string, string) {
	var hasBC, canControl bool
	if err := conn.QueryRow(ctx, `SELECT CASE WHEN EXISTS (SELECT 1 FROM pg_extension WHERE extname = 'pg_buffercache')
		  THEN has_table_privilege('pg_buffercache', 'SELECT') ELSE false END,
		has_function_privilege('pg_control_checkpoint()', 'EXECUTE')`).Scan(&hasBC, &canControl); err != nil {
		return "SELECT NULL::bigint", "unknown: " + err.Error()
	}
	switch {
	case hasBC && t.Version >= 16:
		return "SELECT buffers_dirty::bigint * 8192 FROM pg_buffercache_summary()", "pg_buffercache"
	case hasBC:
		return "SELECT count(*) * 8192 FROM pg_buffercache WHERE isdirty", "pg_buffercache"
	case canControl:
		return "SELECT pg_wal_lsn_diff(pg_current_wal_insert_lsn(), redo_lsn)::bigint FROM pg_control_checkpoint()",
			"estimate: WAL written since the last checkpoint (install pg_buffercache for an exact count)"
	}
	return "SELECT NULL::bigint", "unknown: install pg_buffercache, or connect as a superuser, for a count"
}

// dirtyBytes measures how much of shared_buffers is dirty now (see
// dirtyQuery).
func dirtyBytes(ctx context.Context, conn *pgx.Conn, t *Target) (int64, string) {
	q, src := dirtyQuery(ctx, conn, t)
	var n *int64
	if err := conn.QueryRow(ctx, q).Scan(&n); err != nil || n == nil {
		return 0, src
	}
	return min(max(*n, 0), t.SharedBuffers), src
}
