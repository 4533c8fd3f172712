package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"golang.org/x/sys/unix"

	"github.com/pgfork/pgfork/instance"
	"github.com/pgfork/pgfork/internal/flock"
	"github.com/pgfork/pgfork/pgbin"
)

func init() {
	register(Scenario{Name: "up", Issue: "fresh cluster to first query: pgfork up vs initdb + pg_ctl vs cp -RPp + pg_ctl (issue 3)", Run: runUpBench})
}

// upRuns is how many times each contender runs per filesystem.
const upRuns = 12

type upBenchEnv struct {
	pgfork string // built pgfork binary
	pg     pgbin.Installation
	user   *instance.OSUser
}

func runUpBench(ctx context.Context, r *Report) error {
	pg, user, err := benchPostgres("PGFORK_BENCH_UP_PG_BIN")
	if err != nil {
		return err
	}
	work, err := os.MkdirTemp("", "pgfork-bench-up-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(work)
	_ = os.Chmod(work, 0o755)
	e := &upBenchEnv{pgfork: filepath.Join(work, "pgfork"), pg: pg, user: user}
	if out, err := goBuild(ctx, e.pgfork); err != nil {
		return fmt.Errorf("go build: %v\n%s", err, out)
	}
	r.Notef("PostgreSQL %s (%s). Each time runs from starting the command(s) to the first successful `select 1` "+
		"over the Unix socket, median of %d runs; clusters are stopped and removed between runs (untimed). "+
		"initdb runs with --no-sync and pg_ctl's server with fsync=off, as PostgreSQL's own test suite does; "+
		"`pgfork up` starts postgres directly with its test profile on a spare copy of the cached template made in the "+
		"background by the previous up (the steady state of a test suite; the refill finishes untimed between runs), "+
		"or, with --spares 0, on a copy it makes itself (sync none).",
		pg.Version, pg.BinDir, upRuns)

	if b, err := os.ReadFile("/proc/loadavg"); err == nil {
		r.Notef("Load average at start: %s (times grow with contention for the 2 cores and the disk).", strings.Join(strings.Fields(string(b))[:3], " "))
	}
	fss := [][2]string{{"ext4", work}}
	if x := os.Getenv("PGFORK_TEST_XFS"); x != "" {
		d, err := os.MkdirTemp(x, "pgfork-bench-up-")
		if err != nil {
			return err
		}
		defer os.RemoveAll(d)
		_ = os.Chmod(d, 0o755)
		fss = append(fss, [2]string{"xfs (reflink)", d})
	} else {
		r.Notef("PGFORK_TEST_XFS is not set: XFS not measured.")
	}
	for _, fs := range fss {
		if err := e.measure(ctx, r, fs[0], fs[1]); err != nil {
			return fmt.Errorf("%s: %w", fs[0], err)
		}
	}
	return nil
}

func (e *upBenchEnv) measure(ctx context.Context, r *Report, fsName, dir string) error {
	home := filepath.Join(dir, "home")
	pgf := func(args ...string) (string, error) {
		cmd := exec.CommandContext(ctx, e.pgfork, append([]string{"--state-dir", home, "--pg-bin", e.pg.BinDir, "-q"}, args...)...)
		var out, stderr bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &stderr
		if err := cmd.Run(); err != nil {
			return "", fmt.Errorf("pgfork %s: %v: %s", strings.Join(args, " "), err, stderr.String())
		}
		return strings.TrimSpace(out.String()), nil
	}
	// Warm up: build the template and the cached lookups.
	if _, err := pgf("up", "--name", "warm"); err != nil {
		return err
	}
	if _, err := pgf("down", "--all"); err != nil {
		return err
	}
	// The steady state a test suite sees: consecutive ups, each claiming
	// the spare the previous one's background refill made. Between runs
	// (untimed) the clusters are removed and the refill allowed to finish.
	downAndRefilled := func(int) error {
		if _, err := pgf("down", "--all"); err != nil {
			return err
		}
		return waitSpare(ctx, home)
	}
	// timedUp runs one `pgfork up --json`, then the first query; it
	// reports whether the up claimed a spare.
	timedUp := func(name string) (bool, error) {
		out, err := pgf("up", "--json", "--name", name)
		if err != nil {
			return false, err
		}
		var res struct {
			URL       string `json:"url"`
			FromSpare bool   `json:"from_spare"`
		}
		if err := json.Unmarshal([]byte(out), &res); err != nil {
			return false, err
		}
		return res.FromSpare, firstQuery(ctx, res.URL)
	}
	spared := 0
	up, err := Measure(upRuns, downAndRefilled, func(i int) error {
		claimed, err := timedUp(fmt.Sprintf("b%d", i))
		if claimed {
			spared++
		}
		return err
	})
	if err != nil {
		return err
	}
	// A miss against no spares, measured interleaved (round by round, so
	// a slow phase of the disk falls on all three alike), each after the
	// same settling: every cluster removed, no refill running, sync(2).
	//   - miss: an up right after another, while the refill the first
	//     one started is copying. The miss pauses the refill, so it must
	//     cost no more than --spares 0.
	//   - --spares 0 alone: an up that copies the template, on a quiet disk.
	//   - --spares 0 right after another --spares 0: the same back-to-back
	//     shape as the miss, without spares.
	settled := func(i int) error {
		if err := downAndRefilled(i); err != nil {
			return err
		}
		unix.Sync()
		return nil
	}
	noSpares := func(name string) error {
		url, err := pgf("up", "--spares", "0", "--name", name)
		if err != nil {
			return err
		}
		return firstQuery(ctx, url)
	}
	missed := 0
	samples, err := MeasureInterleaved(upRuns,
		Case{Setup: func(i int) error {
			if err := settled(i); err != nil {
				return err
			}
			_, err := pgf("up", "--name", fmt.Sprintf("m%d", i))
			return err
		}, Fn: func(i int) error {
			claimed, err := timedUp(fmt.Sprintf("n%d", i))
			if !claimed {
				missed++
			}
			return err
		}},
		Case{Setup: settled, Fn: func(i int) error { return noSpares(fmt.Sprintf("c%d", i)) }},
		Case{Setup: func(i int) error {
			if err := settled(i); err != nil {
				return err
			}
			_, err := pgf("up", "--spares", "0", "--name", fmt.Sprintf("d%d", i))
			return err
		}, Fn: func(i int) error { return noSpares(fmt.Sprintf("e%d", i)) }},
	)
	if err != nil {
		return err
	}
	upMiss, upCopy, upCopyB2B := samples[0], samples[1], samples[2]
	if _, err := pgf("down", "--all"); err != nil {
		return err
	}

	// Baselines run as the PostgreSQL OS user, on a private socket dir.
	sock, err := os.MkdirTemp("", "pgb-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(sock)
	if err := e.user.MkdirOwned(sock, 0o700); err != nil {
		return err
	}
	url := (&instance.Instance{SocketDir: sock, Port: 5432}).ConnString("postgres", "postgres")
	run := func(name string, args ...string) error {
		cmd := e.user.Command(ctx, e.pg.Env(), filepath.Join(e.pg.BinDir, name), args...)
		out, err := cmd.CombinedOutput()
		if err != nil {
			return fmt.Errorf("%s: %v: %s", name, err, out)
		}
		return nil
	}
	data := filepath.Join(dir, "data")
	if err := e.user.MkdirOwned(filepath.Join(dir, "base"), 0o755); err != nil {
		return err
	}
	startArgs := func(d string) []string {
		return []string{"-D", d, "-w", "-l", filepath.Join(dir, "base", "pg.log"), "-o",
			"-c listen_addresses='' -c unix_socket_directories=" + sock + " -c port=5432 -c fsync=off", "start"}
	}
	teardown := func(int) error {
		if _, err := os.Stat(filepath.Join(data, "postmaster.pid")); err == nil {
			if err := run("pg_ctl", "-D", data, "-m", "immediate", "-w", "stop"); err != nil {
				return err
			}
		}
		return os.RemoveAll(data)
	}
	initdb := func() []string {
		return []string{"-D", data, "-U", "postgres", "-E", "UTF8", "--locale=C", "--auth=trust", "--no-sync"}
	}
	if err := e.user.MkdirOwned(dir, 0o755); err != nil {
		return err
	}
	base, err := Measure(upRuns, teardown, func(int) error {
		if err := run("initdb", initdb()...); err != nil {
			return err
		}
		if err := run("pg_ctl", startArgs(data)...); err != nil {
			return err
		}
		return firstQuery(ctx, url)
	})
	if err != nil {
		return err
	}
	if err := teardown(0); err != nil {
		return err
	}
	// The cached initdb that cp -RPp copies (made once, untimed).
	if err := run("initdb", initdb()...); err != nil {
		return err
	}
	cached := filepath.Join(dir, "cached-initdb")
	if err := os.Rename(data, cached); err != nil {
		return err
	}
	cp, err := Measure(upRuns, teardown, func(int) error {
		if out, err := e.user.Command(ctx, nil, "cp", "-RPp", cached, data).CombinedOutput(); err != nil {
			return fmt.Errorf("cp: %v: %s", err, out)
		}
		if err := run("pg_ctl", startArgs(data)...); err != nil {
			return err
		}
		return firstQuery(ctx, url)
	})
	if err != nil {
		return err
	}
	if err := teardown(0); err != nil {
		return err
	}

	r.Notef("### %s", fsName)
	row := func(name string, s Sample) []string {
		return []string{name, Dur(s.Median()), Dur(s.Quantile(0.9)), Ratio(base.Median(), s.Median())}
	}
	r.Table([]string{"contender", "median", "p90", "vs initdb + pg_ctl"}, [][]string{
		row("initdb + pg_ctl start -w (baseline)", base),
		row("cp -RPp cached initdb + pg_ctl start -w", cp),
		row("pgfork up --spares 0 (copies the cached template)", upCopy),
		row("pgfork up (spare copy ready, the default)", up),
		row("pgfork up right after another (spare miss, refill in progress)", upMiss),
		row("pgfork up --spares 0 right after another --spares 0", upCopyB2B),
	})
	r.Notef("%s: the spare miss and both --spares 0 rows ran interleaved (one of each per round, the round's first rotating), each after the same settling: every cluster removed, no refill running, sync(2). The first rows ran as blocks.", fsName)
	r.Notef("%s: %d of %d timed back-to-back `pgfork up` runs missed the spare (the rest claimed one the refill finished in time).", fsName, missed, upRuns)
	r.Notef("%s: %d of %d timed `pgfork up` runs claimed a spare.", fsName, spared, upRuns)
	limit := 150 * time.Millisecond
	if strings.HasPrefix(fsName, "xfs") {
		limit = 100 * time.Millisecond
	}
	r.Target(up.Median() <= limit && spared == upRuns, "%s: pgfork up median %s, target at most %s", fsName, Dur(up.Median()), Dur(limit))
	r.Target(float64(upMiss.Median()) <= 1.15*float64(upCopy.Median()), "%s: a spare miss %s vs --spares 0 alone %s (interleaved), target no slower (15%% noise allowance)",
		fsName, Dur(upMiss.Median()), Dur(upCopy.Median()))
	r.Target(float64(upMiss.Median()) <= 1.15*float64(upCopyB2B.Median()), "%s: a spare miss %s vs --spares 0 right after another %s (interleaved), target no slower (15%% noise allowance)",
		fsName, Dur(upMiss.Median()), Dur(upCopyB2B.Median()))
	r.Target(float64(base.Median()) >= 8*float64(up.Median()), "%s: pgfork up %s faster than initdb + pg_ctl, target at least 8x",
		fsName, Ratio(base.Median(), up.Median()))
	return nil
}

// waitSpare waits until the state directory home holds a spare copy and
// no refiller runs, so the next timed up neither misses the spare nor
// competes with a copy in the background.
func waitSpare(ctx context.Context, home string) error {
	deadline := time.Now().Add(time.Minute)
	for {
		m, _ := filepath.Glob(filepath.Join(home, "clusters", ".spare-*"))
		if len(m) > 0 {
			break
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("no spare copy in %s after a minute", home)
		}
		time.Sleep(5 * time.Millisecond)
	}
	locks, _ := filepath.Glob(filepath.Join(home, "locks", "spare-*"))
	for _, lp := range locks {
		wctx, cancel := context.WithTimeout(ctx, time.Minute)
		l, err := flock.Exclusive(wctx, lp)
		cancel()
		if err != nil {
			return fmt.Errorf("spare refiller still running: %w", err)
		}
		l.Unlock()
	}
	return nil
}

// firstQuery connects and runs select 1, retrying briefly (a server that
// says it is ready should answer at once).
func firstQuery(ctx context.Context, url string) error {
	deadline := time.Now().Add(10 * time.Second)
	for {
		conn, err := pgx.Connect(ctx, url)
		if err == nil {
			_, err = conn.Exec(ctx, "select 1")
			conn.Close(ctx)
			if err == nil {
				return nil
			}
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("first query on %s: %w", url, err)
		}
		time.Sleep(time.Millisecond)
	}
}
