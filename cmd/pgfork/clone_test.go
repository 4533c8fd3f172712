package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/pgfork/pgfork/clone"
	"github.com/pgfork/pgfork/instance"
	"github.com/pgfork/pgfork/internal/pgtest"
	"github.com/pgfork/pgfork/internal/testenv"
)

// The tests of `pgfork clone` as a command (its library is pgclone's,
// tested there): refusals and exit codes, --start, the summary, and a clone
// killed mid-copy.

// newPGCluster runs initdb of build b in base/name.
func newPGCluster(t *testing.T, b pgtest.Build, base, name string) string {
	t.Helper()
	data := filepath.Join(base, name)
	pgtest.InitDB(t, data, b.Server())
	return data
}

// startPG starts a server of build b on data, stopped when the test ends.
func startPG(t *testing.T, b pgtest.Build, data string) *instance.Instance {
	t.Helper()
	return pgtest.Start(t, data, pgtest.Server{BinDir: b.Bin, Env: b.Inst.Env(), LogFile: data + ".server.log"})
}

// cloneLeftovers lists what a clone to dst left beside it (its staging
// directory).
func cloneLeftovers(t *testing.T, dst string) []string {
	t.Helper()
	m, _ := filepath.Glob(filepath.Join(filepath.Dir(dst), "."+filepath.Base(dst)+"*"))
	return m
}

// TestKillMidClone kills pgfork (a process) with SIGKILL while it copies:
// no destination appears, the source is untouched and starts (offline) or
// keeps running with the backup and its temporary slot gone (online), and
// the next run cleans up and succeeds.
//
// One PostgreSQL major, the oldest under test: what is tested is pgfork's
// process being killed and its next run cleaning up; the clones themselves
// on every major are pgclone's tests (TestOfflineClone,
// TestOnlineCloneUnderPgbench). It ran once per major, 38 s of the package.
func TestKillMidClone(t *testing.T) {
	t.Parallel() // see TestMain
	e := pgtest.Builds(t, 0)[0]
	t.Run(e.Name(), func(t *testing.T) {
		bin := pgforkBinary(t) // killed mid-copy: a process of its own
		base := testenv.Dir(t)
		src := newPGCluster(t, e, base, "src")
		in := startPG(t, e, src)
		e.Tool(t, "pgbench", "-h", in.SocketDir, "-p", fmt.Sprint(in.Port), "-U", "postgres", "-i", "-q", "-s", "10", "postgres")

		killMid := func(t *testing.T, dst string, args ...string) {
			t.Helper()
			cmd := exec.Command(bin, append([]string{"clone", src, dst, "--method", "copy", "--jobs", "1", "--sync", "fsync", "--pg-bin", e.Bin}, args...)...)
			var out bytes.Buffer
			cmd.Stdout, cmd.Stderr = &out, &out
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			// Kill once the staging copy has real data in it.
			deadline := time.Now().Add(60 * time.Second)
			killed := false
			for time.Now().Before(deadline) && !killed {
				for _, l := range cloneLeftovers(t, dst) {
					if _, err := os.Stat(filepath.Join(l, "base")); err == nil {
						_ = cmd.Process.Signal(syscall.SIGKILL)
						killed = true
					}
				}
				time.Sleep(time.Millisecond)
			}
			err := cmd.Wait()
			var ee *exec.ExitError
			if !killed || !errors.As(err, &ee) || ee.Sys().(syscall.WaitStatus).Signal() != syscall.SIGKILL {
				t.Fatalf("pgfork was not killed mid-copy (killed=%v, err=%v):\n%s", killed, err, out.String())
			}
			if _, err := os.Lstat(dst); err == nil {
				t.Fatal("a killed clone left the destination")
			}
			if len(cloneLeftovers(t, dst)) == 0 {
				t.Error("expected the killed clone's staging directory (to be cleaned by the next run)")
			}
		}
		rerun := func(t *testing.T, dst string, args ...string) {
			t.Helper()
			if r := runInProcess(t, append([]string{"clone", src, dst, "--pg-bin", e.Bin, "--json"}, args...)...); r.code != 0 {
				t.Fatalf("clone after the kill: exit %d\n%s%s", r.code, r.stdout, r.stderr)
			}
			if l := cloneLeftovers(t, dst); len(l) > 0 {
				t.Errorf("the next run left the killed clone's leftovers: %v", l)
			}
			cl := startPG(t, e, dst)
			if got := pgtest.Query(t, cl.ConnString("", ""), "SELECT count(*)::text FROM pgbench_branches"); got != "10" {
				t.Errorf("clone after the kill: %s branches", got)
			}
			pgtest.Stop(t, cl)
		}

		t.Run("online", func(t *testing.T) {
			dst := filepath.Join(base, "online")
			killMid(t, dst, "--online")
			url := in.ConnString("", "")
			// The server notices the dropped session: its temporary slot goes.
			for i := 0; ; i++ {
				n := pgtest.Query(t, url, "SELECT count(*)::text FROM pg_replication_slots")
				if n == "0" {
					break
				}
				if i > 500 {
					t.Fatalf("the killed clone's temporary slot is still on the source (%s slots)", n)
				}
				time.Sleep(10 * time.Millisecond)
			}
			if got := pgtest.Query(t, url, "SELECT count(*)::text FROM pgbench_branches"); got != "10" {
				t.Errorf("source after a killed clone: %s branches", got)
			}
			rerun(t, dst, "--online")
		})
		t.Run("offline", func(t *testing.T) {
			pgtest.Stop(t, in)
			before := testenv.TreeHash(t, src)
			dst := filepath.Join(base, "offline")
			killMid(t, dst)
			testenv.SameTree(t, "source after a killed clone", before, testenv.TreeHash(t, src))
			in2 := startPG(t, e, src)
			if got := pgtest.Query(t, in2.ConnString("", ""), "SELECT count(*)::text FROM pgbench_branches"); got != "10" {
				t.Errorf("source after a killed clone: %s branches", got)
			}
			pgtest.Stop(t, in2)
			rerun(t, dst)
		})
	})
}

