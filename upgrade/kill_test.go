package upgrade_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
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

// killChildEnv, set in a process started from this test binary, makes
// TestKillDuringUpgrade run one upgrade and kill itself (SIGKILL) at the
// step named in it: pgfork killed at a known point, without a `go build`
// and without racing on its output.
const killChildEnv = "PGFORK_UPGRADE_KILL_CHILD"

// killRun is what the killed process runs.
type killRun struct {
	Old, New string
	// At is where it dies: a phase starting ("stop-old"), a step of it
	// starting ("rehearsal/initdb", "upgrade/Restoring global objects..."),
	// or a test hook's step in a phase ("settings/hook:settings server
	// started"; see upgrade's testHook).
	At       string
	Rehearse upgrade.Rehearse
	// Before18: upgrade to the newest major before 18 (which hands the
	// new cluster over before statistics).
	Before18 bool
	// WaitAnalyze: statistics on the private socket, the new cluster not
	// handed over.
	WaitAnalyze bool
	// ChangeCatalog creates a database after the online rehearsal, before
	// the stop, so that pg_upgrade --check runs again.
	ChangeCatalog bool
	// Mode is the transfer mode ("": auto).
	Mode upgrade.Mode
}

// killChild runs the upgrade of k and dies at k.At. It never returns.
func killChild(t *testing.T, raw string) {
	var k killRun
	if err := json.Unmarshal([]byte(raw), &k); err != nil {
		t.Fatal(err)
	}
	b := findBuilds(t)
	if k.Before18 {
		b = findBuildsBefore18(t)
	}
	die := func(at string) {
		if at == k.At || (strings.Count(k.At, "/") == 1 && !strings.Contains(k.At, "/hook:") && strings.HasPrefix(at, k.At)) {
			_ = syscall.Kill(os.Getpid(), syscall.SIGKILL)
			select {}
		}
	}
	if k.ChangeCatalog {
		defer upgrade.SetHookBeforeStop(func() {
			if err := createDatabase(k.Old, "late"); err != nil {
				t.Errorf("change the catalogs before the stop: %v", err)
			}
		})()
	}
	var phase string
	defer upgrade.SetTestHook(func(step string) { die(phase + "/hook:" + step) })()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	_, err := upgrade.Run(ctx, upgrade.Options{OldDir: k.Old, NewDir: k.New, Old: b.old, New: b.new, StopOld: true, Rehearse: k.Rehearse,
		Mode: k.Mode, Confirmed: true, Jobs: 2, WaitAnalyze: k.WaitAnalyze, User: pgtest.User(t), OnEvent: func(e upgrade.Event) {
			switch {
			case e.Message != "" || e.Done:
			case e.Step == "":
				phase = e.Phase
				die(e.Phase)
			default:
				die(e.Phase + "/" + e.Step)
			}
		}})
	t.Fatalf("the upgrade ended (%v, hint: %s) before %s", err, errs.HintOf(err), k.At)
}

// createDatabase creates database db in the cluster running on dataDir.
func createDatabase(dataDir, db string) error {
	in, err := instance.Attach(dataDir)
	if err != nil {
		return err
	}
	defer in.Release()
	ctx := context.Background()
	c, err := pgx.Connect(ctx, in.ConnString("", "postgres"))
	if err != nil {
		return err
	}
	defer c.Close(ctx)
	_, err = c.Exec(ctx, "CREATE DATABASE "+pgx.Identifier{db}.Sanitize())
	return err
}

// killAt runs the upgrade of k in a process of its own, which kills itself
// at k.At; it fails the test when that process ended otherwise.
func killAt(t *testing.T, k killRun) {
	t.Helper()
	raw, err := json.Marshal(k)
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(os.Args[0], "-test.run=^TestKillDuringUpgrade$", "-test.count=1", "-test.v")
	cmd.Env = append(os.Environ(), killChildEnv+"="+string(raw))
	out, err := cmd.CombinedOutput()
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.Sys().(syscall.WaitStatus).Signal() != syscall.SIGKILL {
		t.Fatalf("the upgrade was not killed at %s (%v):\n%s", k.At, err, out)
	}
}

