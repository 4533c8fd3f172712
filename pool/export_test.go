package pool

import "time"

// EndRun ends the run of template hash's pool now, as RunGap without a
// hand-out or a request would (its end is otherwise a matter of time, and
// a loaded machine stretches a test's steps past a short RunGap): tests
// give the pool a RunGap longer than themselves and end each run here.
func (m *Manager) EndRun(hash string) error {
	p, err := m.poolOf(hash)
	if err != nil {
		return err
	}
	p.mu.Lock()
	p.lastHandOut = time.Time{}
	p.lastUsed.Store(0)
	p.mu.Unlock()
	p.endRun()
	return nil
}
