package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgfork/pgfork/instance"
	"github.com/pgfork/pgfork/internal/units"
)

// The many-databases part of the upgrade scenario (issue 25): a cluster of
// n empty databases upgraded side by side by
//
//   - initdb + pg_upgrade --clone -j J by hand (the same mode pgfork's auto
//     picks on XFS), timed alone and with what pg_upgrade says to do next
//     (start, vacuumdb --all --analyze-in-stages [--missing-stats-only], stop),
//     with pg_upgrade's default sync and with --sync-method=syncfs (what
//     pgfork uses with pg_upgrade 17+ on Linux);
//   - pgfork upgrade --no-rehearse --no-analyze -j J on the stopped cluster
//     (target: within 5% of initdb + pg_upgrade by hand), with its phases;
//   - pgfork upgrade --stop-old -j J, its default, on the running cluster:
//     the rehearsal works on an online clone while the old cluster serves,
//     and only the real run is downtime (target: downtime within 10% of the
//     by-hand run up to its start; statistics are reported apart).
//
// Downtime is from the old cluster's stop until the application can
// connect to the new cluster: by hand after initdb, pg_upgrade and the start
// (the old cluster is stopped before the clock starts); for pgfork's default
// at the hand-over, statistics being rebuilt while it serves, as by hand.
//
//	PGFORK_BENCH_UPGRADE_JOBS   -j for pg_upgrade and pgfork (default 2)
//	PGFORK_BENCH_UPGRADE_ONLINE "0": only by hand and --no-rehearse (more runs in the time)
//	PGFORK_BENCH_UPGRADE_HAND_SYNCFS "1": with ONLINE=0, by hand with --sync-method=syncfs, as pgfork syncs

// ms is a duration in `pgfork --json`'s milliseconds.
type ms float64

// D returns it as a time.Duration.
func (m ms) D() time.Duration { return time.Duration(float64(m) * float64(time.Millisecond)) }

// upgJSON is the part of `pgfork upgrade --json` the bench reads.
type upgJSON struct {
	Phases []struct {
		Name    string `json:"name"`
		Elapsed ms     `json:"elapsed_ms"`
	} `json:"phases"`
	Steps []struct {
		Name    string `json:"name"`
		Elapsed ms     `json:"elapsed_ms"`
	} `json:"steps"`
	Rehearsal *struct {
		Online  bool `json:"online"`
		Elapsed ms   `json:"elapsed_ms"`
	} `json:"rehearsal"`
	Elapsed         ms `json:"elapsed_ms"`
	Downtime        ms `json:"downtime_ms"`
	AcceptsAfter    ms `json:"accepts_after_ms"`
	StatisticsAfter ms `json:"statistics_after_ms"`
}

func (j *upgJSON) phase(name string) time.Duration {
	var d time.Duration
	for _, p := range j.Phases {
		if p.Name == name {
			d += p.Elapsed.D()
		}
	}
	return d
}

// pgforkRun runs `pgfork upgrade` on a copy of src with extra flags; with
// online the copy is started first (untimed) and pgfork stops it.
func (b *upgBench) pgforkRun(ctx context.Context, src string, online bool, jobs int, extra ...string) (time.Duration, *upgJSON, error) {
	old, err := b.copyOf(ctx, src, "c-pgfork")
	if err != nil {
		return 0, nil, err
	}
	dir := filepath.Dir(old)
	defer os.RemoveAll(dir)
	var args []string
	if online {
		inst, err := instance.Start(ctx, instance.Config{BinDir: b.old.BinDir, Env: b.old.Env(), DataDir: old, User: b.user, LogFile: filepath.Join(dir, "old.log")})
		if err != nil {
			return 0, nil, err
		}
		inst.Release()
		defer func() {
			if inst, err := instance.Attach(old); err == nil {
				_ = inst.Stop(context.WithoutCancel(ctx), instance.Fast)
			}
		}()
		args = append(args, "--stop-old")
	}
	syscall.Sync()
	return b.pgforkExec(ctx, old, jobs, append(args, extra...)...)
}

