package main

import (
	"os"
	"sync"
	"time"

	"github.com/schollz/progressbar/v3"
	"golang.org/x/term"
)

// progressDelay is how long an operation runs before its bar appears, so
// quick operations print nothing.
const progressDelay = 500 * time.Millisecond

// byteProgress draws a progress bar (in bytes) on stderr for long
// operations. It draws nothing when stderr is not a terminal, with --quiet
// or --json, or until the operation has run for progressDelay. Commands
// call Update from their progress callback and Done when finished; both are
// safe to call from any goroutine.
type byteProgress struct {
	mu      sync.Mutex
	desc    string
	start   time.Time
	enabled bool
	bar     *progressbar.ProgressBar
}

// newByteProgress starts timing an operation described by desc ("copying").
func newByteProgress(desc string) *byteProgress {
	return &byteProgress{
		desc:    desc,
		start:   time.Now(),
		enabled: !g.quiet && !g.json && term.IsTerminal(int(os.Stderr.Fd())),
	}
}

// Update reports done of total bytes.
func (p *byteProgress) Update(done, total int64) {
	if p == nil || !p.enabled {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.bar == nil {
		if time.Since(p.start) < progressDelay || done >= total {
			return
		}
		p.bar = progressbar.NewOptions64(total,
			progressbar.OptionSetWriter(os.Stderr),
			progressbar.OptionSetDescription(p.desc),
			progressbar.OptionShowBytes(true),
			progressbar.OptionUseIECUnits(true),
			progressbar.OptionShowTotalBytes(true),
			progressbar.OptionSetPredictTime(true),
			progressbar.OptionSetElapsedTime(true),
			progressbar.OptionThrottle(100*time.Millisecond),
			progressbar.OptionClearOnFinish(),
			progressbar.OptionSetWidth(30),
		)
	}
	if total != p.bar.GetMax64() {
		p.bar.ChangeMax64(total)
	}
	_ = p.bar.Set64(done)
}

// Done removes the bar, if one was drawn.
func (p *byteProgress) Done() {
	if p == nil {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.bar != nil {
		_ = p.bar.Clear()
		_ = p.bar.Exit()
		p.bar = nil
	}
	p.enabled = false
}
