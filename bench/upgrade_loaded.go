package main

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgfork/pgfork/instance"
	"github.com/pgfork/pgfork/internal/units"
)

// The loaded part of the upgrade scenario (issue 25): a pgbench cluster of
// about 10 GB (scale 700), running pgbench until the old cluster is
// stopped, upgraded side by side by
//
//   - by hand: stop (fast), initdb, pg_upgrade --clone -j J, start, a first
//     query (downtime), then vacuumdb --all --analyze-in-stages as
//     pg_upgrade says (--missing-stats-only on 18+);
//   - the same with --sync-method=syncfs (as pgfork syncs), and with
//     pg_upgrade --link;
//   - pgfork upgrade --stop-old -j J, its default: an online rehearsal while
//     pgbench runs, then the real run; downtime is pgfork's own (from the
//     stop to the new cluster started and checked), total includes the
//     rehearsal;
//   - pgfork upgrade --no-rehearse -j J after the bench stops the old
//     cluster (fast): downtime is the stop plus pgfork's.
//
// Each contender works on its own reflink copy of one fixture, started
// (untimed), with pgbench -c C [-R RATE] -P 1 against it for a warm-up
// before the contender starts. pgbench's progress gives tps before the
// contender and during pgfork's online rehearsal: the price of rehearsing
// while serving.
//
//	PGFORK_BENCH_UPGRADE_LOADED_SCALE   pgbench scale (700 ≈ 10.5 GB; default 0: skipped)
//	PGFORK_BENCH_UPGRADE_LOADED_CLIENTS pgbench -c (default 2)
//	PGFORK_BENCH_UPGRADE_LOADED_RUNS    runs of each contender, in turns (default 1)
//	PGFORK_BENCH_UPGRADE_LOADED_RATE    pgbench -R, transactions per second (default 100; 0: unthrottled)

// pgbenchLoad is pgbench running against an old cluster.
type pgbenchLoad struct {
	cmd    *exec.Cmd
	cancel context.CancelFunc
	out    lockedBuf
	start  time.Time
	done   chan error
	once   sync.Once
}

// lockedBuf is a buffer written by a command while the bench reads it.
type lockedBuf struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (w *lockedBuf) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.b.Write(p)
}

func (w *lockedBuf) String() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.b.String()
}

// startLoad starts pgbench against inst with progress every second.
func (b *upgBench) startLoad(ctx context.Context, inst *instance.Instance, clients, rate int) (*pgbenchLoad, error) {
	lctx, cancel := context.WithCancel(ctx)
	args := []string{"-n", "-c", strconv.Itoa(clients), "-j", strconv.Itoa(clients), "-T", "7200", "-P", "1", "--progress-timestamp",
		"-h", inst.SocketDir, "-p", strconv.Itoa(inst.Port), "-U", "postgres"}
	if rate > 0 {
		args = append(args, "-R", strconv.Itoa(rate))
	}
	l := &pgbenchLoad{cancel: cancel, done: make(chan error, 1), start: time.Now()}
	l.cmd = b.user.Command(lctx, b.old.Env(), b.old.Tool("pgbench"), append(args, "postgres")...)
	l.cmd.Stdout, l.cmd.Stderr = &l.out, &l.out
	if err := l.cmd.Start(); err != nil {
		cancel()
		return nil, err
	}
	go func() { l.done <- l.cmd.Wait() }()
	return l, nil
}

// wait waits for pgbench to end after its server stopped (it aborts its
// clients), killing it after a while.
func (l *pgbenchLoad) wait() {
	l.once.Do(func() {
		select {
		case <-l.done:
		case <-time.After(30 * time.Second):
			l.cancel()
			<-l.done
		}
		l.cancel()
	})
}

