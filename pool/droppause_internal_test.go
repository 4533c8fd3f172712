package pool

import (
	"testing"
	"time"
)

// roomLimiter is a Limiter whose disk cap has room or not.
type roomLimiter struct{ room bool }

func (roomLimiter) TryReserve(*Pool) bool     { return true }
func (roomLimiter) Release(*Pool, int)        {}
func (roomLimiter) TryReserveUsed(*Pool) bool { return true }
func (roomLimiter) ReleaseUsed(*Pool, int)    {}
func (l roomLimiter) HasRoom(*Pool) bool      { return l.room }

// TestDropPause (issue 60): the emptiers hold a run's used copies while
// its tests come and go, and drop them once it has been quiet for
// dropIdle, or at once when a test waits, the pool closes, no run goes
// on, or the disk cap of a pool of full copies has no room left. Before,
// they dropped each copy as it came back, beside the run's tests (the
// bench's second run on the volume, PostgreSQL 15: 2.3-2.4x its floor
// against 1.33-1.50x).
func TestDropPause(t *testing.T) {
	pause := func(mod func(p *Pool)) time.Duration {
		p := &Pool{runActive: true}
		p.lastGiveBack = time.Now()
		mod(p)
		return p.dropPauseLocked()
	}
	if d := pause(func(*Pool) {}); d <= 0 || d > dropIdle {
		t.Errorf("a copy just given back during a run: pause %s, want (0, %s]", d, dropIdle)
	}
	if d := pause(func(p *Pool) { p.lastGiveBack = time.Time{}; p.lastHandOut = time.Now() }); d <= 0 {
		t.Errorf("a hand-out just made during a run: pause %s, want one", d)
	}
	if d := pause(func(p *Pool) { p.lastGiveBack = time.Now().Add(-2 * dropIdle) }); d > 0 {
		t.Errorf("a run quiet for %s: pause %s, want none", 2*dropIdle, d)
	}
	for name, mod := range map[string]func(p *Pool){
		"no run":     func(p *Pool) { p.runActive = false },
		"closing":    func(p *Pool) { p.closed = true },
		"test waits": func(p *Pool) { p.waiters = append(p.waiters, nil) },
		"disk cap full": func(p *Pool) {
			p.cfg.Limiter, p.cfg.CopyBytes = roomLimiter{room: false}, 1<<20
		},
	} {
		if d := pause(mod); d > 0 {
			t.Errorf("%s: pause %s, want none", name, d)
		}
	}
	if d := pause(func(p *Pool) { p.cfg.Limiter, p.cfg.CopyBytes = roomLimiter{room: true}, 1<<20 }); d <= 0 {
		t.Errorf("a disk cap with room: pause %s, want one", d)
	}
}
