package main

import (
	"bufio"
	"cmp"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/pgfork/pgfork/instance"
	"github.com/pgfork/pgfork/pgbin"
)

// goBuild builds the pgfork binary the benchmarks run, as `make build` does:
// statically linked (CGO_ENABLED=0), which saves the dynamic loader's few
// milliseconds on every start — measurable when a copy itself takes 50 ms.
func goBuild(ctx context.Context, out string) ([]byte, error) {
	cmd := exec.CommandContext(ctx, "go", "build", "-o", out, "./cmd/pgfork")
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	return cmd.CombinedOutput()
}

// benchPostgres returns the PostgreSQL build a scenario runs (from the
// environment variable env, default Debian's 15) and the OS user servers run
// as.
func benchPostgres(env string) (pgbin.Installation, *instance.OSUser, error) {
	bin := os.Getenv(env)
	if bin == "" {
		bin = "/usr/lib/postgresql/15/bin"
	}
	pg, err := pgbin.Find(pgbin.Options{Explicit: bin}, 0)
	if err != nil {
		return pgbin.Installation{}, nil, err
	}
	user, err := instance.ResolveUser("")
	return pg, user, err
}

// clientWorkspace makes the temporary directory a client scenario (js, rust,
// django) works in, readable by the postgres user, and builds pgfork into it.
// The caller removes the directory.
func clientWorkspace(prefix string) (dir, bin string, err error) {
	dir, err = os.MkdirTemp("", prefix)
	if err != nil {
		return "", "", err
	}
	_ = os.Chmod(dir, 0o755)
	bin = filepath.Join(dir, "pgfork")
	if out, err := goBuild(context.Background(), bin); err != nil {
		os.RemoveAll(dir)
		return "", "", fmt.Errorf("go build: %v: %s", err, out)
	}
	return dir, bin, nil
}

// runSuite runs a test suite's command and returns its wall time and output;
// it fails when the command does, or when its output lacks ok (the runner's
// success line), and then quotes the output's last 3,000 bytes.
func runSuite(cmd *exec.Cmd, ok string) (time.Duration, string, error) {
	t0 := time.Now()
	b, err := cmd.CombinedOutput()
	took := time.Since(t0)
	out := string(b)
	if err != nil || !strings.Contains(out, ok) {
		tail := out[max(0, len(out)-3000):]
		if err == nil {
			err = fmt.Errorf("no %q in the output", ok)
		}
		return took, out, fmt.Errorf("%s: %v:\n%s", strings.Join(cmd.Args, " "), err, tail)
	}
	return took, out, nil
}

// readTimings reads the file a client suite writes its per-test timings to,
// one line per test: milliseconds to acquire a database and milliseconds of
// that the server took to hand it out. A missing file gives empty samples.
func readTimings(path string) (acquire, handOut Sample) {
	f, err := os.Open(path)
	if err != nil {
		return nil, nil
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fl := strings.Fields(sc.Text())
		if len(fl) != 2 {
			continue
		}
		ms, err1 := strconv.ParseFloat(fl[0], 64)
		ho, err2 := strconv.ParseFloat(fl[1], 64)
		if err1 == nil && err2 == nil {
			acquire = append(acquire, time.Duration(ms*float64(time.Millisecond)))
			handOut = append(handOut, time.Duration(ho*float64(time.Millisecond)))
		}
	}
	return acquire, handOut
}

// autoStartEnv is the environment of a suite run with no server configured
// (issue 34): no URL, the binary as $PGFORK_BIN and on PATH, and the state
// directory to reuse across runs (so the template survives) as
// $PGFORK_STATE_DIR and in $PGFORK_SERVE_ARGS.
func autoStartEnv(bin, state string) []string {
	return []string{"PGFORK_URL=", "INTEGRESQL_CLIENT_BASE_URL=", "PGFORK_TOKEN=", "PGFORK_BIN=" + bin,
		"PATH=" + filepath.Dir(bin) + string(os.PathListSeparator) + os.Getenv("PATH"),
		"PGFORK_STATE_DIR=" + state, "PGFORK_SERVE_ARGS=--state-dir " + state}
}

