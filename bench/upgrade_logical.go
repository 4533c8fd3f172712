package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgfork/pgfork/clone"
	"github.com/pgfork/pgfork/instance"
	"github.com/pgfork/pgfork/internal/units"
	"github.com/pgfork/pgfork/pgbin"
)

// The upgrade-logical scenario (issue 59): `pgfork upgrade --logical
// --stop-old` (pg_upgrade on an online reflink clone while the old cluster
// serves, logical replication for the difference, a write pause, the
// hand-over at the old cluster's address) against today's `pgfork upgrade
// --stop-old` (online rehearsal, then stop and the real run) and stop +
// initdb + pg_upgrade --clone --sync-method=syncfs + start by hand, on the
// same data, from PostgreSQL 15 and 17 to the newest installed major, on
// XFS.
//
// Every contender gets its own reflink copy of one source cluster per case
// and old major. During the logical run a writer commits a row every few
// milliseconds against the application's address (the old cluster's socket
// and port; after the hand-over the new cluster is there), reconnecting
// after errors: the longest gap between two acknowledged writes is the
// application's pause, and every acknowledged row must be on the new
// cluster afterwards. In the one-database case pgbench (unthrottled) runs
// against the old cluster too: its tps before the run and during it, up to
// the window, is the price of upgrading while serving.
//
// Cases: one database (pgbench scale 10) and 200 databases, each against
// both baselines; 200 databases every one of which is written during the
// run, --logical alone (the application's writer writes one database: the
// WAL scan subscribes only the databases written after R, so the case
// before is --logical's best one and this its worst); 1,000 databases,
// --logical alone (the baselines take minutes there: see the upgrade
// scenario). The window is pgfork's own
// measure (writes refused → the new cluster accepts at the address).
//
//	PGFORK_BENCH_UPGRADE_LOGICAL_FROM   old majors (default 15,17)
//	PGFORK_BENCH_UPGRADE_LOGICAL_SCALE  pgbench scale of the one-database case (default 10; 0 skips it)
//	PGFORK_BENCH_UPGRADE_LOGICAL_DBS    databases of the case with baselines (default 200; 0 skips it)
//	PGFORK_BENCH_UPGRADE_LOGICAL_SPREAD databases of the --logical-only case where a second writer
//	                                    commits into every database, one after another, all run long
//	                                    (default 200; 0 skips it): the WAL scan then subscribes them all
//	PGFORK_BENCH_UPGRADE_LOGICAL_MANY   databases of the --logical-only case (default 1000; 0 skips it)
//	                                    (a guard interrupts it below 2 GiB of available memory or past
//	                                    30 minutes, and the section names what stopped it)
//	PGFORK_BENCH_UPGRADE_LOGICAL_RUNS   runs of each contender, in turns (default 3; the many case runs once)
//	PGFORK_BENCH_UPGRADE_LOGICAL_EVERY  the writer's pause between commits, ms (default 5)
//	PGFORK_BENCH_UPGRADE_LOGICAL_BASELINES  0 skips the baselines (--stop-old, by hand) of the
//	                                    1- and 200-database cases: a trial of --logical alone (default 1)
//	PGFORK_BENCH_UPGRADE_JOBS           -j for pg_upgrade and pgfork (default 2)
//
// Anything but the defaults is a scaled-down trial, and the section says so.
func init() {
	register(Scenario{Name: "upgrade-logical", Issue: "pgfork upgrade --logical: a write pause of about a second (issue 59)", Run: runUpgradeLogicalBench})
}

// lgJSON is the part of `pgfork upgrade --logical --json` the bench reads.
type lgJSON struct {
	R          string `json:"r"`
	Window     ms     `json:"window_ms"`
	Elapsed    ms     `json:"elapsed_ms"`
	HandedOver bool   `json:"handed_over"`
	Sequences  int    `json:"sequences"`
	// WALScan: the old cluster's WAL since R was scanned, and only the
	// databases it names as written were subscribed.
	WALScan            bool     `json:"wal_scan"`
	Subscribed         []string `json:"subscribed"`
	SubscribedInWindow []string `json:"subscribed_in_window"`
	WindowSteps        []struct {
		Name    string `json:"name"`
		Elapsed ms     `json:"elapsed_ms"`
	} `json:"window_steps"`
	Phases []struct {
		Name    string `json:"name"`
		Elapsed ms     `json:"elapsed_ms"`
	} `json:"phases"`
}

