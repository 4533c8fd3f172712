package dbclone

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/pgfork/pgfork/internal/units"
)

// gridCase is one shape the advisor must get right: the server, the
// template, what was measured on the benchmark machine kind (medians, ms,
// fsync=off, quiet machine, 2026-11-21; see the built-in constants), and
// the strategies that were within 10% of the best there.
type gridCase struct {
	name          string
	version       int
	canClone      bool
	sharedBuffers int64
	templateMB    float64
	dirtyMB       float64
	measured      string
	ok            []Strategy
}

// The benchmark grid (template empty/~100 MB/~1 GB × shared_buffers 128 MB/2
// GB × PG15 ext4, PG18 XFS), plus shapes off the grid that pin the model
// down: PG15 on XFS, 8 GB of shared_buffers, dirty buffers.
var gridCases = []gridCase{
	{"pg15-ext4/128MB/empty", 15, false, 128 << 20, 7.3, 0, "wal_log 13.9 file_copy 12.7 (earlier runs under load: 28.1/25.2, 50.9/47.6)", []Strategy{FileCopy}},
	// A tie within noise: wal_log 33.3 vs file_copy 36.1 (quiet); 50.5 vs
	// 44.1 and 78.5 vs 76.0 (load 2-3). Either is within ~10%.
	{"pg15-ext4/2GB/empty", 15, false, 2 << 30, 7.3, 0, "wal_log 33.3 file_copy 36.1", []Strategy{WalLog, FileCopy}},
	{"pg15-ext4/128MB/100MB", 15, false, 128 << 20, 89, 0, "wal_log 170 file_copy 79", []Strategy{FileCopy}},
	{"pg15-ext4/2GB/100MB", 15, false, 2 << 30, 89, 0, "wal_log 201 file_copy 110", []Strategy{FileCopy}},
	{"pg15-ext4/128MB/1GB", 15, false, 128 << 20, 820, 0, "issue: WAL_LOG 1.9-3.1 s, FILE_COPY 0.5 s", []Strategy{FileCopy}},
	{"pg15-ext4/2GB/1GB", 15, false, 2 << 30, 820, 0, "issue: WAL_LOG 1.9-3.1 s, FILE_COPY 0.5 s", []Strategy{FileCopy}},
	{"pg18-xfs/128MB/empty", 18, true, 128 << 20, 7.5, 0, "wal_log 13.9 file_copy 9.1 clone 5.9", []Strategy{Clone}},
	{"pg18-xfs/2GB/empty", 18, true, 2 << 30, 7.5, 0, "wal_log 14.0 file_copy 19.1 clone 12.9", []Strategy{Clone}},
	{"pg18-xfs/128MB/100MB", 18, true, 128 << 20, 89, 0, "wal_log 129 file_copy 40.8 clone 9.4", []Strategy{Clone}},
	{"pg18-xfs/2GB/100MB", 18, true, 2 << 30, 89, 0, "wal_log 142 file_copy 44.7 clone 15.1", []Strategy{Clone}},
	{"pg18-xfs/128MB/1GB", 18, true, 128 << 20, 820, 0, "issue: clone 0.19 s vs WAL_LOG 1.8 s", []Strategy{Clone}},
	{"pg18-xfs/2GB/1GB", 18, true, 2 << 30, 820, 0, "issue: clone 0.19 s vs WAL_LOG 1.8 s", []Strategy{Clone}},
	// Off the grid.
	{"pg15-xfs/128MB/empty", 15, true, 128 << 20, 7.3, 0, "wal_log 14.8 file_copy 10.6", []Strategy{FileCopy}},
	{"pg15-xfs/2GB/empty", 15, true, 2 << 30, 7.3, 0, "wal_log 15.6 file_copy 17.3", []Strategy{WalLog}},
	{"pg15-ext4/8GB/empty", 15, false, 8 << 30, 7.3, 0, "wal_log 27.1 file_copy 66.7", []Strategy{WalLog}},
	// 96 MB dirty cost a checkpoint 35-41 ms more than a clean one.
	{"pg15-ext4/128MB/empty/96MB-dirty", 15, false, 128 << 20, 7.3, 96, "checkpoint +35 ms", []Strategy{WalLog}},
	{"pg14/128MB/empty", 14, false, 128 << 20, 7.3, 0, "only FILE_COPY exists", []Strategy{FileCopy}},
}

// TestDecideGrid checks the advisor's choice, with the built-in constants,
// on every shape measured: a change to the model or its constants that
// would make auto pick a strategy more than 10% slower than the best fails
// here, without a server.
func TestDecideGrid(t *testing.T) {
	for _, c := range gridCases {
		t.Run(c.name, func(t *testing.T) {
			tg := &Target{Version: c.version, SharedBuffers: c.sharedBuffers, CanClone: c.canClone}
			if c.version >= 18 {
				tg.FileCopyMethod, tg.FileCopyMethodContext = "copy", "user"
			}
			cal := Builtin(false, c.canClone)
			got, est := Decide(tg, int64(c.templateMB*(1<<20)), int64(c.dirtyMB*(1<<20)), cal)
			var lines []string
			for _, e := range est {
				lines = append(lines, string(e.Strategy)+" "+e.Time.Round(100*time.Microsecond).String()+" ("+e.Why+")")
			}
			ok := false
			for _, s := range c.ok {
				ok = ok || got == s
			}
			if !ok {
				t.Errorf("chose %s, measured best %v (%s); estimates:\n%s", got, c.ok, c.measured, strings.Join(lines, "\n"))
			}
		})
	}
}