// window is pgbench's mean tps and latency over progress lines in [from, to).
func (l *pgbenchLoad) window(from, to time.Time) (tps, lat float64, n int) {
	sc := bufio.NewScanner(strings.NewReader(l.out.String()))
	for sc.Scan() {
		f := strings.Fields(strings.NewReplacer(",", " ").Replace(sc.Text()))
		if len(f) < 4 || f[0] != "progress:" {
			continue
		}
		ts, err := strconv.ParseFloat(f[1], 64)
		if err != nil {
			continue
		}
		at := time.Unix(0, int64(ts*1e9))
		if at.Before(from) || !at.Before(to) {
			continue
		}
		var t, la float64
		for i := 1; i+1 < len(f); i++ {
			if f[i+1] == "tps" {
				t, _ = strconv.ParseFloat(f[i], 64)
			}
			if f[i] == "lat" {
				la, _ = strconv.ParseFloat(f[i+1], 64)
			}
		}
		tps, lat, n = tps+t, lat+la, n+1
	}
	if n > 0 {
		tps, lat = tps/float64(n), lat/float64(n)
	}
	return tps, lat, n
}

func tpsCell(tps, lat float64, n int) string {
	if n == 0 {
		return "–"
	}
	return fmt.Sprintf("%.0f tps, %.1f ms (%d s)", tps, lat, n)
}

// loadedRun is one contender's result.
type loadedRun struct {
	name                string
	load                string
	down, downStats     time.Duration // stop → answers; + statistics
	total               time.Duration
	before, during      string // pgbench before the contender, during the rehearsal
	j                   *upgJSON
	hand                map[string]time.Duration // by hand: its steps as pgfork's phases
	rep                 *loadedRun               // in a row of medians: the run of median downtime
	duringTPS, beforeTP float64
}