// beforeWindow is the time of the phases before the window.
func (j *lgJSON) beforeWindow() time.Duration {
	var d time.Duration
	for _, p := range j.Phases {
		if p.Name == "window" {
			break
		}
		d += p.Elapsed.D()
	}
	return d
}

// appWriter commits a row every few milliseconds to app_writes at one
// address, reconnecting after errors, and records what was acknowledged.
type appWriter struct {
	mu    sync.Mutex
	acked []int64
	at    []time.Time
	fails int
	stop  chan struct{}
	done  chan struct{}
}

func startAppWriter(connString string, every time.Duration) *appWriter {
	w := &appWriter{stop: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer close(w.done)
		var conn *pgx.Conn
		defer func() {
			if conn != nil {
				_ = conn.Close(context.Background())
			}
		}()
		for id := int64(1); ; id++ {
			select {
			case <-w.stop:
				return
			default:
			}
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
			var err error
			if conn == nil || conn.IsClosed() {
				conn, err = pgx.Connect(ctx, connString)
				if err != nil {
					conn = nil
				}
			}
			if err == nil {
				_, err = conn.Exec(ctx, "INSERT INTO app_writes (id) VALUES ($1)", id)
			}
			cancel()
			w.mu.Lock()
			if err == nil {
				w.acked, w.at = append(w.acked, id), append(w.at, time.Now())
			} else {
				w.fails++
			}
			w.mu.Unlock()
			if err != nil {
				time.Sleep(time.Millisecond)
				continue
			}
			time.Sleep(every)
		}
	}()
	return w
}

// ackedAfter waits until a write was acknowledged after t (or d passes).
func (w *appWriter) ackedAfter(t time.Time, d time.Duration) bool {
	end := time.Now().Add(d)
	for time.Now().Before(end) {
		w.mu.Lock()
		ok := len(w.at) > 0 && w.at[len(w.at)-1].After(t)
		w.mu.Unlock()
		if ok {
			return true
		}
		time.Sleep(5 * time.Millisecond)
	}
	return false
}

func (w *appWriter) halt() {
	close(w.stop)
	<-w.done
}

// spreadWriter commits a row into items of every database in turn
// (db0001 …; postgres has the application's writer), a connection each
// time, until halted: every database is written after R, so the WAL scan
// subscribes them all. Errors
// (the window, the hand-over) are skipped.
type spreadWriter struct {
	base  string
	dbs   []string
	mu    sync.Mutex
	acked map[string][]int64
	stop  chan struct{}
	done  chan struct{}
}

func startSpreadWriter(base string, n int) *spreadWriter {
	w := &spreadWriter{base: base, acked: map[string][]int64{}, stop: make(chan struct{}), done: make(chan struct{})}
	for i := 1; i < n; i++ {
		w.dbs = append(w.dbs, fmt.Sprintf("db%04d", i))
	}
	go func() {
		defer close(w.done)
		for i := 0; ; i++ {
			select {
			case <-w.stop:
				return
			default:
			}
			db := w.dbs[i%len(w.dbs)]
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
			conn, err := pgx.Connect(ctx, w.base+" dbname="+db)
			if err == nil {
				var id int64
				if err = conn.QueryRow(ctx, "INSERT INTO items (v) VALUES ('spread') RETURNING id").Scan(&id); err == nil {
					w.mu.Lock()
					w.acked[db] = append(w.acked[db], id)
					w.mu.Unlock()
				}
				_ = conn.Close(ctx)
			}
			cancel()
			if err != nil {
				time.Sleep(5 * time.Millisecond)
			}
		}
	}()
	return w
}

func (w *spreadWriter) halt() {
	select {
	case <-w.stop:
	default:
		close(w.stop)
	}
	<-w.done
}