// TestCloneCLI checks the command's refusals and exit codes, and --start.
//
// One PostgreSQL major, the oldest under test (without --pg-bin pgfork must
// then pick it, not the newest): the command's wiring is the same on every
// major, and pgclone's tests clone each major, Debian layouts included. It
// ran once per major, 30 s of the package.
func TestCloneCLI(t *testing.T) {
	t.Parallel() // see TestMain
	e := pgtest.Builds(t, 0)[0]
	t.Run(e.Name(), func(t *testing.T) {
		base := testenv.Dir(t)
		src := newPGCluster(t, e, base, "src")
		startPG(t, e, src)
		// No --pg-bin: pgfork picks the build matching the source's major,
		// looking in the state directory that holds the managed builds.
		state := t.TempDir()
		if filepath.Base(filepath.Dir(filepath.Dir(e.Bin))) == "installs" {
			state = filepath.Dir(filepath.Dir(filepath.Dir(e.Bin)))
		}
		runIn := func(state string, want int, args ...string) string {
			t.Helper()
			r := runInProcess(t, append([]string{"--state-dir", state, "clone"}, args...)...)
			if r.code != want {
				t.Errorf("pgfork clone %v: exit %d, want %d\n%s%s", args, r.code, want, r.stdout, r.stderr)
			}
			return r.stdout + r.stderr
		}
		run := func(want int, args ...string) string { t.Helper(); return runIn(state, want, args...) }
		if out := run(6, src, filepath.Join(base, "x")); !strings.Contains(out, "--online") {
			t.Errorf("refusal of a running source does not suggest --online:\n%s", out)
		}
		run(2, src)
		run(2, "--port", "0", src, filepath.Join(base, "x"))
		run(2, "--url", "postgresql:///x", src, filepath.Join(base, "x"))
		run(2, filepath.Join(base), filepath.Join(base, "x"))

		// --start makes a branch of the running source (cloned online), in
		// a state directory of this test's own, not the shared one that
		// holds the managed builds; --json prints the branch.
		own := testenv.Dir(t)
		r := runInProcess(t, "--state-dir", own, "clone", src, filepath.Join(base, "started"), "--online", "--port", "auto", "--start", "--json", "--pg-bin", e.Bin)
		var br struct{ URL string }
		if err := json.Unmarshal([]byte(r.stdout), &br); r.code != 0 || err != nil || !strings.HasPrefix(br.URL, "postgresql://") {
			t.Fatalf("--start --json: exit %d (%v):\n%s%s", r.code, err, r.stdout, r.stderr)
		}
		defer runInProcess(t, "--state-dir", own, "branch", "rm", "started")
		if got := pgtest.Query(t, br.URL, "SELECT current_user"); got != "branch_started" {
			t.Errorf("the branch's URL logs in as %s, not the branch's role", got)
		}
		out := run(0, src, filepath.Join(base, "second"), "--online", "--pg-bin", e.Bin)
		for _, want := range []string{"online", "start it with:", "system id", "pg_ctl"} {
			if !strings.Contains(out, want) {
				t.Errorf("summary lacks %q:\n%s", want, out)
			}
		}

		// A Debian-style cluster: its configuration copied with --config-dir,
		// or the summary says plainly that the clone has none.
		deb := e.NewDebianCluster(t, base)
		out = run(0, "--config-dir", deb.Conf, "--pg-bin", e.Bin, deb.Data, filepath.Join(base, "deb-clone"))
		for _, want := range []string{"config:", "found by --config-dir", "conf.d/custom.conf", "commented out", "data_directory", "external_pid_file"} {
			if !strings.Contains(out, want) {
				t.Errorf("summary of a clone with --config-dir lacks %q:\n%s", want, out)
			}
		}
		if out := run(0, "--pg-bin", e.Bin, deb.Data, filepath.Join(base, "deb-noconf")); !strings.Contains(out, "NONE") || !strings.Contains(out, "--config-dir") {
			t.Errorf("summary of a clone without its configuration does not say so:\n%s", out)
		}
		run(2, "--config-dir", deb.Conf, src, filepath.Join(base, "y"))
	})
}

