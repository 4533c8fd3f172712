package main

import (
	"bytes"
	"strings"
	"testing"
	"time"
)

// TestPlainProgress: when stderr is not a terminal, progress is a plain
// line with the rate and the time left, printed every plainEvery, none
// before progressDelay, and the rate is bytes over the time since the work
// started (not since the first report).
func TestPlainProgress(t *testing.T) {
	var out bytes.Buffer
	p := newByteProgressTo(&out, "copying", progressPlain)
	p.Update(1<<20, 100<<20) // too early
	if out.Len() != 0 {
		t.Fatalf("printed before the delay: %q", out.String())
	}
	// Pretend the work started 10 s ago and the last line 10 s ago.
	p.start = time.Now().Add(-10 * time.Second)
	p.last = p.start
	p.Update(50<<20, 100<<20)
	line := out.String()
	if !strings.HasPrefix(line, "copying: 50.0 MiB of 100.0 MiB (50%), 5.0 MiB/s, about 10s left") {
		t.Errorf("line %q", line)
	}
	p.Update(60<<20, 100<<20) // within plainEvery of the last line
	if out.String() != line {
		t.Errorf("printed again too soon: %q", out.String())
	}
	p.Done()
	p.Update(70<<20, 100<<20)
	if out.String() != line {
		t.Errorf("printed after Done: %q", out.String())
	}
}

// TestBarClockStartsWithTheWork: the bar draws nothing before progressDelay,
// and its rate counts from the start of the work.
func TestBarClockStartsWithTheWork(t *testing.T) {
	var out bytes.Buffer
	p := newByteProgressTo(&out, "copying", progressBar)
	p.Update(1<<20, 100<<20)
	if out.Len() != 0 {
		t.Fatalf("drawn before the delay: %q", out.String())
	}
	time.Sleep(progressDelay + 100*time.Millisecond)
	p.Update(2<<20, 100<<20)
	if s := p.bar.State(); s.SecondsSince < progressDelay.Seconds() || s.CurrentNum != 2<<20 || s.Max != 100<<20 {
		t.Errorf("bar state %+v", s)
	}
	if !strings.Contains(out.String(), "copying") {
		t.Errorf("nothing drawn after the delay: %q", out.String())
	}
	p.Done()
}