// missing counts the acknowledged rows not found at the address now (the
// new cluster after the hand-over), and the rows acknowledged.
func (w *spreadWriter) missing(ctx context.Context) (missing, acked int, err error) {
	for db, ids := range w.acked {
		conn, err := pgx.Connect(ctx, w.base+" dbname="+db)
		if err != nil {
			return 0, 0, err
		}
		var have int
		err = conn.QueryRow(ctx, "SELECT count(*) FROM items WHERE id = ANY($1) AND v = 'spread'", ids).Scan(&have)
		_ = conn.Close(ctx)
		if err != nil {
			return 0, 0, fmt.Errorf("database %s: %w", db, err)
		}
		missing, acked = missing+len(ids)-have, acked+len(ids)
	}
	return missing, acked, nil
}

// longestGap is the longest time between two acknowledged writes from
// `from` on (the first counted gap starts at the last ack before it).
func (w *appWriter) longestGap(from time.Time) time.Duration {
	w.mu.Lock()
	defer w.mu.Unlock()
	var g time.Duration
	for i := 1; i < len(w.at); i++ {
		if w.at[i].Before(from) {
			continue
		}
		g = max(g, w.at[i].Sub(w.at[i-1]))
	}
	return g
}

// lgRun is one run of --logical.
type lgRun struct {
	window, gap, total     time.Duration
	acked, missing, fails  int
	tpsBefore, tpsDuring   float64
	nBefore, nDuring       int
	j                      *lgJSON
	load                   string
	newMajorOK, handedOver bool
	// seen: what the machine guard saw (the many case only).
	seen string
	// spreadAcked: the rows the spread writer got acknowledged (in every
	// database; counted in missing when one is not on the new cluster).
	spreadAcked int
}

// lgCase is one case's results for one old major.
type lgCase struct {
	from                 pgbin.Installation
	runs                 []*lgRun
	stopOld, hand        Sample
	logicalW, gaps, tots Sample
}

type lgBench struct {
	*upgBench
	jobs    int
	every   time.Duration
	clients int
}

// lgSettings are what --logical needs of an old cluster of n databases:
// logical WAL, a slot and a WAL sender per database and one for the clone,
// and a connection per database for pgfork beside the application's.
func lgSettings(n int) map[string]string {
	return map[string]string{
		"wal_level":             "logical",
		"max_wal_senders":       strconv.Itoa(n + 10),
		"max_replication_slots": strconv.Itoa(n + 10),
		"max_connections":       strconv.Itoa(max(100, n+60)),
	}
}