// TestDecideTieIsATie: where the measurements could not tell the two
// strategies apart, the model must not claim a large difference either (an
// estimate far apart there means a constant went wrong).
func TestDecideTieIsATie(t *testing.T) {
	tg := &Target{Version: 15, SharedBuffers: 2 << 30}
	_, est := Decide(tg, 7300<<10, 0, Builtin(false, false))
	w, f := est[0].Time, est[1].Time
	if r := float64(max(w, f)) / float64(min(w, f)); r > 1.5 {
		t.Errorf("pg15 ext4 2GB empty: wal_log %s vs file_copy %s (%.2fx); measured within 10%%", w, f, r)
	}
}

// TestDecideCalibrationPerGB: two calibration points at different
// shared_buffers sizes give the per-GB costs; one point keeps the defaults.
func TestDecideCalibrationPerGB(t *testing.T) {
	one := []CalibrationPoint{{SharedBuffers: 128 << 20, Checkpoint: 0.5, WalLog: 14}}
	if c, w, m := perGB(one, 5, 1.7); m || c != 5 || w != 1.7 {
		t.Errorf("one point: %v %v %v", c, w, m)
	}
	two := append(one, CalibrationPoint{SharedBuffers: 8 << 30, Checkpoint: 19.7, WalLog: 27.1})
	c, w, m := perGB(two, 5, 1.7)
	// (19.7-0.5)/7.875 = 2.44 ms/GB per checkpoint, two of them.
	if !m || c < 4.8 || c > 5.0 || w < 1.6 || w > 1.7 {
		t.Errorf("two points: checkpoints %.3f ms/GB, wal_log %.3f ms/GB, measured %v", c, w, m)
	}
	prev := &Calibration{SystemID: 7, Points: []CalibrationPoint{{SharedBuffers: 8 << 30, Checkpoint: 19.7}, {SharedBuffers: 2 << 30, Checkpoint: 9}}}
	pts := mergePoints(prev, &Target{SystemID: 7}, CalibrationPoint{SharedBuffers: 2 << 30, Checkpoint: 4})
	if len(pts) != 2 || pts[0].Checkpoint != 4 || pts[1].SharedBuffers != 8<<30 {
		t.Errorf("merge keeps the new point at its size and the old one at the other: %+v", pts)
	}
	if pts := mergePoints(prev, &Target{SystemID: 8}, CalibrationPoint{SharedBuffers: 2 << 30}); len(pts) != 1 {
		t.Errorf("points of another server merged: %+v", pts)
	}
}

// TestAdviseCountsDirtyBuffers: on a real server, dirty buffers raise the
// checkpointing strategies' estimates by what the model says they cost, and
// a checkpoint takes them away again; the advice names its source.
func TestAdviseCountsDirtyBuffers(t *testing.T) {
	each(t, func(t *testing.T, s *server) {
		ctx := context.Background()
		conn := s.connect(t, "", "")
		name := "advise_dirty_" + strings.ReplaceAll(s.name, "-", "_")
		s.exec(t, conn, "DROP TABLE IF EXISTS "+name)
		s.exec(t, conn, "CREATE TABLE "+name+" (id int, pad text)")
		t.Cleanup(func() { _, _ = conn.Exec(context.Background(), "DROP TABLE IF EXISTS "+name) })
		tg, err := Inspect(ctx, conn, s.canClone)
		if err != nil {
			t.Fatal(err)
		}
		s.exec(t, conn, "CHECKPOINT")
		clean, err := Advise(ctx, conn, "template1", tg, nil)
		if err != nil {
			t.Fatal(err)
		}
		// ~16 MB of new rows stay dirty in shared buffers (no ring buffer).
		s.exec(t, conn, "INSERT INTO "+name+" SELECT g, repeat(md5(g::text), 6) FROM generate_series(1, 16*128*28) g")
		dirty, err := Advise(ctx, conn, "template1", tg, nil)
		if err != nil {
			t.Fatal(err)
		}
		if dirty.DirtyBytes < 8<<20 || dirty.DirtyBytes > tg.SharedBuffers || dirty.DirtySource == "" || strings.HasPrefix(dirty.DirtySource, "unknown") {
			t.Fatalf("after writing ~16 MB: dirty %d bytes (%s); clean: %d", dirty.DirtyBytes, dirty.DirtySource, clean.DirtyBytes)
		}
		if clean.DirtyBytes >= dirty.DirtyBytes/2 {
			t.Errorf("after a checkpoint %d bytes dirty, after writing %d", clean.DirtyBytes, dirty.DirtyBytes)
		}
		cal := Builtin(tg.Fsync, tg.CanClone)
		want := time.Duration(float64(dirty.DirtyBytes-clean.DirtyBytes) / (1 << 20) * cal.DirtyPerMB * float64(time.Millisecond))
		got := dirty.Estimates[1].Time - clean.Estimates[1].Time
		if dirty.Estimates[1].Strategy != FileCopy || got < want*9/10 || got > want*11/10 || dirty.Estimates[0].Time != clean.Estimates[0].Time {
			t.Errorf("file_copy estimate rose by %s for %d dirty bytes, want %s; wal_log %s → %s", got, dirty.DirtyBytes-clean.DirtyBytes, want,
				clean.Estimates[0].Time, dirty.Estimates[0].Time)
		}
		t.Logf("%s: %s dirty (%s); file_copy %s → %s", s.name, units.Bytes(dirty.DirtyBytes), dirty.DirtySource, clean.Estimates[1].Time, dirty.Estimates[1].Time)
	})
}
