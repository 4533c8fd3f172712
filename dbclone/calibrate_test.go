package dbclone

import (
	"context"
	"os"
	"strconv"
	"testing"
)

// TestCalibrate runs a small calibration on every server and checks that the
// constants it measured are sane and that it left no scratch database.
// PGFORK_CALIBRATE_MB (default 8) sets the scratch template's size: the
// built-in constants were measured with 64.
func TestCalibrate(t *testing.T) {
	mb := 8
	if v, err := strconv.Atoi(os.Getenv("PGFORK_CALIBRATE_MB")); err == nil {
		mb = v
	}
	each(t, func(t *testing.T, s *server) {
		ctx := context.Background()
		conn := s.connect(t, "", "")
		tg, err := Inspect(ctx, conn, s.canClone)
		if err != nil {
			t.Fatal(err)
		}
		c, err := Calibrate(ctx, conn, CalibrateOptions{SizeMB: mb, Runs: 3, Target: tg, Progress: func(m string) { t.Log(m) }})
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("%+v", *c)
		// Slopes from two sizes on a busy machine: only signs are certain,
		// and that the model predicts a positive time for every strategy.
		for _, v := range []float64{c.WalLogFixed, c.WalLogPerMB, c.CheckpointFixed, c.DirtyPerMB, c.CopyFixed, c.CopyPerMB, c.CloneFixed, c.ClonePerMB} {
			if v < 0 {
				t.Errorf("negative constant: %+v", *c)
			}
		}
		if c.WalLogFixed+7*c.WalLogPerMB <= 0 || c.CheckpointFixed+c.CopyFixed+7*c.CopyPerMB <= 0 || c.Source == "" || c.Fsync != tg.Fsync {
			t.Errorf("implausible calibration: %+v", *c)
		}
		// What a later calibration at another shared_buffers size combines
		// with: one point, at this size, every strategy timed.
		if len(c.Points) != 1 || c.PerGBMeasured {
			t.Fatalf("one calibration, one point, per-GB costs built in: %+v", c.Points)
		}
		if p := c.Points[0]; p.SharedBuffers != tg.SharedBuffers || p.Checkpoint <= 0 || p.WalLog <= 0 || p.FileCopy <= 0 ||
			(s.canClone && p.Clone <= 0) || p.EmptyMB < 1 {
			t.Errorf("calibration point: %+v", p)
		}
		var n int
		if err := conn.QueryRow(ctx, `SELECT count(*) FROM pg_database WHERE datname LIKE 'pgfork\_calib\_%'`).Scan(&n); err != nil || n != 0 {
			t.Errorf("scratch databases left: %d (%v)", n, err)
		}
	})
}