func runUpgradeLogicalBench(ctx context.Context, r *Report) error {
	var froms []int
	for _, s := range strings.Split(envOr("PGFORK_BENCH_UPGRADE_LOGICAL_FROM", "15,17"), ",") {
		if n, err := strconv.Atoi(strings.TrimSpace(s)); err == nil && n > 0 {
			froms = append(froms, n)
		}
	}
	scale := copyEnvInt("PGFORK_BENCH_UPGRADE_LOGICAL_SCALE", 10)
	ndbs := copyEnvInt("PGFORK_BENCH_UPGRADE_LOGICAL_DBS", 200)
	many := copyEnvInt("PGFORK_BENCH_UPGRADE_LOGICAL_MANY", 1000)
	spread := copyEnvInt("PGFORK_BENCH_UPGRADE_LOGICAL_SPREAD", 200)
	runs := max(copyEnvInt("PGFORK_BENCH_UPGRADE_LOGICAL_RUNS", 3), 1)
	every := time.Duration(max(copyEnvInt("PGFORK_BENCH_UPGRADE_LOGICAL_EVERY", 5), 1)) * time.Millisecond
	baselines := copyEnvInt("PGFORK_BENCH_UPGRADE_LOGICAL_BASELINES", 1) != 0
	base := envOr("PGFORK_BENCH_UPGRADE_DIR", envOr("PGFORK_TEST_XFS", "/mnt/pgfork-test/xfs"))
	scaled := !slices.Equal(froms, []int{15, 17}) || scale != 10 || ndbs != 200 || many != 1000 || spread != 200 || runs != 3 || every != 5*time.Millisecond || !baselines

	b := &lgBench{upgBench: &upgBench{}, jobs: max(copyEnvInt("PGFORK_BENCH_UPGRADE_JOBS", 2), 1), every: every, clients: 1}
	all, _ := pgbin.Discover(pgbin.Options{StateDir: envOr("PGFORK_TEST_HOME", "/var/tmp/pgfork-test/home")})
	for _, in := range all {
		if in.Major > b.new.Major {
			b.new = in
		}
	}
	if n, err := findPG(18); err == nil && n.Major >= b.new.Major {
		b.new = n
	}
	if b.new.BinDir == "" {
		return fmt.Errorf("no new PostgreSQL found: run `pgfork pg install 18`")
	}
	var olds []pgbin.Installation
	for _, m := range froms {
		in, err := findPG(m)
		if err != nil {
			return fmt.Errorf("PostgreSQL %d: %w", m, err)
		}
		olds = append(olds, in)
	}
	var err error
	if b.user, err = instance.ResolveUser(""); err != nil {
		return err
	}
	if fs, _ := clone.FSType(base); fs != "xfs" {
		return fmt.Errorf("%s is %q, not XFS: --logical needs reflink clones (set PGFORK_TEST_XFS)", base, fs)
	}
	if b.work, err = os.MkdirTemp(base, "pgfork-bench-upgrade-logical-"); err != nil {
		return err
	}
	defer func() {
		_ = os.RemoveAll(b.work)
		_, _ = exec.CommandContext(context.WithoutCancel(ctx), "fstrim", base).CombinedOutput()
	}()
	_ = os.Chmod(b.work, 0o755)
	b.bin = filepath.Join(b.work, "pgfork")
	if out, err := goBuild(ctx, b.bin); err != nil {
		return fmt.Errorf("building pgfork: %v\n%s", err, out)
	}
	if scaled {
		r.Notef("**SCALED-DOWN TRIAL** (PGFORK_BENCH_UPGRADE_LOGICAL_*: from %v, scale %d, %d, %d (all written) and %d databases, %d run(s), a write every %s, baselines %v): not the report's numbers.",
			froms, scale, ndbs, spread, many, runs, every, baselines)
	}
	var names []string
	for _, o := range olds {
		names = append(names, o.Version)
	}
	r.Notef("PostgreSQL %s → %s on %s (XFS with reflink, a loop image). Each contender gets a reflink copy of one source cluster per case and old major, started untimed with the same settings "+
		"(for --logical: wal_level = logical, a slot and a WAL sender per database plus ten, max_connections databases + 60, a restart the user plans before). Contenders, in turns, %d run(s) each (medians): "+
		"`pgfork upgrade --logical --stop-old --window 60s` (the window: writes refused on the old cluster → the new cluster accepts at the old one's address, pgfork's own measure); "+
		"`pgfork upgrade --stop-old` (today's default: an online rehearsal, then stop and the real run; downtime is its own measure); "+
		"by hand: stop (fast) + initdb + pg_upgrade --clone -j %d --sync-method=syncfs + start (downtime: the stop's start → the new cluster accepts). "+
		"During --logical a writer commits a row every %s against the old cluster's socket and port (after the hand-over the new cluster is there), reconnecting after errors. "+
		"Load average at the start: %s.", strings.Join(names, ", "), b.new.Version, base, runs, b.jobs, every, loadavg())

	if scale > 0 {
		var cs []*lgCase
		for _, o := range olds {
			c, err := b.runCase(ctx, o, 1, scale, runs, baselines, false)
			if err != nil {
				return fmt.Errorf("one database from %s: %w", o.Version, err)
			}
			cs = append(cs, c)
		}
		b.report(r, fmt.Sprintf("1 database (pgbench scale %d)", scale), 1, cs, 2*time.Second, baselines)
	}
	if ndbs > 0 {
		var cs []*lgCase
		for _, o := range olds {
			c, err := b.runCase(ctx, o, ndbs, 0, runs, baselines, false)
			if err != nil {
				return fmt.Errorf("%d databases from %s: %w", ndbs, o.Version, err)
			}
			cs = append(cs, c)
		}
		b.report(r, fmt.Sprintf("%d databases (the application writes one)", ndbs), ndbs, cs, 2*time.Second, baselines)
	}
	if spread > 0 {
		var cs []*lgCase
		for _, o := range olds {
			c, err := b.runCase(ctx, o, spread, 0, runs, false, true)
			if err != nil {
				return fmt.Errorf("%d databases, all written, from %s: %w", spread, o.Version, err)
			}
			cs = append(cs, c)
		}
		b.report(r, fmt.Sprintf("%d databases, every one written during the run (--logical only)", spread), spread, cs, 2*time.Second, false)
	}
	if many > 0 {
		var cs []*lgCase
		for _, o := range olds {
			c, err := b.runCase(ctx, o, many, 0, 1, false, false)
			if err != nil {
				r.Notef("%d databases from PostgreSQL %s: **stopped**: %v", many, o.Version, err)
				continue
			}
			cs = append(cs, c)
		}
		if len(cs) > 0 {
			b.report(r, fmt.Sprintf("%d databases (--logical only)", many), many, cs, 5*time.Second, false)
			for _, c := range cs {
				for _, x := range c.runs {
					r.Notef("%d databases from PostgreSQL %s, what the machine had during the run: %s.", many, c.from.Version, x.seen)
				}
			}
		}
	}
	r.Notef("Load average at the end: %s.", loadavg())
	return nil
}