// leftServers returns the pids of the servers running on data directories
// under the roots (a killed run's rehearsal clone, its staging directory)
// and on old when they listen in the killed run's temporary directory.
func leftServers(old, tmp string, roots ...string) map[string]int {
	out := map[string]int{}
	for _, r := range roots {
		pids, _ := filepath.Glob(filepath.Join(r, "*", "postmaster.pid"))
		for _, p := range pids {
			if pf, err := instance.ReadPidFile(filepath.Dir(p)); err == nil && syscall.Kill(pf.Pid, 0) == nil {
				out[filepath.Dir(p)] = pf.Pid
			}
		}
	}
	if pf, err := instance.ReadPidFile(old); err == nil && tmp != "" && filepath.Clean(pf.SocketDir) == filepath.Clean(tmp) && syscall.Kill(pf.Pid, 0) == nil {
		out[old] = pf.Pid
	}
	return out
}

// killed is what a killed run left.
type killed struct {
	tmp        string         // its temporary directory
	rehearsals []string       // its rehearsal clones
	servers    map[string]int // servers it left running, by data directory
}

// inspect reads what the run killed at at left in dir: its state file, its
// rehearsal clones and the servers left running on them, on its staging
// directory, on old (listening in its temporary directory) and, with
// placed, on newDir.
func inspect(t *testing.T, dir, old, newDir string, placed bool) killed {
	t.Helper()
	ws := filepath.Join(dir, ".new.pgfork-upgrade")
	raw, err := os.ReadFile(filepath.Join(ws, "state.json"))
	if err != nil {
		t.Fatalf("the killed run left no state: %v", err)
	}
	var st struct{ Tmp string }
	if err := json.Unmarshal(raw, &st); err != nil || st.Tmp == "" {
		t.Fatalf("state %s: %v", raw, err)
	}
	k := killed{tmp: st.Tmp}
	k.rehearsals, _ = filepath.Glob(filepath.Join(dir, ".old.pgfork-rehearsal-*"))
	k.servers = leftServers(old, st.Tmp, append(k.rehearsals, ws)...)
	if placed {
		if pf, err := instance.ReadPidFile(newDir); err == nil && syscall.Kill(pf.Pid, 0) == nil {
			k.servers[newDir] = pf.Pid
		}
	}
	return k
}

// stopLeft stops, once the test ends, what servers the killed runs left
// still running (when the test failed); it returns the function that adds
// a killed run.
func stopLeft(t *testing.T) func(killed) {
	var all []killed
	t.Cleanup(func() {
		for _, k := range all {
			for d, pid := range k.servers {
				if syscall.Kill(pid, 0) != nil {
					continue
				}
				if in, err := instance.Attach(d); err == nil {
					_ = in.Stop(context.Background(), instance.Fast)
				}
			}
		}
	})
	return func(k killed) { all = append(all, k) }
}

// gone checks that the next run removed what the killed run left.
func (k killed) gone(t *testing.T) {
	t.Helper()
	for d, pid := range k.servers {
		if syscall.Kill(pid, 0) == nil {
			t.Errorf("the server the killed run left on %s (pid %d) still runs", d, pid)
		}
	}
	for _, p := range append(k.rehearsals, k.tmp) {
		if _, err := os.Lstat(p); err == nil {
			t.Errorf("the killed run's %s is left", p)
		}
	}
}

// killPoint is one kill of TestKillDuringUpgrade.
type killPoint struct {
	at string
	// running: the old cluster still runs (serving) after the kill.
	running bool
	// servers: the kill left servers running, which the next run stops.
	servers bool
	// anyServers: pg_upgrade, which runs on while pgfork reads its
	// output, may have started a server after the step or not.
	anyServers    bool
	rehearse      upgrade.Rehearse
	changeCatalog bool
}

func (p killPoint) name() string {
	return strings.NewReplacer("/", "_", " ", "_", ":", "_").Replace(p.at)
}