// pgforkExec runs `pgfork upgrade old dir/new -j jobs --json` with extra
// flags, times it, reads its JSON and stops the new cluster if it runs.
func (b *upgBench) pgforkExec(ctx context.Context, old string, jobs int, extra ...string) (time.Duration, *upgJSON, error) {
	dir := filepath.Dir(old)
	args := []string{"upgrade", old, filepath.Join(dir, "new"), "--to", strconv.Itoa(b.new.Major), "-j", strconv.Itoa(jobs),
		"--old-bindir", b.old.BinDir, "--new-bindir", b.new.BinDir, "-q", "--json"}
	args = append(args, extra...)
	t0 := time.Now()
	cmd := exec.CommandContext(ctx, b.bin, args...)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	if err := cmd.Run(); err != nil {
		return 0, nil, fmt.Errorf("pgfork %s: %v\n%s%s", strings.Join(args, " "), err, lastLines(out.String(), 30), lastLines(errb.String(), 30))
	}
	el := time.Since(t0)
	var j upgJSON
	if err := json.Unmarshal(out.Bytes(), &j); err != nil {
		return 0, nil, fmt.Errorf("pgfork --json: %v\n%s", err, lastLines(out.String(), 20))
	}
	if pf, err := instance.ReadPidFile(filepath.Join(dir, "new")); err == nil && pf.Pid > 0 {
		if inst, err := instance.Attach(filepath.Join(dir, "new")); err == nil {
			_ = inst.Stop(ctx, instance.Fast)
		}
	}
	return el, &j, nil
}

// byHand: initdb + pg_upgrade --clone -j jobs (timed as "alone"), then
// start, vacuumdb and stop ("full").
func (b *upgBench) byHand(ctx context.Context, src string, jobs int, extra ...string) (alone, initdb, up, full time.Duration, err error) {
	old, err := b.copyOf(ctx, src, "c-hand")
	if err != nil {
		return 0, 0, 0, 0, err
	}
	dir := filepath.Dir(old)
	defer os.RemoveAll(dir)
	syscall.Sync()
	t0 := time.Now()
	nd, err := b.initNew(ctx, dir)
	if err != nil {
		return 0, 0, 0, 0, err
	}
	initdb = time.Since(t0)
	if err := b.run(ctx, b.new, dir, "pg_upgrade", append([]string{"-b", b.old.BinDir, "-B", b.new.BinDir, "-d", old, "-D", nd, "--clone", "-j", strconv.Itoa(jobs)}, extra...)...); err != nil {
		return 0, 0, 0, 0, err
	}
	alone = time.Since(t0)
	inst, err := instance.Start(ctx, instance.Config{BinDir: b.new.BinDir, Env: b.new.Env(), DataDir: nd, User: b.user, LogFile: filepath.Join(dir, "new.log")})
	if err != nil {
		return 0, 0, 0, 0, err
	}
	up = time.Since(t0) // the application may connect from here
	args := []string{"--all", "--analyze-in-stages", "-h", inst.SocketDir, "-p", strconv.Itoa(inst.Port), "-U", "postgres", "-j", strconv.Itoa(jobs)}
	if b.new.Major >= 18 {
		args = append(args, "--missing-stats-only")
	}
	err = b.run(ctx, b.new, dir, "vacuumdb", args...)
	if serr := inst.Stop(ctx, instance.Fast); err == nil {
		err = serr
	}
	return alone, initdb, up, time.Since(t0), err
}

// loadavg returns /proc/loadavg's first three fields.
func loadavg() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "?"
	}
	f := strings.Fields(string(b))
	if len(f) < 3 {
		return "?"
	}
	return strings.Join(f[:3], " ")
}