// TestCloneStartBesideItsData (issue 60): a stopped cluster on XFS, the
// state directory on another filesystem (ext4, else a tmpfs): clone
// --start SRC DST, with DST on SRC's XFS, makes DST the branch's data
// directory, a clone sharing its blocks with SRC (FIEMAP), warns of no
// copy, keeps nothing of it in the state directory, and branch rm
// removes DST and the home beside it. Before, the branch was copied
// into the state directory, DST not made.
func TestCloneStartBesideItsData(t *testing.T) {
	t.Parallel() // see TestMain
	b := pgtest.Builds(t, 0)[0]
	base, src, rel := stoppedSourceOnXFS(t, b)
	state := filepath.Join(testenv.Dir(t), "state")
	if fs, err := clone.FSType(filepath.Dir(state)); err != nil || fs == "xfs" {
		state = filepath.Join(testenv.TmpfsDir(t), "state")
	}
	pg := func(args ...string) cliResult {
		return runInProcess(t, append([]string{"--state-dir", state, "--pg-bin", b.Bin}, args...)...)
	}
	dst := filepath.Join(base, "dev")
	r := pg("clone", src, dst, "--start")
	t.Cleanup(func() { pg("branch", "rm", "dev") })
	r.ok(t)
	if strings.Contains(r.stderr, "not cloned") {
		t.Errorf("clone --start onto the source's filesystem warned of a copy:\n%s", r.stderr)
	}
	url := regexp.MustCompile(`postgresql://\S+`).FindString(r.stdout)
	if n := pgtest.Query(t, url, "SELECT count(*) FROM t"); n != "50000" {
		t.Errorf("the branch has %s rows, want 50000", n)
	}
	if _, err := os.Stat(filepath.Join(dst, "PG_VERSION")); err != nil {
		t.Fatalf("DST is not the branch's data directory: %v", err)
	}
	if !sharesExtents(t, filepath.Join(src, rel), filepath.Join(dst, rel)) {
		t.Errorf("%s in DST shares no extent with the source's: copied, not cloned", rel)
	}
	for _, sub := range []string{"snap", "data"} {
		if ents, _ := os.ReadDir(filepath.Join(state, "branches", sub)); len(ents) != 0 {
			t.Errorf("the state directory's branches/%s holds %v", sub, ents)
		}
	}
	pg("branch", "rm", "dev").ok(t)
	ents, _ := os.ReadDir(base)
	var left []string
	for _, e := range ents {
		if e.Name() != "src" {
			left = append(left, e.Name())
		}
	}
	if len(left) != 0 {
		t.Errorf("after branch rm, beside the source: %v, want nothing", left)
	}
}