// TestKillDuringUpgrade kills pgfork (SIGKILL) in each phase of an upgrade
// of a running cluster (the default: online rehearsal, stop, real run),
// one subtest per phase, and checks after each kill: before the stop the
// old cluster still runs, serves and is in no backup, after it it starts
// with the same contents each time; NEW_DATADIR does not exist; the next
// run stops the servers the killed one left and removes its rehearsal
// clone and temporary directory. To keep it short the kills follow each
// other on one cluster, each run being the next run of the one before,
// and after the stop the real run's phases are killed in runs without a
// rehearsal; the last run completes, and the new cluster has the old one's
// contents.
func TestKillDuringUpgrade(t *testing.T) {
	if raw := os.Getenv(killChildEnv); raw != "" {
		killChild(t, raw)
		return
	}
	t.Parallel() // see TestMain
	b := findBuilds(t)
	dir := testenv.XFSDir(t)
	old := copyFixture(t, b, dir)
	newDir := filepath.Join(dir, "new")
	inst, conn := startOld(t, b, old, nil)
	ctx := context.Background()
	left := stopLeft(t)
	var prev *killed
	var oldSums map[string]string
	for _, p := range []killPoint{
		{at: upgrade.PhaseRehearsal, running: true},
		{at: "rehearsal/hook:clone copying", running: true},
		{at: "rehearsal/hook:settings server started", running: true, servers: true},
		{at: "rehearsal/initdb", running: true},
		{at: "rehearsal/Restoring global objects", running: true, servers: true},
		{at: "rehearsal/hook:rehearsal server started", running: true, servers: true},
		{at: "rehearsal/delete the clone", running: true},
		{at: upgrade.PhaseStopOld, running: true},
		{at: upgrade.PhaseSettings},
		// The catalogs change after the rehearsal (a new database):
		// pg_upgrade --check runs again, with the old cluster started
		// privately. The old cluster is started again for it.
		{at: "check/Checking database user is the install user", servers: true, changeCatalog: true},
		{at: "settings/hook:settings server started", servers: true, rehearse: upgrade.RehearseOff},
		{at: upgrade.PhaseInitDB, rehearse: upgrade.RehearseOff},
		{at: "upgrade/Restoring global objects", servers: true, rehearse: upgrade.RehearseOff},
		// The files are cloned in milliseconds: pg_upgrade may have started
		// the new cluster for its last steps when pgfork dies.
		{at: "upgrade/Cloning user relation files", anyServers: true, rehearse: upgrade.RehearseOff},
	} {
		t.Run(p.name(), func(t *testing.T) {
			if _, running, _ := pgdata.Running(old); p.changeCatalog && !running {
				inst, conn = startOld(t, b, old, nil)
			}
			killAt(t, killRun{Old: old, New: newDir, At: p.at, Rehearse: p.rehearse, ChangeCatalog: p.changeCatalog})
			if p.changeCatalog {
				oldSums = nil // it has a new database
			}
			k := inspect(t, dir, old, newDir, false)
			left(k)
			if prev != nil {
				prev.gone(t)
			}
			prev = &k
			if !p.anyServers && p.servers != (len(k.servers) > 0) {
				t.Errorf("servers left by the kill: %v, want some: %v", k.servers, p.servers)
			}
			if _, err := os.Stat(newDir); err == nil {
				t.Fatal("the killed run left NEW_DATADIR")
			}
			if p.running {
				if pid, running, _ := pgdata.Running(old); !running || pid != inst.Pid {
					t.Fatalf("the old cluster stopped (running %v, pid %d, was %d)", running, pid, inst.Pid)
				}
				if err := serves(ctx, conn); err != nil {
					t.Fatalf("the application's connection broke: %v", err)
				}
				if _, err := os.Stat(filepath.Join(old, "backup_label")); err == nil {
					t.Error("a backup_label was left in the old cluster")
				}
				return
			}
			if _, running, _ := pgdata.Running(old); running {
				if k.servers[old] == 0 {
					t.Error("the old cluster runs after a kill past the stop, not privately for the killed run")
				}
				return
			}
			// Stopped: it starts, and with the contents it had at the stop.
			sums := startAndSum(t, b.old, old)
			if oldSums == nil {
				oldSums = sums
			}
			compareSums(t, oldSums, sums)
		})
	}
	t.Run("next run completes", func(t *testing.T) {
		res, err := runUpgrade(t, upgrade.Options{OldDir: old, NewDir: newDir, Old: b.old, New: b.new, StopOld: true,
			Rehearse: upgrade.RehearseOff, NoAnalyze: true})
		if err != nil {
			t.Fatalf("the next run: %v (hint: %s)", err, errs.HintOf(err))
		}
		wantCleaned(t, res, dir)
		if prev != nil {
			prev.gone(t)
		}
		sums := startAndSum(t, b.new, newDir)
		if oldSums != nil {
			compareSums(t, oldSums, sums)
		}
		compareSums(t, startAndSum(t, b.old, old), sums)
	})
}

