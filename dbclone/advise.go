package dbclone

import (
	"context"
	"fmt"
	"sort"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgfork/pgfork/internal/errs"
)

// Calibration holds the constants of the advisor's cost model. Times are in
// milliseconds; "per MB" means per MiB of template (pg_database_size), "per
// GB" per GiB of shared_buffers.
//
// The model:
//
//	wal_log   = WalLogFixed + size × WalLogPerMB
//	file_copy = CheckpointFixed + shared_buffers × CheckpointPerGB + dirty × DirtyPerMB
//	            + CopyFixed + size × CopyPerMB
//	clone     = the same checkpoints + CloneFixed + size × ClonePerMB
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
	WalLogPerMB     float64 `json:"wal_log_per_mb_ms"`
	CheckpointFixed float64 `json:"checkpoint_fixed_ms"` // both checkpoints of FILE_COPY, clean buffers
	CheckpointPerGB float64 `json:"checkpoint_per_gb_ms"`
	DirtyPerMB      float64 `json:"dirty_per_mb_ms"`
	CopyFixed       float64 `json:"copy_fixed_ms"`
	CopyPerMB       float64 `json:"copy_per_mb_ms"`
	CloneFixed      float64 `json:"clone_fixed_ms"`
	ClonePerMB      float64 `json:"clone_per_mb_ms"`
}

// Built-in constants, measured on this project's benchmark machine kind
// (2 vCPUs shared with other jobs, virtio disk, ext4 root and an XFS reflink
// loop image) with dbclone.Calibrate (TestCalibrate with
// PGFORK_CALIBRATE_MB=64: an empty template of 7.1 MB and one of 58.5 MB,
// one warm-up then the median of 3 runs per strategy), against servers
// started by the instance package: PostgreSQL 15.x on ext4 for wal_log and
// file_copy, PostgreSQL 18.6 on XFS (reflink=1) for clone, each with
// shared_buffers 128 MB and 2 GB (PGFORK_DBCLONE_TEST_SETTINGS) to separate
// the checkpoints' per-shared_buffers cost from their fixed cost. The runs
// were noisy (other jobs on the two cores): where samples disagreed, the
// values below are the middle of the medians, rounded. The issue's own
// measurements of a 905 MB template (WAL_LOG 1.9–3.1 s, FILE_COPY 0.5 s on
// PG15/ext4; FILE_COPY+clone 0.19 s on PG18/XFS) agree with the per-MB terms.
var (
	// BuiltinNoFsync is for servers with fsync = off (pgfork's test profile).
	// Measured: wal_log 14.7–17.9 ms empty, 1.2–2.5 ms/MB; file_copy
	// 8.5–11.9 ms empty at 128 MB shared_buffers and 31–64 ms at 2 GB,
	// 0.44–0.61 ms/MB; clone 7.5 ms empty, 0.015 ms/MB; dirty buffers
	// 0.37–0.68 ms/MB at checkpoint.
	BuiltinNoFsync = Calibration{
		Source:          "built-in (measured on the pgfork benchmark machine, fsync=off)",
		WalLogFixed:     8,
		WalLogPerMB:     2.0,
		CheckpointFixed: 1.5,
		CheckpointPerGB: 12,
		DirtyPerMB:      0.5,
		CopyFixed:       8,
		CopyPerMB:       0.5,
		CloneFixed:      6,
		ClonePerMB:      0.05,
	}
	// BuiltinFsync is for servers with fsync = on (PostgreSQL's default).
	// Measured at shared_buffers 128 MB: wal_log 21–213 ms empty, 3.8–8.0
	// ms/MB; file_copy 290–504 ms empty (it fsyncs every file it copies and
	// the checkpoints sync), 1.5–1.8 ms/MB; clone 282 ms empty, ~0 ms/MB;
	// dirty buffers 1.9–6.5 ms/MB at checkpoint.
	BuiltinFsync = Calibration{
		Source:          "built-in (measured on the pgfork benchmark machine, fsync=on)",
		Fsync:           true,
		WalLogFixed:     60,
		WalLogPerMB:     5,
		CheckpointFixed: 5,
		CheckpointPerGB: 12,
		DirtyPerMB:      3,
		CopyFixed:       300,
		CopyPerMB:       1.6,
		CloneFixed:      250,
		ClonePerMB:      0.05,
	}
)

// Builtin returns the built-in calibration for a server's fsync setting.
func Builtin(fsync bool) *Calibration {
	c := BuiltinNoFsync
	if fsync {
		c = BuiltinFsync
	}
	return &c
}