// zeroSetup is issue 34's second run with zero setup: run (a part of a
// suite, given autoStartEnv) twice in a row, nothing started by hand, the
// client expected to start pgfork serve itself with its state in a
// directory under tmp; the second run reuses the template. It returns both
// runs' wall times, or why they were not measured: a client without
// auto-start fails (its message is quoted), and a server answering at the
// default URL would be used instead of one started. A server still running
// 2 s after a run ends is reported in left (and stopped). Each run starts
// once other, the section's own serve on the same PostgreSQL, has settled:
// its pools refill to the demand they learned (up to hundreds of full
// copies), which would otherwise run beside the measured setup, and the
// kernel has written their pages back (serveProc.quiet).
//
// With port > 0 it then measures base: the same part twice more (the
// second timed) against a serve started by hand on the same state directory (on 127.0.0.1:port,
// with serveEnv, the environment the auto-started one had from the run)
// and already answering, so that the second run less base is the setup
// alone: the same server, the same PostgreSQL, the same pool (base 0: not
// measured, or it failed; why is in notMeasured only when the runs failed).
func zeroSetup(ctx context.Context, bin, tmp string, other *serveProc, port int, serveEnv []string, run func(env []string) (time.Duration, error)) (first, second, base time.Duration, left []string, notMeasured string) {
	for _, u := range []string{"http://127.0.0.1:5000/healthz", "http://localhost:5000/healthz"} {
		if res, err := benchHTTP.Get(u); err == nil {
			res.Body.Close()
			return 0, 0, 0, nil, "a server already answers at the default URL (" + u + "): the client would use it instead of starting one"
		}
	}
	state := filepath.Join(tmp, "zero-setup-state")
	if err := os.MkdirAll(state, 0o755); err != nil {
		return 0, 0, 0, nil, err.Error()
	}
	env := autoStartEnv(bin, state)
	for i, d := range []*time.Duration{&first, &second} {
		if other != nil {
			if err := other.quiet(ctx, 5*time.Minute); err != nil {
				return 0, 0, 0, left, "the section's serve did not settle: " + err.Error()
			}
		}
		took, err := run(env)
		if pids := serversOf(state, 2*time.Second); len(pids) > 0 {
			left = append(left, fmt.Sprintf("run %d left pgfork serve running (pid %v)", i+1, pids))
			for _, pid := range pids {
				_ = syscall.Kill(pid, syscall.SIGTERM)
			}
		}
		if err != nil {
			msg := err.Error()
			if i == 0 {
				return 0, 0, 0, left, "auto-start missing or failing (" + autoStartReason(msg) + ")"
			}
			return first, 0, 0, left, "the second run failed: " + autoStartReason(msg)
		}
		*d = took
	}
	if port > 0 {
		base = zeroSetupBase(ctx, bin, state, other, port, serveEnv, env, run)
	}
	return first, second, base, left, ""
}

// zeroSetupBase runs the part once against a serve started by hand on
// state (see zeroSetup); 0 when it could not.
func zeroSetupBase(ctx context.Context, bin, state string, other *serveProc, port int, serveEnv, env []string, run func(env []string) (time.Duration, error)) time.Duration {
	if other != nil {
		if err := other.quiet(ctx, 5*time.Minute); err != nil {
			return 0
		}
	}
	// The auto-started serve's own settings: no --db-prefix beyond the
	// default (startServe's is the default), no token on loopback.
	srv, err := startServeEnv(bin, state, port, serveEnv)
	if err != nil {
		return 0
	}
	defer func() { _ = srv.stop() }()
	// Twice, the second timed: as the auto-started runs, whose first one
	// warmed what a first run warms (cargo's checks, the page cache).
	// Each once the serve has settled: the first run's give-backs are
	// recreated after it, and would otherwise run beside the second.
	var took time.Duration
	for range 2 {
		if err := srv.quiet(ctx, 2*time.Minute); err != nil {
			return 0
		}
		if took, err = run(append(append([]string{}, env...), "PGFORK_URL="+srv.base)); err != nil {
			return 0
		}
	}
	return took
}