// TestKillAfterPlaced kills pgfork once the upgraded cluster was moved
// into NEW_DATADIR: right after the rename (before it was recorded), at
// the start of the new cluster, and while statistics are rebuilt on it
// privately (--wait-analyze; TestKillAfterHandOver kills after a hand-over).
// The new cluster is complete each time; the next run stops the server the
// killed one had started on it, removes the workspace, keeps the new
// cluster's tablespace directories and refuses NEW_DATADIR saying how to
// finish.
func TestKillAfterPlaced(t *testing.T) {
	t.Parallel() // see TestMain
	b := findBuilds(t)
	dir := testenv.XFSDir(t)
	old := copyFixture(t, b, dir)
	newDir := filepath.Join(dir, "new")
	oldSums := startAndSum(t, b.old, old)
	left := stopLeft(t)
	t.Cleanup(func() {
		if in, err := instance.Attach(newDir); err == nil {
			_ = in.Stop(context.Background(), instance.Fast)
		}
	})
	for _, p := range []killPoint{
		{at: "upgrade/hook:placed"},
		{at: upgrade.PhaseStart},
		{at: upgrade.PhaseStatistics, servers: true},
	} {
		t.Run(p.name(), func(t *testing.T) {
			killAt(t, killRun{Old: old, New: newDir, At: p.at, Rehearse: upgrade.RehearseOff, WaitAnalyze: true})
			k := inspect(t, dir, old, newDir, true)
			left(k)
			if p.servers != (len(k.servers) > 0) {
				t.Errorf("servers left by the kill: %v, want some: %v", k.servers, p.servers)
			}
			if _, err := os.Stat(filepath.Join(newDir, "PG_VERSION")); err != nil {
				t.Fatalf("the upgraded cluster is not in NEW_DATADIR: %v", err)
			}
			tsDirs, _ := filepath.Glob(filepath.Join(tablespaceRoots(t, old)[1], "PG_"+strconv.Itoa(b.new.Major)+"_*"))
			res, err := runUpgrade(t, upgrade.Options{OldDir: old, NewDir: newDir, Old: b.old, New: b.new, Rehearse: upgrade.RehearseOff, NoAnalyze: true})
			if errs.KindOf(err) != errs.Exists || !strings.Contains(err.Error(), "interrupted upgrade") || !strings.Contains(errs.HintOf(err), "start") {
				t.Fatalf("the next run: %v (hint: %s)", err, errs.HintOf(err))
			}
			wantCleaned(t, res, dir)
			k.gone(t)
			if len(tsDirs) != 1 {
				t.Fatalf("the new cluster's tablespace directories: %v", tsDirs)
			}
			compareSums(t, oldSums, startAndSum(t, b.new, newDir))
			compareSums(t, oldSums, startAndSum(t, b.old, old))
			// As the hint says, to upgrade again: remove the new cluster
			// and its tablespace directories.
			for _, d := range append(tsDirs, newDir) {
				if err := os.RemoveAll(d); err != nil {
					t.Fatal(err)
				}
			}
		})
	}
}

