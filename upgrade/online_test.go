package upgrade_test

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgfork/pgfork/instance"
	"github.com/pgfork/pgfork/internal/errs"
	"github.com/pgfork/pgfork/internal/pgtest"
	"github.com/pgfork/pgfork/internal/testenv"
	"github.com/pgfork/pgfork/pgdata"
	"github.com/pgfork/pgfork/upgrade"
)

// startOld starts a copy of the fixture as the application's server, on a
// TCP port free now (a new cluster handed over takes that port), and opens
// the application's connection to it.
func startOld(t *testing.T, b builds, old string, settings map[string]string) (*instance.Instance, *pgx.Conn) {
	t.Helper()
	ctx := context.Background()
	port, err := instance.FreePort("127.0.0.1")
	if err != nil {
		t.Fatal(err)
	}
	inst, err := instance.Start(ctx, instance.Config{BinDir: b.old.BinDir, Env: b.old.Env, DataDir: old, User: pgtest.User(t),
		Port: port, LogFile: filepath.Join(t.TempDir(), "old.log"), Settings: settings})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if _, running, _ := pgdata.Running(old); running {
			_ = inst.Stop(context.Background(), instance.Fast)
		}
	})
	conn, err := pgx.Connect(ctx, inst.ConnString("", "shop"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close(context.Background()) })
	return inst, conn
}

// serves runs a write and a read on the application's connection.
func serves(ctx context.Context, conn *pgx.Conn) error {
	if _, err := conn.Exec(ctx, "INSERT INTO items(name) VALUES ('during the rehearsal')"); err != nil {
		return err
	}
	var n int
	return conn.QueryRow(ctx, "SELECT count(*) FROM items").Scan(&n)
}

// servedDuringRehearsal returns an OnEvent that uses the application's
// connection while the rehearsal runs pg_upgrade on the clone, and a
// function that reports whether it did so successfully.
func servedDuringRehearsal(t *testing.T, conn *pgx.Conn) (func(upgrade.Event), func() bool) {
	served := false
	return func(e upgrade.Event) {
			if e.Phase == upgrade.PhaseRehearsal && strings.HasPrefix(e.Step, "pg_upgrade --") && !e.Done && !served {
				if err := serves(context.Background(), conn); err != nil {
					t.Errorf("the old cluster did not serve during the rehearsal: %v", err)
					return
				}
				served = true
			}
		}, func() bool {
			return served
		}
}

// processesUnder returns the nice value of every process whose command
// line contains part (a path, say) and of the processes they started.
func processesUnder(t *testing.T, part string) map[int]int {
	t.Helper()
	out := map[int]int{}
	var add func(pid string)
	add = func(pid string) {
		stat, err := os.ReadFile(filepath.Join("/proc", pid, "stat"))
		if err != nil {
			return
		}
		f := strings.Fields(string(stat[strings.LastIndexByte(string(stat), ')')+2:]))
		n, err1 := strconv.Atoi(pid)
		nice, err2 := strconv.Atoi(f[16]) // stat's field 19
		if err1 != nil || err2 != nil {
			return
		}
		out[n] = nice
		kids, _ := os.ReadFile(filepath.Join("/proc", pid, "task", pid, "children"))
		for _, k := range strings.Fields(string(kids)) {
			add(k)
		}
	}
	ents, err := os.ReadDir("/proc")
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range ents {
		if cmdline, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline")); err == nil && strings.Contains(string(cmdline), part) {
			add(e.Name())
		}
	}
	return out
}

