// Command bench runs pgfork's benchmark scenarios. Each scenario measures
// pgfork against the baseline a user would reach for without it (cp -a,
// initdb + pg_ctl, CREATE DATABASE at the default strategy, pg_basebackup,
// pg_dump | pg_restore), side by side in the same run, and prints a table of
// medians and ratios. Results go to bench/results/<scenario>.md and are
// gathered into bench/REPORT.md.
//
// How to run (as root, from the repository's root; `make bench` prepares the
// test environment first and passes BENCHFLAGS):
//
//	go run ./bench                           # every scenario
//	go run ./bench -only copy                # the scenario copy, or those whose name contains "copy"
//	go run ./bench -only js,rust,django,volume
//	go run ./bench -list
//	make bench BENCHFLAGS='-only js,rust,django,volume'
//	go run ./bench -only volume -out /var/tmp/trial   # results elsewhere: a trial run leaves bench/ alone
//
// The suite scenarios (issue 33: each against its floor, the same suite
// with each worker reusing one database) scale down for a quick smoke run:
//
//	PGFORK_BENCH_VOLUME_TESTS=40      volume: tests per suite (default 400)
//	PGFORK_BENCH_VOLUME_ROWS=20000    volume: template rows (default 740000, ~180 MB)
//	PGFORK_BENCH_JS_TESTS=30          js: tests (default 300, files of 15)
//	PGFORK_BENCH_JS_SEED_MB=5         js: seed size (default 50)
//	PGFORK_BENCH_RUST_TESTS=20        rust: tests per contender (default 200)
//	PGFORK_BENCH_RUST_TARGET=DIR      rust: a cargo target directory kept between runs
//	PGFORK_BENCH_JAVA_TESTS=20        java: test methods per contender (default 200, classes of 10)
//	PGFORK_BENCH_DJANGO_REPS=1        django: runs per mode (default 3)
//	PGFORK_BENCH_DJANGO_CLASSES=4     django: classes of 10 tests (default 40, a quarter TransactionTestCase)
//	PGFORK_BENCH_DJANGO_PYTEST=0      django: skip the pytest-django part
//	PGFORK_BENCH_PYTHON=PY            django: a Python with clients/python[test] installed
//
// A scaled-down run says so in its section; do not commit its numbers as
// the report. Timing numbers from a loaded machine say so too (each
// section notes the load average at its start and end).
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"sort"
	"strings"
	"time"
)

// Scenario is one benchmark. Run fills the report with tables.
type Scenario struct {
	Name  string // short, unique, file-name safe
	Issue string // what it checks, e.g. "copy engine (issue 2)"
	Run   func(ctx context.Context, r *Report) error
}

var scenarios []Scenario

// register adds a scenario; call it from an init function in the scenario's file.
func register(s Scenario) { scenarios = append(scenarios, s) }

func main() {
	only := flag.String("only", "", "comma-separated scenarios to run: each the scenario with this name, or else those whose name contains it")
	list := flag.Bool("list", false, "list scenarios and exit")
	out := flag.String("out", "bench", "directory for results/ and REPORT.md")
	flag.Parse()
	sort.Slice(scenarios, func(i, j int) bool { return scenarios[i].Name < scenarios[j].Name })
	if *list {
		for _, s := range scenarios {
			fmt.Printf("%-24s %s\n", s.Name, s.Issue)
		}
		return
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	failed := 0
	var picked []Scenario
	for _, s := range scenarios {
		if selected(s.Name, *only) {
			picked = append(picked, s)
		}
	}
	if len(picked) == 0 {
		fmt.Fprintf(os.Stderr, "bench: no scenario matches -only %q (see -list)\n", *only)
		os.Exit(2)
	}
	for _, s := range picked {
		fmt.Printf("\n=== %s — %s\n", s.Name, s.Issue)
		r := &Report{Name: s.Name, Issue: s.Issue, Started: time.Now()}
		err := s.Run(ctx, r)
		if err != nil {
			r.Notef("FAILED: %v", err)
			fmt.Fprintf(os.Stderr, "bench %s: %v\n", s.Name, err)
			failed++
		}
		if werr := r.write(filepath.Join(*out, "results", s.Name+".md")); werr != nil {
			fmt.Fprintln(os.Stderr, werr)
			failed++
		}
	}
	if err := gather(*out); err != nil {
		fmt.Fprintln(os.Stderr, err)
		failed++
	}
	if failed > 0 {
		os.Exit(1)
	}
}

// selected reports whether the scenario named name is among only's
// comma-separated words (empty: every scenario): a word names the scenario
// it equals, or, when it equals none, every scenario whose name contains it.
func selected(name, only string) bool {
	if strings.TrimSpace(only) == "" {
		return true
	}
	for _, w := range strings.Split(only, ",") {
		w = strings.TrimSpace(w)
		if w == "" {
			continue
		}
		exact := false
		for _, s := range scenarios {
			exact = exact || s.Name == w
		}
		if exact && name == w || !exact && strings.Contains(name, w) {
			return true
		}
	}
	return false
}

// gather concatenates every results/*.md into REPORT.md.
func gather(dir string) error {
	files, _ := filepath.Glob(filepath.Join(dir, "results", "*.md"))
	sort.Strings(files)
	var b strings.Builder
	b.WriteString("# pgfork benchmark report\n\n")
	b.WriteString("Generated by `make bench` (go run ./bench). Each section is one scenario, measured side by side\n")
	b.WriteString("with its baseline in the same run; times are medians of the runs stated. Regenerate a single\n")
	b.WriteString("section with `go run ./bench -only NAME`.\n")
	for _, f := range files {
		data, err := os.ReadFile(f)
		if err != nil {
			return err
		}
		b.WriteString("\n")
		b.Write(data)
	}
	return os.WriteFile(filepath.Join(dir, "REPORT.md"), []byte(b.String()), 0o644)
}
