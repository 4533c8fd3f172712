package main

import (
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"sort"
	"strings"
	"time"
)

// Report collects a scenario's tables and notes, printed as they come and
// written as Markdown at the end.
type Report struct {
	Name, Issue string
	Started     time.Time
	b           strings.Builder
}

// Notef adds a line of prose (setup, machine, caveats, targets met or missed).
func (r *Report) Notef(format string, args ...any) {
	line := fmt.Sprintf(format, args...)
	fmt.Println(line)
	r.b.WriteString(line + "\n\n")
}

// Table adds a Markdown table.
func (r *Report) Table(header []string, rows [][]string) {
	var t strings.Builder
	t.WriteString("| " + strings.Join(header, " | ") + " |\n|")
	for range header {
		t.WriteString("---|")
	}
	t.WriteString("\n")
	for _, row := range rows {
		t.WriteString("| " + strings.Join(row, " | ") + " |\n")
	}
	fmt.Print(t.String())
	r.b.WriteString(t.String() + "\n")
}

// Target records whether a target was met: "TARGET MET"/"TARGET MISSED".
func (r *Report) Target(met bool, format string, args ...any) {
	status := "TARGET MET"
	if !met {
		status = "TARGET MISSED"
	}
	r.Notef("**%s**: %s", status, fmt.Sprintf(format, args...))
}

func (r *Report) write(path string) error {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return err
	}
	host, _ := os.Hostname()
	head := fmt.Sprintf("## %s — %s\n\nRun %s on %s (%d cores, %s/%s), took %s.\n\n",
		r.Name, r.Issue, r.Started.UTC().Format("2006-01-02 15:04 MST"), host, runtime.NumCPU(),
		runtime.GOOS, runtime.GOARCH, time.Since(r.Started).Round(time.Second))
	return os.WriteFile(path, []byte(head+r.b.String()), 0o644)
}

// Sample is a set of timed runs of one contender.
type Sample []time.Duration

// Median returns the median duration.
func (s Sample) Median() time.Duration { return s.Quantile(0.5) }

// Quantile returns the q-quantile (nearest rank).
func (s Sample) Quantile(q float64) time.Duration {
	if len(s) == 0 {
		return 0
	}
	c := append(Sample(nil), s...)
	sort.Slice(c, func(i, j int) bool { return c[i] < c[j] })
	i := int(q*float64(len(c)-1) + 0.5)
	return c[i]
}

// Measure runs setup (untimed) then fn (timed) n times and returns the times.
// setup may be nil.
func Measure(n int, setup func(i int) error, fn func(i int) error) (Sample, error) {
	s, err := MeasureInterleaved(n, Case{Setup: setup, Fn: fn})
	return s[0], err
}

// Case is one contender of MeasureInterleaved: Setup (untimed, may be
// nil) then Fn (timed).
type Case struct {
	Setup func(i int) error
	Fn    func(i int) error
}

// MeasureInterleaved runs the cases n times each, alternating them (round
// i starts at case i mod len(cases)), and returns one Sample per case. Use
// it where contenders are compared with each other on a shared disk: a
// slow or fast phase of the machine then falls on all of them alike, not
// on whichever ran in that phase as a block.
func MeasureInterleaved(n int, cases ...Case) ([]Sample, error) {
	out := make([]Sample, len(cases))
	for i := 0; i < n; i++ {
		for j := range cases {
			k := (i + j) % len(cases)
			c := cases[k]
			if c.Setup != nil {
				if err := c.Setup(i); err != nil {
					return out, err
				}
			}
			t0 := time.Now()
			if err := c.Fn(i); err != nil {
				return out, err
			}
			out[k] = append(out[k], time.Since(t0))
		}
	}
	return out, nil
}

// Dur formats a duration for tables with sensible precision.
func Dur(d time.Duration) string {
	switch {
	case d >= 10*time.Second:
		return fmt.Sprintf("%.1f s", d.Seconds())
	case d >= time.Second:
		return fmt.Sprintf("%.2f s", d.Seconds())
	case d >= time.Millisecond:
		return fmt.Sprintf("%.1f ms", float64(d)/float64(time.Millisecond))
	default:
		return fmt.Sprintf("%.0f µs", float64(d)/float64(time.Microsecond))
	}
}

// Ratio formats base/x as "N.Nx" (how many times faster x is than base).
func Ratio(base, x time.Duration) string {
	if x <= 0 {
		return "n/a"
	}
	return fmt.Sprintf("%.1fx", float64(base)/float64(x))
}
