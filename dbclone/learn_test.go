package dbclone

import (
	"context"
	"encoding/json"
	"fmt"
	"math"
	"testing"
	"time"
)

// TestLearningConvergesFromCreations: with constants 24 times too
// optimistic (as the built-in ones were on a fresh machine), real
// creations move the advisor's estimate to what creating takes, with no
// calibration step; strategies not observed are scaled too; the learning
// survives a round trip through JSON and starts over under another
// calibration.
func TestLearningConvergesFromCreations(t *testing.T) {
	s := servers(t)[0]
	ctx := context.Background()
	conn := s.connect(t, "", "")
	tg, err := Inspect(ctx, conn, s.canClone)
	if err != nil {
		t.Fatal(err)
	}
	cal := Builtin(tg.Fsync, tg.CanClone)
	for _, f := range []*float64{&cal.WalLogFixed, &cal.WalLogPerGB, &cal.WalLogPerMB, &cal.CheckpointFixed, &cal.CheckpointPerGB,
		&cal.DirtyPerMB, &cal.CopyFixed, &cal.CopyPerMB, &cal.CloneFixed, &cal.ClonePerMB} {
		*f /= 24
	}
	cal.Source = "test: the built-in constants / 24"
	l := &Learning{}
	est := func(st Strategy) time.Duration {
		t.Helper()
		a, err := AdviseLearned(ctx, conn, "template1", tg, cal, l)
		if err != nil {
			t.Fatal(err)
		}
		for _, e := range a.Estimates {
			if e.Strategy == st {
				return e.Time
			}
		}
		t.Fatalf("no estimate for %s", st)
		return 0
	}
	wal0, fc0 := est(WalLog), est(FileCopy)
	// Creations by Create (learning) interleaved with the same statement
	// timed here, so that both see the machine's load of the moment.
	var took []time.Duration
	for i := range 6 {
		name, direct := fmt.Sprintf("learn_%d", i), fmt.Sprintf("learn_direct_%d", i)
		t.Cleanup(func() { dropDB(t, conn, name); dropDB(t, conn, direct) })
		if _, err := Create(ctx, conn, name, "template1", CreateOptions{Strategy: WalLog, Target: tg, Calibration: cal, Learning: l}); err != nil {
			t.Fatal(err)
		}
		t0 := time.Now()
		s.exec(t, conn, "CREATE DATABASE "+quote(direct)+" TEMPLATE template1 STRATEGY WAL_LOG")
		took = append(took, time.Since(t0))
	}
	// The learning keeps a mean of logarithms: compare with the geometric
	// mean (a shared machine's timings spread over a factor of ten).
	var sumLn float64
	for _, d := range took {
		sumLn += math.Log(float64(d))
	}
	observed := time.Duration(math.Exp(sumLn / float64(len(took))))
	wal1, fc1 := est(WalLog), est(FileCopy)
	off := func(e time.Duration) float64 { return math.Abs(math.Log(float64(e) / float64(observed))) }
	t.Logf("wal_log: estimate %s before, %s after 6 creations; CREATE DATABASE takes %s (geometric mean of %v); file_copy %s → %s", wal0, wal1, observed, took, fc0, fc1)
	if off(wal1) >= off(wal0)/3 || off(wal1) > math.Log(4) {
		t.Errorf("wal_log estimate %s → %s did not converge to the observed %s", wal0, wal1, observed)
	}
	if fc1 <= fc0*2 {
		t.Errorf("file_copy, never observed, stayed at %s → %s although the machine is %0.fx slower than the constants say", fc0, fc1, float64(observed)/float64(wal0))
	}
	if n := l.Observations(cal.Source); n != 6 {
		t.Errorf("%d observations recorded, want 6", n)
	}

	// Persisted and loaded: the same estimates.
	b, err := json.Marshal(l)
	if err != nil {
		t.Fatal(err)
	}
	l2 := &Learning{}
	if err := json.Unmarshal(b, l2); err != nil {
		t.Fatal(err)
	}
	f1, n1 := l.factor(cal.Source, WalLog, 7<<20)
	f2, n2 := l2.factor(cal.Source, WalLog, 7<<20)
	if f1 != f2 || n1 != n2 || n1 == 0 {
		t.Errorf("after a JSON round trip: factor %v (%d) vs %v (%d)\n%s", f2, n2, f1, n1, b)
	}
	// Another calibration: the ratios were relative to the old one.
	if f, n := l.factor("another calibration", WalLog, 7<<20); f != 1 || n != 0 {
		t.Errorf("learning applied under another calibration: %v (%d)", f, n)
	}
	l.Observe("another calibration", WalLog, 7<<20, time.Millisecond, 2*time.Millisecond)
	if n := l.Observations(cal.Source); n != 0 {
		t.Errorf("old observations kept after the calibration changed: %d", n)
	}
}