// report adds one case's table and targets.
func (b *lgBench) report(r *Report, title string, n int, cs []*lgCase, target time.Duration, baselines bool) {
	var rows [][]string
	for _, c := range cs {
		acked, missing, fails := 0, 0, 0
		var gapMax time.Duration
		newOK := true
		var tb, td float64
		var nb, nd int
		for _, x := range c.runs {
			acked, missing, fails = acked+x.acked+x.spreadAcked, missing+x.missing, fails+x.fails
			gapMax = max(gapMax, x.gap)
			newOK = newOK && x.newMajorOK && x.handedOver
			tb, td, nb, nd = tb+x.tpsBefore, td+x.tpsDuring, nb+x.nBefore, nd+x.nDuring
		}
		row := []string{c.from.Version + " → " + b.new.Version, c.logicalW.Cell(0.5), c.gaps.Cell(0.5) + " (max " + Dur(gapMax) + ")",
			fmt.Sprintf("%d acked, %d missing on the new cluster%s", acked, missing, map[bool]string{true: "", false: "; NOT HANDED OVER"}[newOK])}
		if baselines {
			row = append(row, c.stopOld.Cell(0.5), Ratio(c.stopOld.Median(), c.logicalW.Median()), c.hand.Cell(0.5), Ratio(c.hand.Median(), c.logicalW.Median()))
		}
		row = append(row, c.tots.Cell(0.5))
		if nb > 0 {
			row = append(row, fmt.Sprintf("%.0f → %.0f (%+.0f%%)", tb/float64(len(c.runs)), td/float64(len(c.runs)), 100*(td/tb-1)))
		}
		rows = append(rows, row)
	}
	h := []string{title, "--logical window (writes refused → new accepts)", "writer's longest gap (median; max)", "acknowledged writes"}
	if baselines {
		h = append(h, "pgfork --stop-old downtime", "--logical vs it", "by hand: stop + pg_upgrade --clone + start", "--logical vs by hand")
	}
	h = append(h, "--logical whole run")
	if len(rows) > 0 && len(rows[0]) > len(h) {
		h = append(h, "pgbench tps before → during the run (to the window)")
	}
	r.Notef("### %s", title)
	r.Table(h, rows)
	// Where the window goes (the median run of the last old major).
	for _, c := range cs {
		med := c.logicalW.Median()
		for _, x := range c.runs {
			if x.window != med {
				continue
			}
			var st []string
			for _, s := range x.j.WindowSteps {
				st = append(st, fmt.Sprintf("%s %s", s.Name, Dur(s.Elapsed.D())))
			}
			var ph []string
			for _, p := range x.j.Phases {
				ph = append(ph, fmt.Sprintf("%s %s", p.Name, Dur(p.Elapsed.D())))
			}
			sub := fmt.Sprintf("all %d databases subscribed (no WAL scan)", len(x.j.Subscribed))
			if x.j.WALScan {
				sub = fmt.Sprintf("the WAL since R named %d of %d databases as written, only those subscribed (%d of them in the window)", len(x.j.Subscribed), n, len(x.j.SubscribedInWindow))
			}
			r.Notef("%s, from %s, median run (load %s): %s; window steps: %s. Phases: %s.", title, c.from.Version, x.load, sub, strings.Join(st, ", "), strings.Join(ph, ", "))
			break
		}
	}
	for _, c := range cs {
		missing := 0
		for _, x := range c.runs {
			missing += x.missing
		}
		r.Target(c.logicalW.Median() <= target && missing == 0, "%s from %s: --logical window %s ≤ %s including the hand-over, every acknowledged write on the new cluster (%d missing)",
			title, c.from.Version, Dur(c.logicalW.Median()), Dur(target), missing)
	}
}

