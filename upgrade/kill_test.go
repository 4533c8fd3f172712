package upgrade_test

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

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
}

// killChild runs the upgrade of k and dies at k.At. It never returns.
func killChild(t *testing.T, raw string) {
	var k killRun
	if err := json.Unmarshal([]byte(raw), &k); err != nil {
		t.Fatal(err)
	}
	b := findBuilds(t)
	die := func(at string) {
		if at == k.At || (strings.Count(k.At, "/") == 1 && !strings.Contains(k.At, "/hook:") && strings.HasPrefix(at, k.At)) {
			_ = syscall.Kill(os.Getpid(), syscall.SIGKILL)
			select {}
		}
	}
	var phase string
	defer upgrade.SetTestHook(func(step string) { die(phase + "/hook:" + step) })()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	_, err := upgrade.Run(ctx, upgrade.Options{OldDir: k.Old, NewDir: k.New, Old: b.old, New: b.new, StopOld: true, Rehearse: k.Rehearse,
		Jobs: 2, User: pgtest.User(t), OnEvent: func(e upgrade.Event) {
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

// TestKillDuringUpgrade kills pgfork (SIGKILL) in each phase of an upgrade
// of a running cluster (the default: online rehearsal, stop, real run),
// one subtest per phase, and checks after each kill: before the stop the
// old cluster still runs, serves and is in no backup; NEW_DATADIR does not
// exist until the upgraded cluster was moved into place whole; the next
// run stops the servers the killed one left, removes its workspace,
// rehearsal clone and temporary directory, and completes (or, once the
// upgraded cluster was in place, says so and how to finish); the old
// cluster then starts with the same contents as the new one.
func TestKillDuringUpgrade(t *testing.T) {
	if raw := os.Getenv(killChildEnv); raw != "" {
		killChild(t, raw)
		return
	}
	b := findBuilds(t)
	fixture(t, b)
	for _, tc := range []struct {
		at string
		// running: the old cluster still runs (serving) after the kill.
		running bool
		// placed: the upgraded cluster was in NEW_DATADIR at the kill.
		placed bool
		// servers: the kill left servers running, which the next run stops.
		servers  bool
		rehearse upgrade.Rehearse
	}{
		{at: upgrade.PhaseRehearsal, running: true},
		{at: "rehearsal/hook:clone copying", running: true},
		{at: "rehearsal/hook:settings server started", running: true, servers: true},
		{at: "rehearsal/initdb", running: true},
		{at: "rehearsal/Restoring global objects", running: true, servers: true},
		{at: "rehearsal/hook:rehearsal server started", running: true, servers: true},
		{at: "rehearsal/delete the clone", running: true},
		{at: upgrade.PhaseStopOld, running: true},
		{at: upgrade.PhaseSettings},
		{at: "settings/hook:settings server started", servers: true},
		{at: upgrade.PhaseInitDB},
		{at: "upgrade/Restoring global objects", servers: true},
		{at: "upgrade/Cloning user relation files", servers: true},
		{at: "upgrade/hook:placed", placed: true, rehearse: upgrade.RehearseOff},
		{at: upgrade.PhaseStart, placed: true, rehearse: upgrade.RehearseOff},
		{at: upgrade.PhaseStatistics, placed: true, servers: true, rehearse: upgrade.RehearseOff},
	} {
		t.Run(strings.NewReplacer("/", "_", " ", "_", ":", "_").Replace(tc.at), func(t *testing.T) {
			ctx := context.Background()
			dir := testenv.XFSDir(t)
			old := copyFixture(t, b, dir)
			newDir := filepath.Join(dir, "new")
			inst, conn := startOld(t, b, old, nil)
			t.Cleanup(func() {
				if in, err := instance.Attach(newDir); err == nil {
					_ = in.Stop(context.Background(), instance.Fast)
				}
			})
			killAt(t, killRun{Old: old, New: newDir, At: tc.at, Rehearse: tc.rehearse})

			ws := filepath.Join(dir, ".new.pgfork-upgrade")
			raw, err := os.ReadFile(filepath.Join(ws, "state.json"))
			if err != nil {
				t.Fatalf("the killed run left no state: %v", err)
			}
			var st struct{ Tmp, Rehearsal string }
			if err := json.Unmarshal(raw, &st); err != nil || st.Tmp == "" {
				t.Fatalf("state %s: %v", raw, err)
			}
			rehearsals, _ := filepath.Glob(filepath.Join(dir, ".old.pgfork-rehearsal-*"))
			servers := leftServers(old, st.Tmp, append(rehearsals, ws)...)
			if tc.placed {
				for k, v := range leftServers(old, st.Tmp, dir) {
					if k == newDir {
						servers[k] = v
					}
				}
			}
			if tc.servers != (len(servers) > 0) {
				t.Errorf("servers left by the kill: %v, want some: %v", servers, tc.servers)
			}
			if tc.running {
				if pid, running, _ := pgdata.Running(old); !running || pid != inst.Pid {
					t.Fatalf("the old cluster stopped (running %v, pid %d, was %d)", running, pid, inst.Pid)
				}
				if err := serves(ctx, conn); err != nil {
					t.Fatalf("the application's connection broke: %v", err)
				}
				if _, err := os.Stat(filepath.Join(old, "backup_label")); err == nil {
					t.Error("a backup_label was left in the old cluster")
				}
			} else if _, running, _ := pgdata.Running(old); running && servers[old] == 0 {
				t.Error("the old cluster runs after a kill past the stop")
			}
			if _, err := os.Stat(newDir); tc.placed != (err == nil) {
				t.Fatalf("NEW_DATADIR after the kill: %v, want it to exist: %v", err, tc.placed)
			}

			// The next run cleans up and completes.
			res, err := runUpgrade(t, upgrade.Options{OldDir: old, NewDir: newDir, Old: b.old, New: b.new, StopOld: true,
				Rehearse: upgrade.RehearseOff, NoAnalyze: true})
			if tc.placed {
				if errs.KindOf(err) != errs.Exists || !strings.Contains(err.Error(), "interrupted upgrade") || !strings.Contains(errs.HintOf(err), "start") {
					t.Fatalf("the next run after the new cluster was in place: %v (hint: %s)", err, errs.HintOf(err))
				}
			} else if err != nil {
				t.Fatalf("the next run: %v (hint: %s)", err, errs.HintOf(err))
			}
			if res == nil || len(res.CleanedUp) == 0 {
				t.Errorf("the next run reported nothing cleaned up: %+v", res)
			}
			for d, pid := range servers {
				if syscall.Kill(pid, 0) == nil {
					t.Errorf("the server the killed run left on %s (pid %d) still runs", d, pid)
				}
			}
			for _, p := range append(rehearsals, st.Tmp, ws) {
				if _, err := os.Lstat(p); err == nil {
					t.Errorf("the killed run's %s is left", p)
				}
			}
			if left, _ := filepath.Glob(filepath.Join(dir, ".*pgfork*")); len(left) > 0 {
				t.Errorf("left after the next run: %v", left)
			}
			if _, running, _ := pgdata.Running(old); running {
				t.Fatal("the old cluster runs after the upgrade")
			}
			compareSums(t, startAndSum(t, b.old, old), startAndSum(t, b.new, newDir))
		})
	}
}