// Estimate is the advisor's prediction for one strategy.
type Estimate struct {
	Strategy  Strategy      `json:"strategy"`
	Available bool          `json:"available"`
	Time      time.Duration `json:"time_ns"`
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
	var size *int64
	if err := conn.QueryRow(ctx, `SELECT pg_database_size(oid) FROM pg_database WHERE datname = $1`, template).Scan(&size); err != nil {
		if err == pgx.ErrNoRows {
			return nil, errs.New(errs.NotFound, "template database %q does not exist", template).WithHint("list databases with: psql -l")
		}
		return nil, sqlErr(ctx, err, "cannot read the size of database %q", template)
	}
	if size != nil {
		a.TemplateBytes = *size
	}
	a.DirtyBytes, a.DirtySource = dirtyBytes(ctx, conn, t)
	if ctx.Err() != nil {
		return nil, errs.Wrap(errs.Interrupted, ctx.Err(), "interrupted")
	}
	if cal == nil || cal.Fsync != t.Fsync {
		if cal != nil {
			a.Reasons = append(a.Reasons, fmt.Sprintf("the calibration given was measured with fsync=%s but the server has fsync=%s: using built-in constants", onOff(cal.Fsync), onOff(t.Fsync)))
		}
		cal = Builtin(t.Fsync)
	}
	a.Calibration = cal.Source
	a.Estimates = estimate(a, t, cal)
	best := -1
	for i, e := range a.Estimates {
		if e.Available && (best < 0 || e.Time < a.Estimates[best].Time) {
			best = i
		}
	}
	a.Choice = a.Estimates[best].Strategy
	a.Reasons = append(a.Reasons, reasons(a, t)...)
	return a, nil
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
	ckptWhy := fmt.Sprintf("two checkpoints %s (shared_buffers %s, %s dirty)", ms(ckpt).Round(100*time.Microsecond), fmtBytes(a.SharedBuffers), fmtBytes(a.DirtyBytes))
	wal := Estimate{Strategy: WalLog, Available: t.Version >= 15, Time: ms(c.WalLogFixed + mb*c.WalLogPerMB)}
	if wal.Available {
		wal.Why = fmt.Sprintf("reads %s through shared buffers and writes it to WAL", fmtBytes(a.TemplateBytes))
	} else {
		wal.Why = fmt.Sprintf("PostgreSQL %d has no STRATEGY option (needs 15)", t.Version)
	}
	fc := Estimate{Strategy: FileCopy, Available: true, Time: ms(ckpt + c.CopyFixed + mb*c.CopyPerMB),
		Why: fmt.Sprintf("copies %s of files, plus %s", fmtBytes(a.TemplateBytes), ckptWhy)}
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
		cl.Why = fmt.Sprintf("shares the blocks of %s (reflink), plus %s", fmtBytes(a.TemplateBytes), ckptWhy)
	}
	return []Estimate{wal, fc, cl}
}

func reasons(a *Advice, t *Target) []string {
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
		fmtBytes(a.TemplateBytes), fmtBytes(a.SharedBuffers), onOff(a.Fsync), t.Version))
	r = append(r, "dirty buffers: "+fmtBytes(a.DirtyBytes)+" ("+a.DirtySource+")")
	if !est[Clone].Available {
		r = append(r, "clone unavailable: "+est[Clone].Why)
	}
	r = append(r, "constants: "+a.Calibration)
	return r
}

func ratio(slow, fast time.Duration) string {
	if fast <= 0 {
		return "much"
	}
	return fmt.Sprintf("%.1fx", float64(slow)/float64(fast))
}

// dirtyBytes returns how much of shared_buffers is dirty: exactly from
// pg_buffercache when it is installed in the connected database, else an
// estimate from the WAL written since the last checkpoint's redo point
// (capped at shared_buffers), else 0 ("unknown").
func dirtyBytes(ctx context.Context, conn *pgx.Conn, t *Target) (int64, string) {
	var has bool
	if err := conn.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_extension WHERE extname = 'pg_buffercache')`).Scan(&has); err == nil && has {
		var n int64
		q := `SELECT count(*) FROM pg_buffercache WHERE isdirty`
		if t.Version >= 16 {
			q = `SELECT buffers_dirty FROM pg_buffercache_summary()`
		}
		if err := conn.QueryRow(ctx, q).Scan(&n); err == nil {
			return n * 8192, "pg_buffercache"
		}
	}
	var wal int64
	if err := conn.QueryRow(ctx, `SELECT pg_wal_lsn_diff(pg_current_wal_insert_lsn(), redo_lsn)::bigint FROM pg_control_checkpoint()`).Scan(&wal); err == nil {
		return min(max(wal, 0), t.SharedBuffers), "estimate: WAL written since the last checkpoint (install pg_buffercache for an exact count)"
	}
	return 0, "unknown: install pg_buffercache, or connect as a superuser, for a count"
}