// runCase builds the source cluster for one case and old major and runs
// the contenders in turns.
//
// With spread, a second writer commits into every database in turn during
// the --logical runs (spreadWriter), and each acknowledged row must be on
// the new cluster too.
func (b *lgBench) runCase(ctx context.Context, old pgbin.Installation, n, scale, runs int, baselines, spread bool) (*lgCase, error) {
	b.old = old
	c := &lgCase{from: old}
	t0 := time.Now()
	name := fmt.Sprintf("src-%d-%d", old.Major, n)
	src, err := b.buildSource(ctx, name, func(inst *instance.Instance, sock string) error {
		if scale > 0 {
			if err := b.run(ctx, b.old, filepath.Dir(sock), "pgbench", "-i", "-q", "-I", "dtGvp", "-s", strconv.Itoa(scale), "-h", sock, "-p", strconv.Itoa(inst.Port), "-U", "postgres", "postgres"); err != nil {
				return err
			}
		}
		conn, err := pgx.Connect(ctx, inst.ConnString("", "postgres"))
		if err != nil {
			return err
		}
		defer conn.Close(ctx)
		if scale > 0 {
			// pgbench_history has no primary key: --logical refuses it
			// until the user chooses, as its hint says (pgbench only
			// inserts into it).
			if _, err := conn.Exec(ctx, "ALTER TABLE pgbench_history REPLICA IDENTITY FULL"); err != nil {
				return err
			}
		}
		if _, err := conn.Exec(ctx, "CREATE TABLE app_writes (id bigint PRIMARY KEY, at timestamptz NOT NULL DEFAULT clock_timestamp())"); err != nil {
			return err
		}
		if n > 1 {
			// Every other database: a small table with a sequence, as an
			// application's would be (sequences are copied in the window).
			t1, err := pgx.Connect(ctx, inst.ConnString("", "template1"))
			if err != nil {
				return err
			}
			_, err = t1.Exec(ctx, "CREATE TABLE items (id bigserial PRIMARY KEY, v text); INSERT INTO items (v) SELECT 'x' || i FROM generate_series(1, 100) i")
			_ = t1.Close(ctx)
			if err != nil {
				return err
			}
		}
		for i := 1; i < n; i++ {
			if _, err := conn.Exec(ctx, fmt.Sprintf("CREATE DATABASE db%04d STRATEGY FILE_COPY", i)); err != nil {
				return err
			}
		}
		_, err = conn.Exec(ctx, "CHECKPOINT")
		return err
	})
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(filepath.Dir(src))
	size, _ := dirBytes(src)
	fmt.Printf("  source %s: %d database(s) on PostgreSQL %s, %s, built in %s\n", name, n, old.Version, units.Bytes(size), Dur(time.Since(t0)))
	cases := []Case{{Fn: func(int) error {
		x, err := b.logical(ctx, src, n, scale > 0, !baselines && !spread, spread)
		if err != nil {
			return err
		}
		c.runs = append(c.runs, x)
		c.logicalW, c.gaps, c.tots = append(c.logicalW, x.window), append(c.gaps, x.gap), append(c.tots, x.total)
		fmt.Printf("  %d db(s) from %s --logical: window %s, writer's gap %s, %d acked, %d missing, whole run %s (load %s) %s\n",
			n, old.Version, Dur(x.window), Dur(x.gap), x.acked, x.missing, Dur(x.total), x.load, x.seen)
		return nil
	}}}
	if baselines {
		cases = append(cases, Case{Fn: func(int) error {
			_, j, err := b.pgforkRun(ctx, src, true, b.jobs)
			if err != nil {
				return err
			}
			c.stopOld = append(c.stopOld, j.Downtime.D())
			fmt.Printf("  %d db(s) from %s pgfork --stop-old: downtime %s\n", n, old.Version, Dur(j.Downtime.D()))
			return nil
		}}, Case{Fn: func(int) error {
			d, err := b.handStop(ctx, src)
			if err != nil {
				return err
			}
			c.hand = append(c.hand, d)
			fmt.Printf("  %d db(s) from %s by hand: downtime %s\n", n, old.Version, Dur(d))
			return nil
		}})
	}
	if _, err := MeasureInterleaved(runs, cases...); err != nil {
		return nil, err
	}
	return c, nil
}