// manyDBs builds a cluster of n empty databases and runs the contenders in
// turns, b.runs times each.
func (b *upgBench) manyDBs(ctx context.Context, r *Report, n int) error {
	jobs := max(copyEnvInt("PGFORK_BENCH_UPGRADE_JOBS", 2), 1)
	all := os.Getenv("PGFORK_BENCH_UPGRADE_ONLINE") != "0"
	var handExtra []string
	handName := "by hand: initdb + pg_upgrade --clone"
	if !all && os.Getenv("PGFORK_BENCH_UPGRADE_HAND_SYNCFS") == "1" {
		handExtra = []string{"--sync-method=syncfs"}
		handName += " --sync-method=syncfs"
	}
	t0 := time.Now()
	src, err := b.buildSource(ctx, "src-dbs", func(inst *instance.Instance, sock string) error {
		conn, err := pgx.Connect(ctx, inst.ConnString("", "postgres"))
		if err != nil {
			return err
		}
		defer conn.Close(ctx)
		for i := 0; i < n; i++ {
			if _, err := conn.Exec(ctx, fmt.Sprintf("CREATE DATABASE db%04d STRATEGY FILE_COPY", i)); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return err
	}
	defer os.RemoveAll(filepath.Dir(src))
	size, _ := dirBytes(src)
	r.Notef("%d empty databases: source cluster of %s built in %s; -j %d everywhere; %d run(s) per contender, in turns; load average at the start %s",
		n, units.Bytes(size), Dur(time.Since(t0)), jobs, b.runs, loadavg())

	var handAlone, handInit, handUp, handFull, sfAlone, sfUp, sfFull, nrTotal, onTotal, onDown Sample
	var nrRuns, onRuns []*upgJSON
	var loads []string
	for i := 0; i < b.runs; i++ {
		loads = append(loads, loadavg())
		a, in, u, f, err := b.byHand(ctx, src, jobs, handExtra...)
		if err != nil {
			return fmt.Errorf("by hand: %w", err)
		}
		handAlone, handInit, handUp, handFull = append(handAlone, a), append(handInit, in), append(handUp, u), append(handFull, f)
		fmt.Printf("  %d dbs by hand: initdb+pg_upgrade %s, full %s\n", n, Dur(a), Dur(f))

		// pgfork syncs with syncfs where pg_upgrade can (17+ on Linux):
		// the same by hand, so that the comparison is of the rest.
		if all {
			loads = append(loads, loadavg())
			a, _, u, f, err = b.byHand(ctx, src, jobs, "--sync-method=syncfs")
			if err != nil {
				return fmt.Errorf("by hand with syncfs: %w", err)
			}
			sfAlone, sfUp, sfFull = append(sfAlone, a), append(sfUp, u), append(sfFull, f)
			fmt.Printf("  %d dbs by hand --sync-method=syncfs: initdb+pg_upgrade %s, full %s\n", n, Dur(a), Dur(f))
		}

		loads = append(loads, loadavg())
		el, j, err := b.pgforkRun(ctx, src, false, jobs, "--no-rehearse", "--no-analyze")
		if err != nil {
			return err
		}
		nrTotal, nrRuns = append(nrTotal, el), append(nrRuns, j)
		fmt.Printf("  %d dbs pgfork --no-rehearse --no-analyze %s\n", n, Dur(el))

		if !all {
			continue
		}
		loads = append(loads, loadavg())
		el, j, err = b.pgforkRun(ctx, src, true, jobs)
		if err != nil {
			return err
		}
		if j.Rehearsal == nil || !j.Rehearsal.Online || j.Downtime <= 0 {
			return fmt.Errorf("pgfork --stop-old did not rehearse online, or reported no downtime")
		}
		onTotal, onDown, onRuns = append(onTotal, el), append(onDown, j.Downtime.D()), append(onRuns, j)
		fmt.Printf("  %d dbs pgfork online: total %s, downtime %s\n", n, Dur(el), Dur(j.Downtime.D()))
	}
	loads = append(loads, loadavg())
	m := func(s Sample) time.Duration { return s.Median() }
	pct := func(a, base time.Duration) string { return fmt.Sprintf("%+.1f%%", 100*(float64(a)/float64(base)-1)) }
	r.Notef("Load average (1, 5, 15 min) before each contender and at the end: %s.", strings.Join(loads, " | "))
	if !all {
		var rows [][]string
		for i := range handAlone {
			rows = append(rows, []string{strconv.Itoa(i + 1), Dur(handAlone[i]), Dur(nrTotal[i]), pct(nrTotal[i], handAlone[i]),
				Dur(nrRuns[i].phase("settings")), Dur(nrRuns[i].phase("upgrade")), Dur(nrRuns[i].phase("start"))})
		}
		rows = append(rows, []string{"median", Dur(m(handAlone)), Dur(m(nrTotal)), pct(m(nrTotal), m(handAlone)), "", "", ""})
		r.Table([]string{"run", handName, "pgfork --no-rehearse --no-analyze", "vs by hand", "its settings", "its upgrade", "its start + check"}, rows)
		r.Target(float64(m(nrTotal)) <= 1.05*float64(m(handAlone)), "%d databases: pgfork --no-rehearse --no-analyze %s within 5%% of %s %s (%s)",
			n, Dur(m(nrTotal)), handName, Dur(m(handAlone)), pct(m(nrTotal), m(handAlone)))
		return nil
	}
	r.Table([]string{"databases", "by hand: initdb + pg_upgrade --clone", "+ start (accepts)", "+ vacuumdb, stop", "by hand, --sync-method=syncfs", "+ start (accepts)", "+ vacuumdb, stop",
		"pgfork --no-rehearse --no-analyze", "vs by hand (syncfs)", "pgfork default (online rehearsal): downtime until it accepts", "vs by hand (syncfs) until it accepts", "its total (rehearsal while serving, statistics after)"},
		[][]string{{strconv.Itoa(n), Dur(m(handAlone)), Dur(m(handUp)), Dur(m(handFull)), Dur(m(sfAlone)), Dur(m(sfUp)), Dur(m(sfFull)), Dur(m(nrTotal)),
			pct(m(nrTotal), m(handAlone)) + " (" + pct(m(nrTotal), m(sfAlone)) + ")",
			Dur(m(onDown)), pct(m(onDown), m(handUp)) + " (" + pct(m(onDown), m(sfUp)) + ")", Dur(m(onTotal))}})
	r.Target(float64(m(nrTotal)) <= 1.05*float64(m(handAlone)), "%d databases: pgfork --no-rehearse --no-analyze %s within 5%% of initdb + pg_upgrade --clone by hand %s (%s)",
		n, Dur(m(nrTotal)), Dur(m(handAlone)), pct(m(nrTotal), m(handAlone)))
	r.Target(float64(m(nrTotal)) <= 1.05*float64(m(sfAlone)), "%d databases: pgfork --no-rehearse --no-analyze %s within 5%% of the same by hand with pg_upgrade --sync-method=syncfs, as pgfork syncs, %s (%s)",
		n, Dur(m(nrTotal)), Dur(m(sfAlone)), pct(m(nrTotal), m(sfAlone)))
	// Downtime ends when the application can connect: by hand after
	// initdb, pg_upgrade and the start (vacuumdb runs while it serves), for
	// pgfork at the hand-over (statistics follow while it serves).
	r.Target(float64(m(onDown)) <= 1.10*float64(m(handUp)), "%d databases: pgfork default's downtime %s (online rehearsal before the stop; stop → the application can connect) within 10%% of initdb + pg_upgrade --clone + start by hand %s (%s)",
		n, Dur(m(onDown)), Dur(m(handUp)), pct(m(onDown), m(handUp)))
	r.Target(float64(m(onDown)) <= 1.10*float64(m(sfUp)), "%d databases: pgfork default's downtime %s within 10%% of the same by hand with --sync-method=syncfs %s (%s)",
		n, Dur(m(onDown)), Dur(m(sfUp)), pct(m(onDown), m(sfUp)))
	if len(onRuns) > 0 {
		var stats Sample
		for _, j := range onRuns {
			stats = append(stats, j.phase("statistics"))
		}
		r.Notef("%d databases: pgfork default rebuilt statistics while the new cluster served (median %s), as by hand vacuumdb runs after the start (by hand with syncfs: start, vacuumdb and stop %s).",
			n, Dur(m(stats)), Dur(m(sfFull)-m(sfAlone)))
	}

	// Where pgfork's time goes (the median run of each).
	mid := func(runs []*upgJSON, s Sample) *upgJSON {
		med := s.Median()
		for i, d := range s {
			if d == med {
				return runs[i]
			}
		}
		return runs[0]
	}
	nr, on := mid(nrRuns, nrTotal), mid(onRuns, onTotal)
	r.Notef("Phases (median run); by hand has initdb and pg_upgrade only, then start, vacuumdb and stop. pgfork's online rehearsal runs while the old cluster serves; its downtime starts at stop-old.")
	b.phaseTable(r, map[string]string{
		"initdb":  Dur(m(handInit)),
		"upgrade": Dur(m(handAlone) - m(handInit)),
		"start":   "(start + vacuumdb + stop: " + Dur(m(handFull)-m(handAlone)) + ")",
		"total":   Dur(m(handAlone)) + " / " + Dur(m(handFull)),
	}, []string{"pgfork --no-rehearse --no-analyze", "pgfork default (online)"}, []*upgJSON{nr, on}, []time.Duration{m(nrTotal), m(onTotal)})
	var steps [][]string
	for _, s := range nr.Steps {
		if s.Elapsed.D() >= 500*time.Millisecond {
			steps = append(steps, []string{s.Name, Dur(s.Elapsed.D())})
		}
	}
	if len(steps) > 0 {
		r.Notef("pg_upgrade's steps of 0.5 s or more inside pgfork --no-rehearse:")
		r.Table([]string{"pg_upgrade step", "time"}, steps)
	}
	return nil
}

// upgPhases are pgfork upgrade's phases in the order they run.
var upgPhases = []string{"prepare", "rehearsal", "stop-old", "settings", "initdb", "check", "upgrade", "start", "statistics"}

// phaseTable prints where the time of pgfork runs went, phase by phase,
// beside a by-hand column (hand: by phase name, and "total"); totals are
// the runs' wall-clock times, whose remainder is shown as outside phases.
func (b *upgBench) phaseTable(r *Report, hand map[string]string, cols []string, runs []*upgJSON, totals []time.Duration) {
	var rows [][]string
	for _, ph := range upgPhases {
		row := []string{ph, hand[ph]}
		for _, j := range runs {
			c := ""
			if d := j.phase(ph); d > 0 {
				c = Dur(d)
			}
			row = append(row, c)
		}
		rows = append(rows, row)
	}
	out := []string{"outside phases (process start, JSON, exit)", ""}
	tot := []string{"total", hand["total"]}
	for i, j := range runs {
		var d time.Duration
		for _, p := range j.Phases {
			d += p.Elapsed.D()
		}
		out = append(out, Dur(totals[i]-d))
		tot = append(tot, Dur(totals[i]))
	}
	r.Table(append([]string{"phase", "by hand"}, cols...), append(rows, out, tot))
}