// loaded runs the 10 GB case once per contender.
func (b *upgBench) loaded(ctx context.Context, r *Report, scale int) error {
	jobs := max(copyEnvInt("PGFORK_BENCH_UPGRADE_JOBS", 2), 1)
	clients := max(copyEnvInt("PGFORK_BENCH_UPGRADE_LOADED_CLIENTS", 2), 1)
	rate := copyEnvInt("PGFORK_BENCH_UPGRADE_LOADED_RATE", 100)
	nruns := max(copyEnvInt("PGFORK_BENCH_UPGRADE_LOADED_RUNS", 1), 1)
	const warm = 20 * time.Second

	// The fixture and its copies' changes must fit: about 15.5 MB a scale
	// unit, and half as much again for what the copies write.
	want := uint64(scale) * 15_500_000 * 3 / 2
	var st syscall.Statfs_t
	if err := syscall.Statfs(b.work, &st); err != nil {
		return err
	}
	if free := st.Bavail * uint64(st.Bsize); free < want {
		return fmt.Errorf("scale %d wants about %s free on %s, %s free: skipped", scale, units.Bytes(int64(want)), b.work, units.Bytes(int64(free)))
	}
	t0 := time.Now()
	src, err := b.buildSource(ctx, "src-loaded", func(inst *instance.Instance, sock string) error {
		return b.run(ctx, b.old, filepath.Dir(sock), "pgbench", "-i", "-q", "-I", "dtGvp", "-s", strconv.Itoa(scale), "-h", sock, "-p", strconv.Itoa(inst.Port), "-U", "postgres", "postgres")
	})
	if err != nil {
		return err
	}
	defer func() {
		_ = os.RemoveAll(filepath.Dir(src))
		// Give the shared loop image its blocks back.
		if out, err := exec.CommandContext(context.WithoutCancel(ctx), "fstrim", b.work).CombinedOutput(); err != nil {
			fmt.Printf("  fstrim %s: %v %s\n", b.work, err, out)
		}
	}()
	gen := time.Since(t0)
	size, _ := dirBytes(src)
	mode := "unthrottled"
	if rate > 0 {
		mode = fmt.Sprintf("-R %d (throttled)", rate)
	}
	r.Notef("Under load: pgbench scale %d, a source cluster of %s generated once in %s (pgbench -i -I dtGvp: server-side generation, vacuum, primary keys; not part of any time below). "+
		"Each contender gets a reflink copy, started untimed, with pgbench -n -c %d -j %d %s -P 1 against it for %s before the contender starts and until the old cluster stops; -j %d for pg_upgrade and pgfork; %d run(s) each, in turns (medians; the phases are of the run of median downtime).",
		scale, units.Bytes(size), Dur(gen), clients, clients, mode, warm, jobs, nruns)

	contender := func(name string, fn func(old string, inst *instance.Instance, l *pgbenchLoad, run *loadedRun) error) (*loadedRun, error) {
		old, err := b.copyOf(ctx, src, "c-loaded")
		if err != nil {
			return nil, err
		}
		dir := filepath.Dir(old)
		defer os.RemoveAll(dir)
		inst, err := instance.Start(ctx, instance.Config{BinDir: b.old.BinDir, Env: b.old.Env(), DataDir: old, User: b.user, LogFile: filepath.Join(dir, "old.log")})
		if err != nil {
			return nil, err
		}
		defer func() {
			if inst, err := instance.Attach(old); err == nil {
				_ = inst.Stop(context.WithoutCancel(ctx), instance.Fast)
			}
		}()
		l, err := b.startLoad(ctx, inst, clients, rate)
		if err != nil {
			return nil, err
		}
		defer l.wait()
		time.Sleep(warm)
		syscall.Sync()
		run := &loadedRun{name: name, load: loadavg()}
		tps, lat, n := l.window(l.start.Add(3*time.Second), time.Now())
		run.before, run.beforeTP = tpsCell(tps, lat, n), tps
		if err := fn(old, inst, l, run); err != nil {
			return nil, fmt.Errorf("%s: %w\npgbench: %s", name, err, lastLines(l.out.String(), 5))
		}
		fmt.Printf("  loaded %s: downtime %s, with statistics %s, total %s (load %s)\n", name, Dur(run.down), Dur(run.downStats), Dur(run.total), run.load)
		return run, nil
	}
	// by hand: stop, initdb, pg_upgrade --mode, start, first query; vacuumdb.
	hand := func(mode string, extra ...string) func(string, *instance.Instance, *pgbenchLoad, *loadedRun) error {
		return func(old string, inst *instance.Instance, l *pgbenchLoad, run *loadedRun) error {
			dir := filepath.Dir(old)
			t0 := time.Now()
			if err := inst.Stop(ctx, instance.Fast); err != nil {
				return err
			}
			ph := map[string]time.Duration{"stop-old": time.Since(t0)}
			t1 := time.Now()
			nd, err := b.initNew(ctx, dir)
			if err != nil {
				return err
			}
			ph["initdb"], t1 = time.Since(t1), time.Now()
			if err := b.run(ctx, b.new, dir, "pg_upgrade", append([]string{"-b", b.old.BinDir, "-B", b.new.BinDir, "-d", old, "-D", nd, "--" + mode, "-j", strconv.Itoa(jobs)}, extra...)...); err != nil {
				return err
			}
			ph["upgrade"], t1 = time.Since(t1), time.Now()
			ni, err := instance.Start(ctx, instance.Config{BinDir: b.new.BinDir, Env: b.new.Env(), DataDir: nd, User: b.user, LogFile: filepath.Join(dir, "new.log")})
			if err != nil {
				return err
			}
			defer func() { _ = ni.Stop(context.WithoutCancel(ctx), instance.Fast) }()
			conn, err := pgx.Connect(ctx, ni.ConnString("", "postgres"))
			if err != nil {
				return err
			}
			var n int64
			err = conn.QueryRow(ctx, "SELECT count(*) FROM pgbench_branches").Scan(&n)
			conn.Close(ctx)
			if err != nil {
				return err
			}
			run.down, ph["start"], t1 = time.Since(t0), time.Since(t1), time.Now()
			args := []string{"--all", "--analyze-in-stages", "-h", ni.SocketDir, "-p", strconv.Itoa(ni.Port), "-U", "postgres", "-j", strconv.Itoa(jobs)}
			if b.new.Major >= 18 {
				args = append(args, "--missing-stats-only")
			}
			if err := b.run(ctx, b.new, dir, "vacuumdb", args...); err != nil {
				return err
			}
			run.downStats, ph["statistics"] = time.Since(t0), time.Since(t1)
			run.hand = ph
			run.total = run.downStats
			return nil
		}
	}
	type entry struct {
		name string
		fn   func(string, *instance.Instance, *pgbenchLoad, *loadedRun) error
	}
	var list []entry
	add := func(name string, fn func(string, *instance.Instance, *pgbenchLoad, *loadedRun) error) error {
		list = append(list, entry{name, fn})
		return nil
	}
	if err := add("by hand: pg_upgrade --clone", hand("clone")); err != nil {
		return err
	}
	if err := add("by hand: pg_upgrade --clone --sync-method=syncfs (as pgfork syncs)", hand("clone", "--sync-method=syncfs")); err != nil {
		return err
	}
	if err := add("by hand: pg_upgrade --link", hand("link")); err != nil {
		return err
	}
	if err := add("pgfork upgrade --stop-old (default: online rehearsal)", func(old string, inst *instance.Instance, l *pgbenchLoad, run *loadedRun) error {
		inst.Release()
		t0 := time.Now()
		el, j, err := b.pgforkExec(ctx, old, jobs, "--stop-old")
		if err != nil {
			return err
		}
		if j.Rehearsal == nil || !j.Rehearsal.Online || j.Downtime <= 0 {
			return fmt.Errorf("pgfork --stop-old did not rehearse online, or reported no downtime")
		}
		from := t0.Add(j.phase("prepare"))
		tps, lat, n := l.window(from, from.Add(j.phase("rehearsal")))
		run.during, run.duringTPS = tpsCell(tps, lat, n), tps
		run.j, run.total, run.down, run.downStats = j, el, j.Downtime.D(), j.Downtime.D()+j.phase("statistics")
		return nil
	}); err != nil {
		return err
	}
	if err := add("pgfork upgrade --no-rehearse (old stopped first)", func(old string, inst *instance.Instance, l *pgbenchLoad, run *loadedRun) error {
		t0 := time.Now()
		if err := inst.Stop(ctx, instance.Fast); err != nil {
			return err
		}
		stop := time.Since(t0)
		_, j, err := b.pgforkExec(ctx, old, jobs, "--no-rehearse")
		if err != nil {
			return err
		}
		run.j, run.total, run.down, run.downStats = j, time.Since(t0), stop+j.Downtime.D(), stop+j.Downtime.D()+j.phase("statistics")
		return nil
	}); err != nil {
		return err
	}
	// In turns, so that no contender gets the quieter minutes.
	all := make([][]*loadedRun, len(list))
	for i := 0; i < nruns; i++ {
		for k, e := range list {
			run, err := contender(e.name, e.fn)
			if err != nil {
				return err
			}
			all[k] = append(all[k], run)
		}
	}
	// Each contender's row: the run of median downtime, with the medians
	// of the three times.
	var runs []*loadedRun
	for _, rs := range all {
		var down, ds, tot Sample
		for _, x := range rs {
			down, ds, tot = append(down, x.down), append(ds, x.downStats), append(tot, x.total)
		}
		med := *rs[0]
		med.rep = rs[0]
		var loads, downs []string
		for _, x := range rs {
			if x.down == down.Median() {
				med = *x
				med.rep = x
			}
			loads, downs = append(loads, x.load), append(downs, Dur(x.down))
		}
		med.down, med.downStats, med.total, med.load = down.Median(), ds.Median(), tot.Median(), strings.Join(loads, " \\| ")
		if len(rs) > 1 {
			med.name += " (downtimes: " + strings.Join(downs, ", ") + ")"
		}
		runs = append(runs, &med)
	}
	r.Notef("Load average (1, 5, 15 min) before each contender is in the table; at the end %s.", loadavg())
	pct := func(a, base time.Duration) string { return fmt.Sprintf("%+.1f%%", 100*(float64(a)/float64(base)-1)) }
	var rows [][]string
	for _, x := range runs {
		during := x.during
		if during == "" {
			during = "(no rehearsal)"
		}
		rows = append(rows, []string{x.name, x.load, x.before, during, Dur(x.down), pct(x.down, runs[0].down), Dur(x.downStats), pct(x.downStats, runs[0].downStats), Dur(x.total)})
	}
	r.Table([]string{"contender", "load before", "pgbench before (mean tps, latency, seconds)", "pgbench during the rehearsal", "downtime: stop → new cluster answers", "vs by hand --clone",
		"downtime to statistics (+ vacuumdb / statistics phase)", "vs by hand --clone", "total (pgfork default: with the rehearsal)"}, rows)
	hc, hs, hl, def, nr := runs[0], runs[1], runs[2], runs[3], runs[4]
	r.Target(float64(def.down) <= 1.10*float64(hc.down), "scale %d under load: pgfork default's downtime %s within 10%% of by hand --clone %s (%s)", scale, Dur(def.down), Dur(hc.down), pct(def.down, hc.down))
	r.Target(float64(def.downStats) <= 1.10*float64(hc.downStats), "scale %d under load: pgfork default's downtime to statistics %s within 10%% of by hand --clone + vacuumdb %s (%s)", scale, Dur(def.downStats), Dur(hc.downStats), pct(def.downStats, hc.downStats))
	r.Target(float64(nr.down) <= 1.05*float64(hc.down), "scale %d under load: pgfork --no-rehearse downtime %s within 5%% of by hand --clone %s (%s)", scale, Dur(nr.down), Dur(hc.down), pct(nr.down, hc.down))
	r.Target(float64(nr.downStats) <= 1.05*float64(hc.downStats), "scale %d under load: pgfork --no-rehearse downtime to statistics %s within 5%% of by hand --clone + vacuumdb %s (%s)", scale, Dur(nr.downStats), Dur(hc.downStats), pct(nr.downStats, hc.downStats))
	r.Target(float64(def.down) <= 1.10*float64(hs.down), "scale %d under load: pgfork default's downtime %s within 10%% of by hand --clone --sync-method=syncfs %s (%s)", scale, Dur(def.down), Dur(hs.down), pct(def.down, hs.down))
	r.Target(float64(nr.down) <= 1.05*float64(hs.down), "scale %d under load: pgfork --no-rehearse downtime %s within 5%% of by hand --clone --sync-method=syncfs %s (%s)", scale, Dur(nr.down), Dur(hs.down), pct(nr.down, hs.down))
	r.Notef("For reference, by hand --link: downtime %s, to statistics %s (pgfork picks clone on XFS, so --clone is the same-mode baseline).", Dur(hl.down), Dur(hl.downStats))
	if def.beforeTP > 0 {
		r.Notef("The price of rehearsing online: pgbench ran %s before pgfork started and %s during its rehearsal (%+.0f%% tps).", def.before, def.during, 100*(def.duringTPS/def.beforeTP-1))
	}
	// The phases are of each contender's run of median downtime, with its own times.
	hc, nr, def = hc.rep, nr.rep, def.rep
	r.Notef("pgfork's phases (the rehearsal runs while pgbench runs; the default's downtime starts at stop-old; --no-rehearse's adds the bench's stop of the old cluster, %s):", Dur(nr.down-nr.j.Downtime.D()))
	handPh := map[string]string{"total": Dur(hc.down) + " / " + Dur(hc.downStats)}
	for k, d := range hc.hand {
		handPh[k] = Dur(d)
	}
	handPh["start"] += " (start + first query)"
	handPh["statistics"] += " (vacuumdb)"
	r.Notef("By hand --clone's steps are in the phase they match: stop, initdb, pg_upgrade, start and a first query, vacuumdb.")
	b.phaseTable(r, handPh, []string{"pgfork --no-rehearse", "pgfork default (online)"}, []*upgJSON{nr.j, def.j}, []time.Duration{nr.total - (nr.down - nr.j.Downtime.D()), def.total})
	return nil
}