// handStop: a started copy of src, stopped (fast), initdb, pg_upgrade
// --clone --sync-method=syncfs, start: the downtime until it accepts.
func (b *lgBench) handStop(ctx context.Context, src string) (time.Duration, error) {
	old, err := b.copyOf(ctx, src, "c-hand")
	if err != nil {
		return 0, err
	}
	dir := filepath.Dir(old)
	defer os.RemoveAll(dir)
	inst, err := instance.Start(ctx, instance.Config{BinDir: b.old.BinDir, Env: b.old.Env(), DataDir: old, User: b.user, LogFile: filepath.Join(dir, "old.log")})
	if err != nil {
		return 0, err
	}
	syscall.Sync()
	t0 := time.Now()
	if err := inst.Stop(ctx, instance.Fast); err != nil {
		return 0, err
	}
	nd, err := b.initNew(ctx, dir)
	if err != nil {
		return 0, err
	}
	if err := b.run(ctx, b.new, dir, "pg_upgrade", "-b", b.old.BinDir, "-B", b.new.BinDir, "-d", old, "-D", nd, "--clone", "-j", strconv.Itoa(b.jobs), "--sync-method=syncfs"); err != nil {
		return 0, err
	}
	ni, err := instance.Start(ctx, instance.Config{BinDir: b.new.BinDir, Env: b.new.Env(), DataDir: nd, User: b.user, LogFile: filepath.Join(dir, "new.log")})
	if err != nil {
		return 0, err
	}
	d := time.Since(t0)
	return d, ni.Stop(ctx, instance.Fast)
}