// TestKillAfterHandOver upgrades a running cluster to a major before 18 and
// kills pgfork while statistics are rebuilt on the new cluster, which was
// handed over to the application (started with its own configuration on
// the old cluster's port): the next run removes the workspace but leaves
// that server running, and refuses NEW_DATADIR saying how to finish.
func TestKillAfterHandOver(t *testing.T) {
	t.Parallel() // see TestMain
	b := findBuildsBefore18(t)
	dir := testenv.XFSDir(t)
	old := copyFixture(t, b, dir)
	newDir := filepath.Join(dir, "new")
	ctx := context.Background()
	oldInst, _ := startOld(t, b, old, nil)
	port := oldInst.Port
	t.Cleanup(func() {
		if in, err := instance.Attach(newDir); err == nil {
			_ = in.Stop(context.Background(), instance.Fast)
		}
	})
	killAt(t, killRun{Old: old, New: newDir, At: upgrade.PhaseStatistics, Rehearse: upgrade.RehearseOff, Before18: true})
	k := inspect(t, dir, old, newDir, true)
	pid := k.servers[newDir]
	if pid == 0 {
		t.Fatal("no server runs on the new cluster after a kill during statistics")
	}
	in, err := instance.Attach(newDir)
	if err != nil {
		t.Fatal(err)
	}
	if in.Port != port {
		t.Fatalf("the new cluster was not handed over: it listens on port %d, the old one did on %d", in.Port, port)
	}
	res, err := runUpgrade(t, upgrade.Options{OldDir: old, NewDir: newDir, Old: b.old, New: b.new, Rehearse: upgrade.RehearseOff})
	if errs.KindOf(err) != errs.Exists || !strings.Contains(err.Error(), "interrupted upgrade") || !strings.Contains(errs.HintOf(err), "vacuumdb") {
		t.Fatalf("the next run: %v (hint: %s)", err, errs.HintOf(err))
	}
	wantCleaned(t, res, dir)
	if _, err := os.Lstat(k.tmp); err == nil {
		t.Errorf("the killed run's %s is left", k.tmp)
	}
	if syscall.Kill(pid, 0) != nil {
		t.Fatal("the next run stopped the new cluster handed over to the application")
	}
	in.Host = "" // the local socket: TCP needs a password
	conn, err := pgx.Connect(ctx, in.ConnString("postgres", "shop"))
	if err != nil {
		t.Fatalf("the application cannot connect to the handed-over cluster: %v", err)
	}
	defer conn.Close(ctx)
	var n int
	if err := conn.QueryRow(ctx, "SELECT count(*) FROM items").Scan(&n); err != nil || n == 0 {
		t.Errorf("query on the handed-over cluster: %d rows, %v", n, err)
	}
}

// TestKillDuringLinkTransfer kills a --mode link run while pg_upgrade links
// the files, after it disabled the old cluster (pg_control.old) and before
// the new cluster ever started: the next run cleans up and says how to get
// the old cluster back; renamed back, it starts with its data, and the run
// after completes.
func TestKillDuringLinkTransfer(t *testing.T) {
	t.Parallel() // see TestMain
	b := findBuilds(t)
	dir := testenv.XFSDir(t)
	old := copyFixture(t, b, dir)
	_, sums := fixture(t, b)
	newDir := filepath.Join(dir, "new")
	left := stopLeft(t)
	killAt(t, killRun{Old: old, New: newDir, At: "upgrade/Linking user relation files", Rehearse: upgrade.RehearseOff, Mode: upgrade.Link})
	k := inspect(t, dir, old, newDir, false)
	left(k)
	if _, err := os.Stat(newDir); err == nil {
		t.Fatal("the killed run left NEW_DATADIR")
	}
	ctl := filepath.Join(old, "global", "pg_control")
	o := upgrade.Options{OldDir: old, NewDir: newDir, Old: b.old, New: b.new, Rehearse: upgrade.RehearseOff, Mode: upgrade.Link, Confirmed: true, NoAnalyze: true}
	res, err := runUpgrade(t, o)
	if errs.KindOf(err) != errs.Busy || !strings.Contains(err.Error(), "pg_control.old") || !strings.Contains(errs.HintOf(err), "rename "+ctl+".old") {
		t.Fatalf("the next run: %v (hint: %s)", err, errs.HintOf(err))
	}
	wantCleaned(t, res, dir)
	k.gone(t)
	if err := os.Rename(ctl+".old", ctl); err != nil {
		t.Fatal(err)
	}
	compareSums(t, sums, startAndSum(t, b.old, old))
	if _, err := runUpgrade(t, o); err != nil {
		t.Fatalf("the run after the rename: %v (hint: %s)", err, errs.HintOf(err))
	}
	compareSums(t, sums, startAndSum(t, b.new, newDir))
}