// ownNice is the test process's nice value.
func ownNice(t *testing.T) int {
	t.Helper()
	stat, err := os.ReadFile("/proc/self/stat")
	if err != nil {
		t.Fatal(err)
	}
	n, err := strconv.Atoi(strings.Fields(string(stat[strings.LastIndexByte(string(stat), ')')+2:]))[16])
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// TestOnlineRehearsal upgrades a running cluster: the rehearsal works on an
// online clone while the application's connection keeps working, the old
// cluster is stopped only afterwards, and unchanged catalogs need no
// second check.
func TestOnlineRehearsal(t *testing.T) {
	b := findBuilds(t)
	dir := testenv.XFSDir(t)
	old := copyFixture(t, b, dir)
	inst, conn := startOld(t, b, old, nil)
	onEvent, served := servedDuringRehearsal(t, conn)
	newDir := filepath.Join(dir, "new")

	// --rehearse-only on a running cluster: online, and it keeps running.
	// Its servers and pg_upgrade run at background priority, leaving the
	// machine to the old cluster that serves.
	lowered := map[string]bool{}
	look := func(when string) {
		procs := processesUnder(t, ".pgfork-rehearsal-")
		if len(procs) < 2 {
			t.Errorf("%s: processes of the online rehearsal: %v, want a program and what it started", when, procs)
		}
		for pid, nice := range procs {
			if nice != 19 {
				t.Errorf("%s: process %d of the online rehearsal runs at nice %d, want 19", when, pid, nice)
			}
		}
		lowered[when] = len(procs) > 0
	}
	defer upgrade.SetTestHook(func(step string) {
		if step == "settings server started" || step == "rehearsal server started" {
			look(step)
		}
	})()
	res, err := runUpgrade(t, upgrade.Options{OldDir: old, NewDir: newDir, Old: b.old, New: b.new, Rehearse: upgrade.RehearseOnly,
		OnEvent: func(e upgrade.Event) {
			onEvent(e)
			if e.Phase == upgrade.PhaseRehearsal && strings.HasPrefix(e.Step, "Restoring database schemas") && !e.Done {
				look("pg_upgrade")
			}
		}})
	if err != nil {
		t.Fatalf("rehearsal: %v (hint: %s)", err, errs.HintOf(err))
	}
	for _, when := range []string{"settings server started", "pg_upgrade", "rehearsal server started"} {
		if !lowered[when] {
			t.Errorf("no process of the rehearsal found at %q", when)
		}
	}
	if res.Rehearsal == nil || !res.Rehearsal.Online || !res.RehearsalOnly || !served() {
		t.Fatalf("online rehearsal: %+v, served %v", res.Rehearsal, served())
	}
	if pid, running, _ := pgdata.Running(old); !running || pid != inst.Pid {
		t.Fatalf("--rehearse-only stopped the old cluster (running %v, pid %d, was %d)", running, pid, inst.Pid)
	}
	if err := serves(context.Background(), conn); err != nil {
		t.Fatalf("the connection broke: %v", err)
	}
	if left, _ := filepath.Glob(filepath.Join(dir, ".*pgfork*")); len(left) > 0 {
		t.Fatalf("the rehearsal left %v", left)
	}

	// The real run: rehearsal online, then the stop, then the upgrade, at
	// the priority pgfork runs at: it is downtime.
	normal := ownNice(t)
	realChecked := false
	defer upgrade.SetTestHook(func(step string) {
		if step != "settings server started" || len(processesUnder(t, ".pgfork-rehearsal-")) > 0 {
			return
		}
		procs := processesUnder(t, "\x00"+old+"\x00")
		for pid, nice := range procs {
			if nice != normal {
				t.Errorf("process %d of the real run runs at nice %d, want %d", pid, nice, normal)
			}
		}
		realChecked = len(procs) > 0
	})()
	onEvent, served = servedDuringRehearsal(t, conn)
	var order []string
	res, err = runUpgrade(t, upgrade.Options{OldDir: old, NewDir: newDir, Old: b.old, New: b.new, StopOld: true, Jobs: 2,
		OnEvent: func(e upgrade.Event) {
			onEvent(e)
			if e.Step == "" && !e.Done && e.Message == "" {
				order = append(order, e.Phase)
			}
		}})
	if err != nil {
		t.Fatalf("upgrade: %v (hint: %s)", err, errs.HintOf(err))
	}
	if !served() || res.Rehearsal == nil || !res.Rehearsal.Online {
		t.Fatalf("the rehearsal was not online while the cluster served: %+v", res.Rehearsal)
	}
	if !realChecked {
		t.Error("the real run's settings server was not found")
	}
	want := []string{upgrade.PhasePrepare, upgrade.PhaseRehearsal, upgrade.PhaseStopOld, upgrade.PhaseSettings, upgrade.PhaseInitDB, upgrade.PhaseUpgrade}
	if !slices.Equal(order[:min(len(order), len(want))], want) {
		t.Errorf("phases %v, want %v first", order, want)
	}
	if len(res.CatalogChanges) > 0 || res.Rechecked {
		t.Errorf("catalog changes reported where there were none: %v", res.CatalogChanges)
	}
	if res.Downtime <= 0 || res.Downtime >= res.Elapsed-res.Rehearsal.Elapsed {
		t.Errorf("downtime %s, elapsed %s, rehearsal %s", res.Downtime, res.Elapsed, res.Rehearsal.Elapsed)
	}
	if _, running, _ := pgdata.Running(old); running {
		t.Fatal("the old cluster still runs after the upgrade")
	}
	// The new cluster has everything the old one had at the stop,
	// including the rows written during the rehearsals.
	compareSums(t, startAndSum(t, b.old, old), startAndSum(t, b.new, newDir))
}

// TestOnlineRehearsalCatalogChange changes the catalogs after the online
// rehearsal and before the stop (a new database, a new extension): the
// upgrade says so, runs pg_upgrade --check again, and upgrades them.
func TestOnlineRehearsalCatalogChange(t *testing.T) {
	b := findBuilds(t)
	dir := testenv.XFSDir(t)
	old := copyFixture(t, b, dir)
	inst, conn := startOld(t, b, old, nil)
	newDir := filepath.Join(dir, "new")
	ctx := context.Background()
	hooked := false
	defer upgrade.SetHookBeforeStop(func() {
		hooked = true
		for _, q := range []string{"CREATE EXTENSION pg_trgm", "CREATE TABLE late(id int)"} {
			if _, err := conn.Exec(ctx, q); err != nil {
				t.Errorf("%s: %v", q, err)
			}
		}
		c, err := pgx.Connect(ctx, inst.ConnString("", "postgres"))
		if err != nil {
			t.Error(err)
			return
		}
		defer c.Close(ctx)
		if _, err := c.Exec(ctx, "CREATE DATABASE late"); err != nil {
			t.Error(err)
		}
	})()
	var checked bool
	res, err := runUpgrade(t, upgrade.Options{OldDir: old, NewDir: newDir, Old: b.old, New: b.new, StopOld: true,
		OnEvent: func(e upgrade.Event) { checked = checked || (e.Phase == upgrade.PhaseCheck && e.Step != "") }})
	if err != nil {
		t.Fatalf("upgrade: %v (hint: %s)", err, errs.HintOf(err))
	}
	if !hooked {
		t.Fatal("the hook before the stop did not run")
	}
	all := strings.Join(res.CatalogChanges, "\n")
	for _, w := range []string{`database "late" was created`, `extensions of database "shop" changed`, "pg_trgm"} {
		if !strings.Contains(all, w) {
			t.Errorf("catalog changes %q do not say %q", all, w)
		}
	}
	if !res.Rechecked || !checked {
		t.Errorf("pg_upgrade --check did not run again (rechecked %v, check steps seen %v)", res.Rechecked, checked)
	}
	sums := startAndSum(t, b.new, newDir)
	if sums["shop/extensions"] != "hstore,pg_trgm,pgcrypto,plpgsql" {
		t.Errorf("extensions after the upgrade: %q", sums["shop/extensions"])
	}
	if _, ok := sums["late/extensions"]; !ok {
		t.Error("the database created before the stop is missing after the upgrade")
	}
}

// TestInterruptAfterRehearsalLeavesOldRunning interrupts the run while the
// online rehearsal deletes its clone (a step that does not watch the
// context): the old cluster keeps running and serving, and the error says
// so (it was once stopped with the cancelled context, fast escalated to
// immediate).
func TestInterruptAfterRehearsalLeavesOldRunning(t *testing.T) {
	t.Parallel() // see TestMain
	b := findBuilds(t)
	dir := testenv.XFSDir(t)
	old := copyFixture(t, b, dir)
	inst, conn := startOld(t, b, old, nil)
	newDir := filepath.Join(dir, "new")
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	cancelled := false
	_, err := upgrade.Run(ctx, upgrade.Options{OldDir: old, NewDir: newDir, Old: b.old, New: b.new, StopOld: true,
		User: pgtest.User(t), OnEvent: func(e upgrade.Event) {
			if e.Phase == upgrade.PhaseRehearsal && e.Step == "delete the clone" && !e.Done {
				cancel() // as SIGINT does
				cancelled = true
			}
		}})
	if !cancelled {
		t.Fatalf("the rehearsal never deleted its clone (%v)", err)
	}
	if errs.KindOf(err) != errs.Interrupted || !strings.Contains(errs.HintOf(err), "still runs") {
		t.Fatalf("interrupted after the rehearsal: %v (hint: %s)", err, errs.HintOf(err))
	}
	if pid, running, _ := pgdata.Running(old); !running || pid != inst.Pid {
		t.Fatalf("an interrupt before the stop stopped the old cluster (running %v, pid %d, was %d)", running, pid, inst.Pid)
	}
	if err := serves(context.Background(), conn); err != nil {
		t.Fatalf("the application's connection broke: %v", err)
	}
	if _, err := os.Stat(newDir); !os.IsNotExist(err) {
		t.Errorf("NEW_DATADIR exists after an interrupted run: %v", err)
	}
}

// TestOnlineRehearsalFailureLeavesOldRunning: a running cluster pg_upgrade
// refuses (a prepared transaction) fails the online rehearsal, and the old
// cluster keeps running, serving and unchanged.
func TestOnlineRehearsalFailureLeavesOldRunning(t *testing.T) {
	t.Parallel() // see TestMain
	b := findBuilds(t)
	dir := testenv.XFSDir(t)
	old := copyFixture(t, b, dir)
	inst, conn := startOld(t, b, old, map[string]string{"max_prepared_transactions": "5"})
	ctx := context.Background()
	for _, q := range []string{"BEGIN", "INSERT INTO items(name) VALUES ('pending')", "PREPARE TRANSACTION 'pending'"} {
		if _, err := conn.Exec(ctx, q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	before, err := contentSums(ctx, inst)
	if err != nil {
		t.Fatal(err)
	}
	newDir := filepath.Join(dir, "new")
	_, err = runUpgrade(t, upgrade.Options{OldDir: old, NewDir: newDir, Old: b.old, New: b.new, StopOld: true})
	if errs.KindOf(err) != errs.Unsupported || !strings.Contains(err.Error(), "prepared transactions") || !strings.Contains(err.Error(), "not touched") {
		t.Fatalf("upgrade of a cluster with a prepared transaction: %v (hint: %s)", err, errs.HintOf(err))
	}
	if pid, running, _ := pgdata.Running(old); !running || pid != inst.Pid {
		t.Fatalf("a failed rehearsal stopped the old cluster (running %v, pid %d, was %d)", running, pid, inst.Pid)
	}
	if err := serves(ctx, conn); err != nil {
		t.Fatalf("the application's connection broke: %v", err)
	}
	after, err := contentSums(ctx, inst)
	if err != nil {
		t.Fatal(err)
	}
	for _, k := range []string{"shop/public.items", "shop/public.items_id_seq"} { // the connection wrote to them
		before[k], after[k] = "", ""
	}
	compareSums(t, before, after)
	if _, err := os.Stat(filepath.Join(old, "backup_label")); err == nil {
		t.Error("a backup_label was left in the old cluster")
	}
	if _, err := os.Stat(newDir); !os.IsNotExist(err) {
		t.Errorf("NEW_DATADIR exists after a failed rehearsal: %v", err)
	}
	if left, _ := filepath.Glob(filepath.Join(dir, ".*pgfork*")); len(left) > 0 {
		t.Errorf("left %v", left)
	}
	logs, _ := filepath.Glob(newDir + ".pgfork-*")
	for _, l := range logs {
		_ = os.RemoveAll(l)
	}
}

// TestHandOverBeforeStatistics upgrades a running cluster to a major before
// 18 (no statistics after pg_upgrade) and to the newest (18 and later keep
// most): the new cluster is started with its own configuration on the old
// cluster's port and accepts connections while vacuumdb
// --analyze-in-stages runs, and is left running; --wait-analyze keeps the
// old behaviour (statistics first, the new cluster left stopped), checked
// on the newest only: it runs the same code on every major (only vacuumdb's
// arguments differ: statsArgs adds --missing-stats-only on 18 and later),
// so a second upgrade and rehearsal to 17 added about 20 s and no code
// path to what is tested.
func TestHandOverBeforeStatistics(t *testing.T) {
	t.Parallel() // see TestMain
	t.Run("before 18", func(t *testing.T) {
		t.Parallel()
		handOverBeforeStatistics(t, findBuildsBefore18(t), false)
	})
	t.Run("newest", func(t *testing.T) {
		t.Parallel()
		handOverBeforeStatistics(t, findBuilds(t), true)
	})
}

func handOverBeforeStatistics(t *testing.T, b builds, waitAnalyze bool) {
	dir := testenv.XFSDir(t)
	old := copyFixture(t, b, dir)
	ctx := context.Background()
	oldInst, _ := startOld(t, b, old, nil)
	port := oldInst.Port
	newDir := filepath.Join(dir, "new")
	t.Cleanup(func() {
		if inst, err := instance.Attach(newDir); err == nil {
			_ = inst.Stop(context.Background(), instance.Fast)
		}
	})
	var connected bool
	res, err := runServing(t, upgrade.Options{OldDir: old, NewDir: newDir, Old: b.old, New: b.new, StopOld: true,
		OnEvent: func(e upgrade.Event) {
			if e.Phase != upgrade.PhaseStatistics || e.Done || e.Message != "" || connected {
				return
			}
			// vacuumdb is about to run: the application connects.
			inst, err := instance.Attach(newDir)
			if err != nil {
				t.Errorf("no server runs on the new cluster when statistics start: %v", err)
				return
			}
			defer inst.Release()
			if inst.Port != port {
				t.Errorf("the new cluster listens on port %d, the old one on %d", inst.Port, port)
			}
			inst.Host = "" // the local socket: TCP needs a password
			conn, err := pgx.Connect(ctx, inst.ConnString("postgres", "shop"))
			if err != nil {
				t.Errorf("the application cannot connect before statistics are rebuilt: %v", err)
				return
			}
			defer conn.Close(ctx)
			var n int
			if err := conn.QueryRow(ctx, "SELECT count(*) FROM items").Scan(&n); err != nil || n == 0 {
				t.Errorf("query on the handed-over cluster: %d rows, %v", n, err)
			}
			connected = true
		}})
	if err != nil {
		t.Fatalf("upgrade: %v (hint: %s)", err, errs.HintOf(err))
	}
	if !connected || !res.Running {
		t.Fatalf("not handed over before statistics: connected %v, running %v", connected, res.Running)
	}
	if res.AcceptsAfter <= 0 || res.StatisticsAfter <= res.AcceptsAfter || res.Downtime <= 0 {
		t.Errorf("accepts after %s, statistics after %s, downtime %s", res.AcceptsAfter, res.StatisticsAfter, res.Downtime)
	}
	if !strings.Contains(res.Statistics, "--analyze-in-stages") {
		t.Errorf("statistics: %q", res.Statistics)
	}
	inst, err := instance.Attach(newDir)
	if err != nil {
		t.Fatalf("the new cluster is not left running: %v", err)
	}
	inst.Host = ""
	conn, err := pgx.Connect(ctx, inst.ConnString("postgres", "shop"))
	if err != nil {
		t.Fatal(err)
	}
	var stats int
	err = conn.QueryRow(ctx, "SELECT count(*) FROM pg_stats WHERE tablename = 'items'").Scan(&stats)
	conn.Close(ctx)
	if err != nil || stats == 0 {
		t.Errorf("no statistics after the run: %d, %v", stats, err)
	}
	if err := inst.Stop(ctx, instance.Fast); err != nil {
		t.Fatal(err)
	}
	if !waitAnalyze {
		return
	}

	// --wait-analyze: statistics first, the new cluster stopped. The first
	// upgrade's cluster and tablespace directories go first.
	if err := os.RemoveAll(newDir); err != nil {
		t.Fatal(err)
	}
	for _, r := range tablespaceRoots(t, old)[1:] {
		ds, _ := filepath.Glob(filepath.Join(r, "PG_"+strconv.Itoa(b.new.Major)+"_*"))
		for _, d := range ds {
			if err := os.RemoveAll(d); err != nil {
				t.Fatal(err)
			}
		}
	}
	connected = true // the hook above must not run
	res, err = runUpgrade(t, upgrade.Options{OldDir: old, NewDir: newDir, Old: b.old, New: b.new, WaitAnalyze: true, NoAnalyze: false})
	if err != nil {
		t.Fatalf("--wait-analyze: %v (hint: %s)", err, errs.HintOf(err))
	}
	if res.Running {
		t.Error("--wait-analyze left the new cluster running")
	}
	// Nobody is connected before the hand-over: the last stage alone.
	if !strings.Contains(res.Statistics, "--analyze-only") || strings.Contains(res.Statistics, "--analyze-in-stages") {
		t.Errorf("--wait-analyze statistics: %q, want vacuumdb --analyze-only", res.Statistics)
	}
	if _, running, _ := pgdata.Running(newDir); running {
		t.Error("--wait-analyze: a server runs on the new cluster")
	}
}

// startOldPgCtl starts the copy of the fixture in old as an administrator
// would, with pg_ctl and the socket directory on its command line
// (pg_ctl -o '-k DIR -p PORT': only postmaster.opts and the running server
// know it), and with hba as its pg_hba.conf. dirMode is the socket
// directory's mode (0755: others may reach the socket; 01777: as /tmp). It
// returns the port and the socket directory.
func startOldPgCtl(t *testing.T, b builds, old, hba string, dirMode os.FileMode) (int, string) {
	t.Helper()
	u := pgtest.User(t)
	if err := instance.WriteFileAs(filepath.Join(old, "pg_hba.conf"), u, []byte(hba)); err != nil {
		t.Fatal(err)
	}
	sock, err := os.MkdirTemp("/tmp", "pgfork-app-sock-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(sock) })
	if err := u.MkdirOwned(sock, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(sock, dirMode); err != nil {
		t.Fatal(err)
	}
	port, err := instance.FreePort("127.0.0.1")
	if err != nil {
		t.Fatal(err)
	}
	logf := filepath.Join(sock, "old.log")
	cmd := u.Command(context.Background(), b.old.Env, filepath.Join(b.old.BinDir, "pg_ctl"), "start", "-w", "-D", old, "-l", logf,
		"-o", fmt.Sprintf("-k %s -p %d", sock, port))
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("pg_ctl start: %v: %s", err, out)
	}
	t.Cleanup(func() {
		if in, err := instance.Attach(old); err == nil {
			_ = in.Stop(context.Background(), instance.Fast)
		}
	})
	return port, sock
}

// psqlAs runs psql as the OS user uid (the test runs as root) on the
// server at socket directory sock and port, as database role postgres.
func psqlAs(b upgrade.Install, uid int, sock string, port int) ([]byte, error) {
	cmd := exec.Command(filepath.Join(b.BinDir, "psql"), "-X", "-w", "-At", "-h", sock, "-p", strconv.Itoa(port), "-U", "postgres", "-d", "shop",
		"-c", "SELECT current_user")
	cmd.Env = append(instance.MinimalEnv(b.Env), "HOME=/", "PGCONNECT_TIMEOUT=10")
	cmd.Dir = "/"
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: uint32(uid), Gid: uint32(uid)}}
	return cmd.CombinedOutput()
}

// peerHBA allows local connections by peer only (and TCP by password).
const peerHBA = "local all all peer\nhost all all 127.0.0.1/32 scram-sha-256\n"

// TestHandOverCarriesAuthentication upgrades (--stop-old) a cluster started
// with pg_ctl -o '-k DIR' whose pg_hba.conf allows local connections by
// peer only: the new cluster handed over answers on DIR and the old port,
// its pg_hba.conf is the old one's (no trust line), the cluster's OS user
// gets in and the OS user nobody, as postgres, does not. (It was handed
// over with initdb's local trust, in /tmp: nobody got in as postgres.)
func TestHandOverCarriesAuthentication(t *testing.T) {
	t.Parallel() // see TestMain
	b := findBuilds(t)
	dir := testenv.XFSDir(t)
	old := copyFixture(t, b, dir)
	port, sock := startOldPgCtl(t, b, old, peerHBA, 0o755)
	newDir := filepath.Join(dir, "new")
	t.Cleanup(func() {
		if inst, err := instance.Attach(newDir); err == nil {
			_ = inst.Stop(context.Background(), instance.Fast)
		}
	})
	if out, err := psqlAs(b.old, pgtest.User(t).UID, sock, port); err != nil {
		t.Fatalf("the old cluster does not let its own user in: %v: %s", err, out)
	}
	res, err := runServing(t, upgrade.Options{OldDir: old, NewDir: newDir, Old: b.old, New: b.new, StopOld: true})
	if err != nil {
		t.Fatalf("upgrade: %v (hint: %s)", err, errs.HintOf(err))
	}
	if !res.Running {
		t.Fatalf("not handed over: %v", res.Notes)
	}
	inst, err := instance.Attach(newDir)
	if err != nil {
		t.Fatalf("the new cluster is not left running: %v", err)
	}
	defer inst.Release()
	if inst.Port != port || filepath.Clean(inst.SocketDir) != sock {
		t.Errorf("the new cluster answers on port %d, socket directory %s; the old one did on %d, %s", inst.Port, inst.SocketDir, port, sock)
	}
	hba, err := os.ReadFile(filepath.Join(newDir, "pg_hba.conf"))
	if err != nil || string(hba) != peerHBA {
		t.Errorf("the new cluster's pg_hba.conf is not the old one's: %q, %v", hba, err)
	}
	if out, err := psqlAs(b.new, pgtest.User(t).UID, sock, port); err != nil || strings.TrimSpace(string(out)) != "postgres" {
		t.Errorf("the cluster's OS user cannot connect to the new cluster through %s: %v: %s", sock, err, out)
	}
	// nobody, as postgres, on the socket the old cluster had and on the
	// one the new cluster names in its postmaster.pid (initdb's /tmp,
	// with trust, before the fix).
	for _, d := range []string{sock, inst.SocketDir} {
		if out, err := psqlAs(b.new, 65534, d, port); err == nil || !strings.Contains(string(out), "Peer authentication failed") {
			t.Errorf("the OS user nobody connected to the new cluster through %s as postgres (or failed otherwise): %v: %s", d, err, out)
		}
	}
}

// TestHandOverNeverServesTrust: a running cluster whose pg_hba.conf trusts
// local connections on a socket directory everyone can enter (/tmp-like)
// is not upgraded with a hand-over: the run stops before the old cluster
// is stopped, says why, and the old cluster keeps serving; a stopped one
// is upgraded but its new cluster not started (the summary says why).
func TestHandOverNeverServesTrust(t *testing.T) {
	t.Parallel() // see TestMain
	b := findBuilds(t)
	dir := testenv.XFSDir(t)
	old := copyFixture(t, b, dir)
	port, sock := startOldPgCtl(t, b, old, "local all all trust\n", 0o1777)
	newDir := filepath.Join(dir, "new")
	t.Cleanup(func() {
		if inst, err := instance.Attach(newDir); err == nil {
			_ = inst.Stop(context.Background(), instance.Fast)
		}
	})
	_, err := runServing(t, upgrade.Options{OldDir: old, NewDir: newDir, Old: b.old, New: b.new, StopOld: true})
	if errs.KindOf(err) != errs.Permission || !strings.Contains(err.Error(), "trust") || !strings.Contains(err.Error(), sock) {
		t.Fatalf("upgrade of a cluster trusting local connections in %s: %v (hint: %s)", sock, err, errs.HintOf(err))
	}
	if _, running, _ := pgdata.Running(old); !running {
		t.Fatal("the old cluster was stopped")
	}
	if _, err := os.Stat(newDir); err == nil {
		t.Error("NEW_DATADIR was created")
	}
	if out, err := psqlAs(b.old, pgtest.User(t).UID, sock, port); err != nil {
		t.Fatalf("the old cluster does not serve: %v: %s", err, out)
	}

	// Stopped: upgraded, not started.
	if in, err := instance.Attach(old); err == nil {
		if err := in.Stop(context.Background(), instance.Fast); err != nil {
			t.Fatal(err)
		}
	}
	res, err := runServing(t, upgrade.Options{OldDir: old, NewDir: newDir, Old: b.old, New: b.new, Rehearse: upgrade.RehearseOff})
	if err != nil {
		t.Fatalf("upgrade of the stopped cluster: %v (hint: %s)", err, errs.HintOf(err))
	}
	if _, running, _ := pgdata.Running(newDir); running || res.Running {
		t.Fatal("the new cluster was started with local trust on a socket directory open to everyone")
	}
	if notes := strings.Join(res.Notes, "\n"); !strings.Contains(notes, "open to other users") {
		t.Errorf("the summary does not say why the new cluster was not started: %s", notes)
	}
}