// logical runs `pgfork upgrade --logical --stop-old` on a started copy of
// src with the writer (and pgbench) against its address.
//
// With guard (the many case), a machine guard watches the run: below
// 2 GiB of available memory, or past 30 minutes, pgfork is interrupted
// (SIGINT: it rolls back, the old cluster serves) and the error says where
// it stood and what the machine had left; -q is left out so that its
// progress says the phase.
func (b *lgBench) logical(ctx context.Context, src string, n int, withPgbench, guard, spread bool) (*lgRun, error) {
	old, err := b.copyOf(ctx, src, "c-logical")
	if err != nil {
		return nil, err
	}
	dir := filepath.Dir(old)
	newDir := filepath.Join(dir, "new")
	defer os.RemoveAll(dir)
	inst, err := instance.Start(ctx, instance.Config{BinDir: b.old.BinDir, Env: b.old.Env(), DataDir: old, User: b.user, Settings: lgSettings(n), LogFile: filepath.Join(dir, "old.log")})
	if err != nil {
		return nil, err
	}
	inst.Release()
	defer func() {
		for _, d := range []string{newDir, old} {
			if in, err := instance.Attach(d); err == nil {
				_ = in.Stop(context.WithoutCancel(ctx), instance.Fast)
			}
		}
	}()
	addr := fmt.Sprintf("host=%s port=%d user=postgres dbname=postgres connect_timeout=2", inst.SocketDir, inst.Port)
	w := startAppWriter(addr, b.every)
	stopped := false
	defer func() {
		if !stopped {
			w.halt()
		}
	}()
	var sw *spreadWriter
	if spread {
		sw = startSpreadWriter(fmt.Sprintf("host=%s port=%d user=postgres connect_timeout=2", inst.SocketDir, inst.Port), n)
		defer sw.halt()
	}
	var l *pgbenchLoad
	warm := 2 * time.Second
	if withPgbench {
		if l, err = b.startLoad(ctx, inst, b.clients, 0); err != nil {
			return nil, err
		}
		defer l.wait()
		warm = 12 * time.Second
	}
	time.Sleep(warm)
	syscall.Sync()
	x := &lgRun{load: loadavg()}
	args := []string{"upgrade", old, newDir, "--to", strconv.Itoa(b.new.Major), "--logical", "--stop-old", "--window", "60s", "-j", strconv.Itoa(b.jobs),
		"--old-bindir", b.old.BinDir, "--new-bindir", b.new.BinDir, "--json"}
	if !guard {
		args = append(args, "-q")
	}
	t0 := time.Now()
	cctx, cancel := context.WithCancel(ctx)
	defer cancel()
	cmd := exec.CommandContext(cctx, b.bin, args...)
	cmd.Cancel = func() error { return cmd.Process.Signal(os.Interrupt) }
	cmd.WaitDelay = 10 * time.Minute
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	var g *machineGuard
	if guard {
		g = startGuard(2<<30, 30*time.Minute, cancel)
	}
	err = cmd.Run()
	if g != nil {
		if why := g.end(); why != "" {
			return nil, fmt.Errorf("interrupted by the bench's guard: %s (%s); pgfork's last words:\n%s", why, g, lastLines(errb.String(), 12))
		}
		x.seen = g.String()
	}
	if err != nil {
		return nil, fmt.Errorf("pgfork %s: %v\n%s%s", strings.Join(args, " "), err, lastLines(out.String(), 30), lastLines(errb.String(), 30))
	}
	x.total = time.Since(t0)
	var j lgJSON
	if err := json.Unmarshal(out.Bytes(), &j); err != nil {
		return nil, fmt.Errorf("pgfork --json: %v\n%s", err, lastLines(out.String(), 20))
	}
	x.j, x.window, x.handedOver = &j, j.Window.D(), j.HandedOver
	if l != nil {
		x.tpsBefore, _, x.nBefore = l.window(t0.Add(-warm+2*time.Second), t0)
		x.tpsDuring, _, x.nDuring = l.window(t0, t0.Add(j.beforeWindow()))
	}
	end := time.Now()
	if !w.ackedAfter(end, 30*time.Second) {
		return nil, fmt.Errorf("the writer got no write acknowledged at the address within 30 s of the hand-over (%d failures)", w.fails)
	}
	w.halt()
	stopped = true
	if sw != nil {
		sw.halt()
		m, acked, err := sw.missing(ctx)
		if err != nil {
			return nil, fmt.Errorf("after the hand-over: %w", err)
		}
		x.missing += m
		x.spreadAcked = acked
	}
	x.gap, x.fails = w.longestGap(t0), w.fails
	w.mu.Lock()
	acked := append([]int64(nil), w.acked...)
	w.mu.Unlock()
	x.acked = len(acked)
	conn, err := pgx.Connect(ctx, addr)
	if err != nil {
		return nil, fmt.Errorf("after the hand-over: %w", err)
	}
	defer conn.Close(ctx)
	var have, ver int
	if err := conn.QueryRow(ctx, "SELECT (SELECT count(*) FROM app_writes WHERE id = ANY($1)), current_setting('server_version_num')::int", acked).Scan(&have, &ver); err != nil {
		return nil, err
	}
	x.missing, x.newMajorOK = x.missing+len(acked)-have, ver/10000 == b.new.Major
	return x, nil
}
