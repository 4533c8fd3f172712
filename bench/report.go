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

// Cell formats the q-quantile for a table; "—" for an empty sample (not
// recorded).
func (s Sample) Cell(q float64) string {
	if len(s) == 0 {
		return "—"
	}
	return Dur(s.Quantile(q))
}

// Times formats x as a multiple of base ("2.35x"; "n/a" without a base).
func Times(x, base time.Duration) string {
	if base <= 0 {
		return "n/a"
	}
	return fmt.Sprintf("%.2fx", float64(x)/float64(base))
}

// FloorRow is one contender of a suite measured against its floor (issue
// 33): the same suite on the same workers, each worker reusing one database
// made once (no isolation).
type FloorRow struct {
	Name  string
	Suite time.Duration // what the section compares (it says what)
	Wait  Sample        // per-test wait for a database; empty: none
	Rate  float64       // fresh databases per second; 0: none made
}

// FloorTable adds the table every suite section shares: each contender as a
// multiple of the floor (the first row), its per-test wait p50/p99, and its
// fresh databases per second next to bare, the bare CREATE DATABASE …
// STRATEGY FILE_COPY rate on the same cluster (0: not measured).
func (r *Report) FloorTable(title string, bare float64, floor FloorRow, rows ...FloorRow) {
	cell := func(f float64) string {
		if f <= 0 {
			return "—"
		}
		return fmt.Sprintf("%.1f", f)
	}
	var out [][]string
	for _, x := range append([]FloorRow{floor}, rows...) {
		vsBare := "—"
		if x.Rate > 0 && bare > 0 {
			vsBare = fmt.Sprintf("%.2fx", x.Rate/bare)
		}
		out = append(out, []string{x.Name, Dur(x.Suite), Times(x.Suite, floor.Suite), x.Wait.Cell(0.5), x.Wait.Cell(0.99), cell(x.Rate), cell(bare), vsBare})
	}
	r.Table([]string{title, "suite", "vs floor", "wait p50", "wait p99", "fresh DBs/s", "bare CREATE DATABASE/s", "vs bare"}, out)
}

// FloorTarget records issue 33's target for a second run on the same
// serve: at most limit times its floor.
func (r *Report) FloorTarget(what string, run, floor time.Duration, limit float64) bool {
	met := floor > 0 && run > 0 && float64(run) <= limit*float64(floor)
	r.Target(met, "%s ≤ %.1fx its floor: %s vs %s = %s", what, limit, Dur(run), Dur(floor), Times(run, floor))
	return met
}