// TestKillDuringOfflineRehearsal kills pgfork while pg_upgrade runs on the
// rehearsal's clone of a stopped old cluster (servers of pg_upgrade run on
// the clone, whose files share blocks with the original): the original is
// unchanged byte for byte, and the next run stops those servers, removes
// the clone and completes.
func TestKillDuringOfflineRehearsal(t *testing.T) {
	t.Parallel() // see TestMain
	b := findBuilds(t)
	dir := testenv.XFSDir(t)
	old := copyFixture(t, b, dir)
	_, sums := fixture(t, b)
	newDir := filepath.Join(dir, "new")
	roots := tablespaceRoots(t, old)
	before := treeSums(t, roots...)
	left := stopLeft(t)
	killAt(t, killRun{Old: old, New: newDir, At: "rehearsal/Restoring global objects"})
	k := inspect(t, dir, old, newDir, false)
	left(k)
	if len(k.servers) == 0 || len(k.rehearsals) == 0 {
		t.Errorf("the kill left no servers (%v) or no rehearsal clone (%v): it came too early", k.servers, k.rehearsals)
	}
	if d := diffSums(before, treeSums(t, roots...)); len(d) > 0 {
		t.Fatalf("the killed rehearsal changed the original: %v", d)
	}
	if _, err := os.Stat(newDir); err == nil {
		t.Fatal("the killed run left NEW_DATADIR")
	}
	res, err := runUpgrade(t, upgrade.Options{OldDir: old, NewDir: newDir, Old: b.old, New: b.new, Rehearse: upgrade.RehearseOff, NoAnalyze: true})
	if err != nil {
		t.Fatalf("the next run: %v (hint: %s)", err, errs.HintOf(err))
	}
	wantCleaned(t, res, dir)
	k.gone(t)
	compareSums(t, sums, startAndSum(t, b.new, newDir))
	compareSums(t, sums, startAndSum(t, b.old, old))
}

// wantCleaned fails the test unless the next run (its result res) reports
// what it cleaned up and left nothing of pgfork's in dir.
func wantCleaned(t *testing.T, res *upgrade.Result, dir string) {
	t.Helper()
	if res == nil || len(res.CleanedUp) == 0 {
		t.Errorf("the next run reported nothing cleaned up: %+v", res)
	}
	if left, _ := filepath.Glob(filepath.Join(dir, ".*pgfork*")); len(left) > 0 {
		t.Errorf("left after the next run: %v", left)
	}
}

// interruptAt runs the upgrade of o and cancels its context, as SIGINT or
// SIGTERM does in pgfork upgrade, at the point named as killRun.At names
// it (a phase starting, a step of it, or "phase/hook:step").
func interruptAt(t *testing.T, o upgrade.Options, at string) (*upgrade.Result, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	hit := false
	fire := func(point string) {
		if !hit && (point == at || (strings.Count(at, "/") == 1 && !strings.Contains(at, "/hook:") && strings.HasPrefix(point, at))) {
			hit = true
			cancel()
		}
	}
	var phase string
	defer upgrade.SetTestHook(func(step string) { fire(phase + "/hook:" + step) })()
	o.User = pgtest.User(t)
	o.OnEvent = func(e upgrade.Event) {
		switch {
		case e.Message != "":
			t.Logf("%s: %s", e.Phase, e.Message)
		case e.Done:
		case e.Step == "":
			phase = e.Phase
			fire(e.Phase)
		default:
			fire(e.Phase + "/" + e.Step)
		}
	}
	res, err := upgrade.Run(ctx, o)
	if !hit {
		t.Fatalf("the run never reached %s: %v", at, err)
	}
	return res, err
}