// autoStartReason is the last line of a failed run's output that says why
// (the client's message), else its last line.
func autoStartReason(out string) string {
	lines := strings.Split(strings.TrimSpace(out), "\n")
	for i := len(lines) - 1; i >= 0; i-- { // the last: a traceback's message, not its source lines
		l := lines[i]
		if strings.Contains(l, "pgfork") && (strings.Contains(l, "serve") || strings.Contains(l, "answer")) {
			return strings.TrimRight(strings.TrimSpace(l), ":")
		}
	}
	return strings.TrimRight(strings.TrimSpace(lines[len(lines)-1]), ":")
}

// serversOf returns the pids of processes whose command line names dir
// (a pgfork serve with its state there) still alive after wait.
func serversOf(dir string, wait time.Duration) []int {
	deadline := time.Now().Add(wait)
	for {
		var pids []int
		ents, _ := os.ReadDir("/proc")
		for _, e := range ents {
			pid, err := strconv.Atoi(e.Name())
			if err != nil || pid == os.Getpid() {
				continue
			}
			b, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
			if err == nil && strings.Contains(string(b), "serve") && strings.Contains(string(b), dir) {
				pids = append(pids, pid)
			}
		}
		if len(pids) == 0 || time.Now().After(deadline) {
			return pids
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// ZeroSetupTarget records issue 34's target for a zero-setup second run:
// its setup ≤ 1 s, or why it was not measured. With base, the setup is the
// second run's wall time less base, the same part's against a running serve
// with the template built; without (0), second is the setup itself (the
// runner's own record).
func (r *Report) ZeroSetupTarget(what string, first, second, base time.Duration, left []string, notMeasured string) {
	for _, l := range left {
		r.Target(false, "%s: pgfork serve stops when the run ends (within 2 s): %s", what, l)
	}
	if notMeasured != "" {
		r.Notef("**NOT MEASURED**: %s, second run's setup with zero setup (an auto-started serve reusing the template) ≤ 1 s: %s.", what, notMeasured)
		return
	}
	if base == 0 {
		r.Target(second <= time.Second, "%s, second run's setup with zero setup (auto-started serve reusing the template) ≤ 1 s: %s (the first run's, building the template: %s)",
			what, Dur(second), Dur(first))
		return
	}
	setup := second - base
	if setup < 0 {
		r.Target(true, "%s, second run's setup with zero setup (auto-started serve reusing the template) ≤ 1 s: none measurable "+
			"(second run %s, %s less than the same against a serve started by hand on the same state directory and answering, %s; the first run, building the template: %s)",
			what, Dur(second), Dur(-setup), Dur(base), Dur(first))
		return
	}
	r.Target(setup <= time.Second, "%s, second run's setup with zero setup (auto-started serve reusing the template) ≤ 1 s: %s "+
		"(second run %s less the same against a serve started by hand on the same state directory and answering %s; the first run, building the template: %s)", what, Dur(setup), Dur(second), Dur(base), Dur(first))
}

// suiteRun is one run of a client suite (js, rust): its wall time and the
// per-test waits its tests recorded.
type suiteRun struct {
	name    string
	took    time.Duration
	acquire Sample // the wait for a database (hand-out + connect)
	handOut Sample // of that, the hand-out alone
}

// laterRuns is how many times a suite runs again on one serve after its
// first run, and its floor as many times (alternateRuns): the report gives
// the run of median suite time of each. The machine is shared, and one short
// run against one floor run swung by tenths of the ratio between two
// otherwise equal runs.
const laterRuns = 3

// medianBy is the element of runs of median took (the later of the two
// middle ones when their number is even); runs is not reordered.
func medianBy[T any](runs []T, took func(T) time.Duration) T {
	s := slices.Clone(runs)
	slices.SortStableFunc(s, func(a, b T) int { return cmp.Compare(took(a), took(b)) })
	return s[len(s)/2]
}

// alternateRuns runs run and floor laterRuns times each, in turns (run,
// floor, run, floor …), pause ahead of each but the first: the floors drift
// with the machine's load (by up to 2x within minutes on this shared
// machine), and a floor measured beside each run sees the machine that run
// saw, where three floors after three runs did not.
func alternateRuns[T any](pause func() error, run, floor func() (T, error)) (runs, floors []T, err error) {
	steps := [2]struct {
		name string
		f    func() (T, error)
		into *[]T
	}{{"run", run, &runs}, {"floor", floor, &floors}}
	for i := range 2 * laterRuns {
		s := steps[i%2]
		if i > 0 {
			if err := pause(); err != nil {
				return runs, floors, fmt.Errorf("before %s %d: %w", s.name, i/2+1, err)
			}
		}
		x, err := s.f()
		if err != nil {
			return runs, floors, fmt.Errorf("%s %d: %w", s.name, i/2+1, err)
		}
		*s.into = append(*s.into, x)
	}
	return runs, floors, nil
}

// suiteTook is a suiteRun's suite time, medianBy's key.
func suiteTook(s suiteRun) time.Duration { return s.took }

// laterResult is what secondAndFloor measured.
type laterResult struct {
	second, floor suiteRun // each the run of median suite time
	bare          float64  // the bare CREATE DATABASE rate, databases/s
	before        string   // the pool before the second run (poolNote)
}

// secondAndFloor runs a client suite again on serve p laterRuns times
// (second) and its floor as many times, in turns (alternateRuns), each once
// the run before it ended for its pool (its run gap passed: the demand it
// took is learned, as between two runs of a suite a user starts, and a
// floor's takes do not count in the run before) and the pool has settled;
// each floor takes workers databases (given to floor as PGB_FLOOR_URLS)
// and gives them back after its run. Then it measures the bare CREATE
// DATABASE rate of p's cluster at workers sessions over bareN databases.
func secondAndFloor(ctx context.Context, p *serveProc, workers, bareN int, second func() (suiteRun, error), floor func(urls string) (suiteRun, error)) (laterResult, error) {
	var l laterResult
	hash, err := p.onlyHash()
	if err != nil {
		return l, err
	}
	if err := p.runEnded(ctx, hash, 5*time.Minute); err != nil {
		return l, fmt.Errorf("before the second run: %w", err)
	}
	l.before = p.poolNote()
	seconds, floors, err := alternateRuns(func() error { return p.afterRun(ctx, 5*time.Minute) }, second, func() (suiteRun, error) {
		dbs, giveBack, err := p.takeDatabases(workers)
		if err != nil {
			return suiteRun{}, err
		}
		defer giveBack()
		return floor(floorURLs(dbs))
	})
	if err != nil {
		return l, fmt.Errorf("second runs and floors: %w", err)
	}
	l.second = medianBy(seconds, suiteTook)
	l.floor = medianBy(floors, suiteTook)
	if err := p.afterRun(ctx, 5*time.Minute); err != nil {
		return l, err
	}
	l.bare, err = p.bareRate(ctx, workers, bareN)
	return l, err
}

// floorRows adds a client suite's table against its floor (floor, cold
// and second runs of tests tests on one serve; the peers that ran on the
// same cluster after them) and the target for the second run.
func (r *Report) floorRows(what, where string, tests int, bare float64, floor, cold, second suiteRun, peers ...suiteRun) {
	fresh := func(x suiteRun) FloorRow {
		return FloorRow{Name: x.name, Suite: x.took, Wait: x.acquire, Rate: float64(tests) / x.took.Seconds()}
	}
	rows := []FloorRow{fresh(cold), fresh(second)}
	for _, p := range peers {
		rows = append(rows, FloorRow{Name: p.name, Suite: p.took, Wait: p.acquire})
	}
	r.FloorTable("against the floor, "+where, bare, FloorRow{Name: floor.name, Suite: floor.took, Wait: floor.acquire}, rows...)
	r.FloorTarget(what+"'s second run, "+where+",", second.took, floor.took, 1.5)
}
