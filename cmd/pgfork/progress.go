package main

import (
	"fmt"
	"io"
	"sync"
	"time"

	"github.com/schollz/progressbar/v3"

	"github.com/pgfork/pgfork/internal/units"
)

// progressDelay is how long an operation runs before its progress shows, so
// quick operations print nothing.
const progressDelay = 500 * time.Millisecond

// plainEvery is how often progress is printed as a plain line when stderr
// is not a terminal (a CI log, a file): often enough to show that work
// goes on, rarely enough not to flood the log.
const plainEvery = 5 * time.Second

// byteProgress is pgfork's one progress display for long operations
// counted in bytes (copy, clone, upgrade's transfer). On a terminal it draws
// a bar with the rate and the time left; when stderr is not a terminal it
// prints a plain line every plainEvery; with --quiet or --json it shows
// nothing. Nothing shows before progressDelay.
//
// The clock starts when the work starts (newByteProgress), not when the
// display first appears, so the first rate shown is bytes done over time
// spent, never the burst of a first report.
//
// Commands call Update from their progress callback and Done when finished;
// both are safe to call from any goroutine.
type byteProgress struct {
	mu    sync.Mutex
	desc  string
	start time.Time
	out   io.Writer
	mode  progressMode
	bar   *progressbar.ProgressBar
	gate  *delayedWriter
	last  time.Time // last plain line
}

type progressMode int

const (
	progressOff progressMode = iota
	progressBar
	progressPlain
)

// newByteProgress starts timing an operation described by desc ("copying").
func (cl *cli) newByteProgress(desc string) *byteProgress {
	mode := progressOff
	switch {
	case cl.g.quiet || cl.g.json:
	case isTerminal(cl.stderr):
		mode = progressBar
	default:
		mode = progressPlain
	}
	return newByteProgressTo(cl.stderr, desc, mode)
}

func newByteProgressTo(w io.Writer, desc string, mode progressMode) *byteProgress {
	p := &byteProgress{desc: desc, start: time.Now(), out: w, mode: mode, last: time.Now()}
	if mode == progressBar {
		p.gate = &delayedWriter{w: w, after: p.start.Add(progressDelay)}
		// The maximum is set by the first Update; the bar's clock starts now.
		p.bar = progressbar.NewOptions64(1,
			progressbar.OptionSetWriter(p.gate),
			progressbar.OptionSetDescription(desc),
			progressbar.OptionShowBytes(true),
			progressbar.OptionUseIECUnits(true),
			progressbar.OptionShowTotalBytes(true),
			progressbar.OptionSetPredictTime(true),
			progressbar.OptionSetElapsedTime(true),
			progressbar.OptionThrottle(100*time.Millisecond),
			progressbar.OptionClearOnFinish(),
			progressbar.OptionSetWidth(30),
		)
		p.bar.StartWithoutRender()
	}
	return p
}

// Update reports done of total bytes.
func (p *byteProgress) Update(done, total int64) {
	if p == nil || total <= 0 {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	switch p.mode {
	case progressBar:
		if total != p.bar.GetMax64() {
			p.bar.ChangeMax64(total)
		}
		_ = p.bar.Set64(min(done, total))
	case progressPlain:
		now := time.Now()
		if now.Sub(p.start) < progressDelay || now.Sub(p.last) < plainEvery || done >= total {
			return
		}
		p.last = now
		fmt.Fprintln(p.out, plainProgress(p.desc, done, total, now.Sub(p.start)))
	}
}

// plainProgress is the line printed when stderr is not a terminal:
// "copying: 1.2 GiB of 5.0 GiB (24%), 310.0 MiB/s, about 13s left".
func plainProgress(desc string, done, total int64, elapsed time.Duration) string {
	s := fmt.Sprintf("%s: %s of %s (%d%%)", desc, units.Bytes(done), units.Bytes(total), done*100/max(total, 1))
	if elapsed <= 0 || done <= 0 {
		return s
	}
	rate := float64(done) / elapsed.Seconds()
	left := time.Duration(float64(total-done) / rate * float64(time.Second))
	return s + fmt.Sprintf(", %s/s, about %s left", units.Bytes(int64(rate)), left.Round(time.Second))
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
	p.mode = progressOff
}

// delayedWriter drops what is written before after: the bar is drawn only
// once the operation has run for progressDelay.
type delayedWriter struct {
	w     io.Writer
	after time.Time
}

func (d *delayedWriter) Write(b []byte) (int, error) {
	if time.Now().Before(d.after) {
		return len(b), nil
	}
	return d.w.Write(b)
}