// answers connects to the server running on dataDir and reads the
// fixture's table: the application's server is up.
func answers(t *testing.T, dataDir string, port int) {
	t.Helper()
	in, err := instance.Attach(dataDir)
	if err != nil {
		t.Fatalf("no server runs on %s: %v", dataDir, err)
	}
	defer in.Release()
	if in.Port != port {
		t.Errorf("the server on %s listens on port %d, the application's is %d", dataDir, in.Port, port)
	}
	in.Host = ""
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, in.ConnString("postgres", "shop"))
	if err != nil {
		t.Fatalf("the application cannot connect to %s: %v", dataDir, err)
	}
	defer conn.Close(ctx)
	var n int
	if err := conn.QueryRow(ctx, "SELECT count(*) FROM items").Scan(&n); err != nil || n == 0 {
		t.Errorf("query on %s: %d rows, %v", dataDir, n, err)
	}
}

// TestInterruptAfterStop interrupts (SIGINT/SIGTERM: the context
// cancelled) an upgrade of a running cluster at each phase after the old
// cluster was stopped. While the old cluster is intact the run starts it
// again, as it ran (its port, its command line), and says so; once the new
// cluster serves (after the hand-over), or once --mode link made the old
// one unusable (the run then finishes the hand-over first), it says the new
// cluster serves. Each time a server answers on the application's port.
// (An interrupt after the stop once left nothing serving, with no word.)
func TestInterruptAfterStop(t *testing.T) {
	b := findBuilds(t)
	dir := testenv.XFSDir(t)
	old := copyFixture(t, b, dir)
	newDir := filepath.Join(dir, "new")
	oldInst, _ := startOld(t, b, old, nil)
	port := oldInst.Port
	for _, d := range []string{old, newDir} {
		t.Cleanup(func() {
			if in, err := instance.Attach(d); err == nil {
				_ = in.Stop(context.Background(), instance.Fast)
			}
		})
	}
	removeNew := func(t *testing.T) {
		t.Helper()
		if in, err := instance.Attach(newDir); err == nil {
			if err := in.Stop(context.Background(), instance.Fast); err != nil {
				t.Fatal(err)
			}
		}
		ds, _ := filepath.Glob(filepath.Join(tablespaceRoots(t, old)[1], "PG_"+strconv.Itoa(b.new.Major)+"_*"))
		for _, d := range append(ds, newDir) {
			if err := os.RemoveAll(d); err != nil {
				t.Fatal(err)
			}
		}
	}
	for _, p := range []struct {
		at   string
		mode upgrade.Mode
		// newServes: the new cluster serves after the interrupt.
		newServes bool
	}{
		{at: upgrade.PhaseSettings},
		{at: "settings/hook:settings server started"},
		{at: upgrade.PhaseInitDB},
		{at: "upgrade/Restoring global objects"},
		{at: upgrade.PhaseStart},
		{at: upgrade.PhaseStatistics, newServes: true},
		// --mode link: pg_upgrade disabled the old cluster before it
		// links; the run finishes the hand-over.
		{at: "upgrade/Linking user relation files", mode: upgrade.Link, newServes: true},
	} {
		t.Run(killPoint{at: p.at}.name()+"_"+string(p.mode), func(t *testing.T) {
			if _, running, _ := pgdata.Running(old); !running {
				t.Fatal("the old cluster does not run before the interrupted run")
			}
			_, err := interruptAt(t, upgrade.Options{OldDir: old, NewDir: newDir, Old: b.old, New: b.new, StopOld: true,
				Rehearse: upgrade.RehearseOff, Mode: p.mode, Confirmed: true}, p.at)
			if errs.KindOf(err) != errs.Interrupted {
				t.Fatalf("interrupted run: %v (hint: %s), want an interrupt (exit 130)", err, errs.HintOf(err))
			}
			if p.newServes {
				if want := fmt.Sprintf("the new cluster serves on port %d", port); !strings.Contains(err.Error(), want) {
					t.Errorf("interrupted run: %v, want %q", err, want)
				}
				answers(t, newDir, port)
				if _, running, _ := pgdata.Running(old); running {
					t.Error("the old cluster runs too")
				}
				removeNew(t)
				if p.mode != upgrade.Link {
					// Clone mode: the old cluster is intact, for the next point.
					cmd := pgtest.User(t).Command(context.Background(), b.old.Env, filepath.Join(b.old.BinDir, "pg_ctl"), "start", "-w", "-D", old,
						"-l", filepath.Join(old, instance.LogFileName), "-o", fmt.Sprintf("-p %d -k %s", port, oldInst.SocketDir))
					if out, err := cmd.CombinedOutput(); err != nil {
						t.Fatalf("start the old cluster again: %v: %s", err, out)
					}
				}
				return
			}
			if want := fmt.Sprintf("the old cluster is running again on port %d", port); !strings.Contains(err.Error(), want) {
				t.Errorf("interrupted run: %v, want %q", err, want)
			}
			answers(t, old, port)
			if _, serr := os.Stat(newDir); serr == nil {
				if p.at != upgrade.PhaseStart || !strings.Contains(errs.HintOf(err), newDir) {
					t.Errorf("NEW_DATADIR left (hint: %s)", errs.HintOf(err))
				}
				removeNew(t)
			}
		})
	}
}

