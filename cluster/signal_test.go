package cluster

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/pgfork/pgfork/instance"
	"github.com/pgfork/pgfork/internal/proc"
	"github.com/pgfork/pgfork/internal/statedir"
	"github.com/pgfork/pgfork/internal/testenv"
)

// startSleep starts a process the test owns (as the test's user: root in
// CI) and returns it; it is killed at the end of the test.
func startSleep(t *testing.T, cmd *exec.Cmd) *exec.Cmd {
	t.Helper()
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan struct{})
	go func() { _ = cmd.Wait(); close(exited) }()
	t.Cleanup(func() { _ = cmd.Process.Kill(); <-exited })
	// Let it exec (the exe check must see the real binary).
	time.Sleep(50 * time.Millisecond)
	return cmd
}

func stillAlive(t *testing.T, what string, p *os.Process) {
	t.Helper()
	if err := p.Signal(syscall.Signal(0)); err != nil {
		t.Fatalf("%s (pid %d) was signalled: %v", what, p.Pid, err)
	}
	var st syscall.WaitStatus
	if pid, _ := syscall.Wait4(p.Pid, &st, syscall.WNOHANG, nil); pid == p.Pid {
		t.Fatalf("%s (pid %d) exited: %v", what, p.Pid, st)
	}
}

// fakeCluster registers a cluster whose data directory holds postmaster.pid
// naming pid, as a postgres user able to write it could forge it.
func fakeCluster(t *testing.T, lay statedir.Layout, name string, pidLine string, info Info) string {
	t.Helper()
	p, err := Create(context.Background(), lay, name)
	if err != nil {
		t.Fatal(err)
	}
	u, err := instance.ResolveUser("")
	if err != nil {
		t.Fatal(err)
	}
	data := p.DataDir()
	if err := u.MkdirOwned(data, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(data, "PG_VERSION"), []byte("17\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	pf := fmt.Sprintf("%s\n%s\n%d\n5432\n/tmp\n\n  1234     5678\nready   \n", pidLine, data, time.Now().Unix())
	if err := os.WriteFile(filepath.Join(data, "postmaster.pid"), []byte(pf), 0o600); err != nil {
		t.Fatal(err)
	}
	_ = u.Chown(data)
	info.DataDir = data
	if err := p.Commit(info); err != nil {
		t.Fatal(err)
	}
	return data
}

// TestForgedPidNeverSignalled: postmaster.pid belongs to the PostgreSQL
// user; a pid forged into it (an unrelated root process, or 2^32 + its pid,
// which kill(2) truncates to it) is never signalled by down or the reaper.
func TestForgedPidNeverSignalled(t *testing.T) {
	sleep := startSleep(t, exec.Command("sleep", "300"))
	T := sleep.Process.Pid
	for _, forged := range []string{
		fmt.Sprint(T), fmt.Sprint(uint64(1)<<32 + uint64(T)), "4294967295", "-1", fmt.Sprint(T + 1<<31),
	} {
		t.Run(forged, func(t *testing.T) {
			lay := statedir.Layout{Root: testenv.Dir(t)}
			// Recorded as started by pgfork with that pid: even then the
			// process is not a postgres of this data directory.
			fakeCluster(t, lay, "down", forged, Info{Pid: T})
			if err := Down(context.Background(), lay, "down", DownOptions{Timeout: time.Second}); err != nil {
				t.Fatalf("down: %v", err)
			}
			stillAlive(t, "sleep", sleep.Process)
			if _, err := os.Stat(Dir(lay, "down")); !os.IsNotExist(err) {
				t.Errorf("cluster not removed: %v", err)
			}

			data := fakeCluster(t, lay, "reap", forged, Info{})
			if st := state(Info{}, data); st != Dead {
				t.Errorf("state with forged pid = %s, want dead", st)
			}
			r, err := Reap(context.Background(), lay)
			if err != nil || len(r) != 1 {
				t.Fatalf("reap: %v %v", r, err)
			}
			stillAlive(t, "sleep", sleep.Process)
		})
	}
}

// TestReusedPidNotKilled: the recorded postmaster died and its pid now
// belongs to another process that looks like a postmaster of this data
// directory (executable named postgres, run as the PostgreSQL user, working
// directory the data directory) but started at another time: it is not
// signalled. The control shows the same process is accepted when the
// recorded start time is its own.
func TestReusedPidNotKilled(t *testing.T) {
	u, err := instance.ResolveUser("")
	if err != nil {
		t.Fatal(err)
	}
	dir := testenv.Dir(t)
	fake := filepath.Join(dir, "postgres")
	b, err := os.ReadFile("/bin/sleep")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(fake, b, 0o755); err != nil {
		t.Fatal(err)
	}
	lay := statedir.Layout{Root: filepath.Join(dir, "state")}
	data := fakeCluster(t, lay, "c", "0", Info{})
	cmd := u.Command(context.Background(), nil, fake, "300")
	cmd.Dir = data
	startSleep(t, cmd)
	pid := cmd.Process.Pid
	start := proc.StartTime(pid)
	if start == 0 {
		t.Fatal("no start time")
	}
	pf := fmt.Sprintf("%d\n%s\n%d\n5432\n/tmp\n\n  1234     5678\nready   \n", pid, data, time.Now().Unix())
	if err := os.WriteFile(filepath.Join(data, "postmaster.pid"), []byte(pf), 0o600); err != nil {
		t.Fatal(err)
	}
	// Control: with its own start time it passes every check.
	inst, err := instance.AttachExpect(data, instance.Expect{Pid: pid, Start: start})
	if err != nil {
		t.Fatalf("control: the look-alike should be accepted with its own start time: %v", err)
	}
	inst.Release()
	// Record the dead postmaster: same pid, an earlier start time.
	if err := os.WriteFile(filepath.Join(Dir(lay, "c"), infoFile),
		[]byte(fmt.Sprintf(`{"name":"c","data_dir":%q,"pid":%d,"pid_start":%d}`, data, pid, start-1)), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := Down(context.Background(), lay, "c", DownOptions{Timeout: time.Second}); err != nil {
		t.Fatalf("down: %v", err)
	}
	stillAlive(t, "process with the reused pid", cmd.Process)
}