// TestKillDuringPGUpgradeThenManualStart kills pgfork (kill -9) while
// pg_upgrade runs with the old cluster started in binary-upgrade mode on
// the run's private socket: that server outlives pgfork (a manual start of
// the old cluster fails). The next run stops it and says so, and the old
// cluster then starts by hand, as it ran, and serves.
func TestKillDuringPGUpgradeThenManualStart(t *testing.T) {
	t.Parallel() // see TestMain
	b := findBuilds(t)
	dir := testenv.XFSDir(t)
	old := copyFixture(t, b, dir)
	newDir := filepath.Join(dir, "new")
	oldInst, _ := startOld(t, b, old, nil)
	port := oldInst.Port
	left := stopLeft(t)
	// pg_upgrade dumps the old cluster's schemas from its binary-upgrade server.
	killAt(t, killRun{Old: old, New: newDir, At: "upgrade/Creating dump of database schemas", Rehearse: upgrade.RehearseOff})
	k := inspect(t, dir, old, newDir, false)
	left(k)
	if k.servers[old] == 0 {
		t.Fatalf("no server of pg_upgrade runs on the old cluster after the kill: %v", k.servers)
	}
	pgCtl := func() ([]byte, error) {
		cmd := pgtest.User(t).Command(context.Background(), b.old.Env, filepath.Join(b.old.BinDir, "pg_ctl"), "start", "-w", "-D", old,
			"-l", filepath.Join(old, instance.LogFileName), "-o", fmt.Sprintf("-p %d -k %s", port, oldInst.SocketDir))
		return cmd.CombinedOutput()
	}
	if out, err := pgCtl(); err == nil {
		t.Fatalf("the old cluster started by hand beside pg_upgrade's server: %s", out)
	}
	res, err := runUpgrade(t, upgrade.Options{OldDir: old, NewDir: newDir, Old: b.old, New: b.new, CheckOnly: true})
	if err != nil {
		t.Fatalf("the next run: %v (hint: %s)", err, errs.HintOf(err))
	}
	wantCleaned(t, res, dir)
	k.gone(t)
	if all := strings.Join(res.CleanedUp, "\n"); !strings.Contains(all, fmt.Sprintf("pid %d", k.servers[old])) || !strings.Contains(all, "can be started again") {
		t.Errorf("the next run does not say it stopped pg_upgrade's server: %s", all)
	}
	if out, err := pgCtl(); err != nil {
		t.Fatalf("the old cluster does not start by hand after the next run: %v: %s", err, out)
	}
	t.Cleanup(func() {
		if in, err := instance.Attach(old); err == nil {
			_ = in.Stop(context.Background(), instance.Fast)
		}
	})
	answers(t, old, port)
}
