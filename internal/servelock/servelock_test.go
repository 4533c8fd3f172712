package servelock

import (
	"bufio"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"testing"

	"github.com/pgfork/pgfork/internal/flock"
	"github.com/pgfork/pgfork/internal/proc"
	"github.com/pgfork/pgfork/internal/statedir"
)

// holderEnv makes the test binary a serve stand-in (TestHolder): it takes
// the lock of the state directory in its value, records itself, prints
// "ready" and waits to be killed.
const holderEnv = "PGFORK_TEST_SERVELOCK_HOLDER"

func TestHolder(t *testing.T) {
	root := os.Getenv(holderEnv)
	if root == "" {
		return
	}
	lay := statedir.Layout{Root: root}
	l, err := flock.TryExclusive(LockPath(lay))
	if err != nil {
		t.Fatal(err)
	}
	defer l.Unlock()
	if err := Record(lay, "127.0.0.1:5999"); err != nil {
		t.Fatal(err)
	}
	os.Stdout.WriteString("ready\n")
	select {}
}

// TestFind (issue 57, G2): a record counts only while the lock is held and
// its pid runs as the recorded user, the caller's, with the recorded start
// time. A serve killed with -9 leaves its record: no owner then.
func TestFind(t *testing.T) {
	if proc.StartTime(os.Getpid()) == 0 {
		t.Skip("KNOWN SKIP: no process start times outside Linux: nothing is proven there")
	}
	lay := statedir.Layout{Root: t.TempDir()}
	if err := os.MkdirAll(lay.Locks(), 0o755); err != nil {
		t.Fatal(err)
	}
	if _, ok := Find(lay); ok {
		t.Fatal("an owner without a record")
	}

	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(exe, "-test.run=^TestHolder$")
	cmd.Env = append(os.Environ(), holderEnv+"="+lay.Root)
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = cmd.Process.Kill(); _ = cmd.Wait() }()
	if r := bufio.NewScanner(out); !r.Scan() || r.Text() != "ready" {
		t.Fatalf("the stand-in did not record itself: %q", r.Text())
	}
	o, ok := Find(lay)
	if !ok || o.Pid != cmd.Process.Pid || o.Listen != "127.0.0.1:5999" || o.UID != os.Geteuid() || o.Start != proc.StartTime(cmd.Process.Pid) {
		t.Fatalf("Find while the stand-in holds the state directory: %+v, %v", o, ok)
	}
	if got, want := o.String(), fmt.Sprintf("pid %d, listening on 127.0.0.1:5999", o.Pid); got != want {
		t.Errorf("String: %q", got)
	}

	// Forged: the live holder's record with another start time, another user.
	for name, forge := range map[string]func(*Owner){
		"another start time": func(o *Owner) { o.Start++ },
		"another user":       func(o *Owner) { o.UID = 65534 },
	} {
		f := o
		forge(&f)
		b, _ := json.Marshal(f)
		if err := os.WriteFile(RecordPath(lay), b, 0o644); err != nil {
			t.Fatal(err)
		}
		if got, ok := Find(lay); ok {
			t.Errorf("%s: Find trusted %+v", name, got)
		}
	}
	b, _ := json.Marshal(o)
	if err := os.WriteFile(RecordPath(lay), b, 0o644); err != nil {
		t.Fatal(err)
	}

	// kill -9: the record stays, the lock goes with the process.
	_ = cmd.Process.Kill()
	_ = cmd.Wait()
	if _, err := os.Stat(RecordPath(lay)); err != nil {
		t.Fatalf("the record went with the killed stand-in: %v", err)
	}
	if got, ok := Find(lay); ok {
		t.Errorf("Find trusted a killed serve's record: %+v", got)
	}
	// Its pid alive again (ours: this test process), the lock held: the start time tells.
	l, err := flock.TryExclusive(LockPath(lay))
	if err != nil {
		t.Fatal(err)
	}
	defer l.Unlock()
	o.Pid = os.Getpid()
	b, _ = json.Marshal(o)
	if err := os.WriteFile(RecordPath(lay), b, 0o644); err != nil {
		t.Fatal(err)
	}
	if got, ok := Find(lay); ok {
		t.Errorf("Find trusted a record whose pid is another process now: %+v", got)
	}
	if err := Record(lay, "127.0.0.1:6000"); err != nil {
		t.Fatal(err)
	}
	if got, ok := Find(lay); !ok || got.Pid != os.Getpid() {
		t.Errorf("Find of this process's own record while it holds the lock: %+v, %v", got, ok)
	}
	if err := Remove(lay); err != nil {
		t.Fatal(err)
	}
	if _, ok := Find(lay); ok {
		t.Error("an owner after Remove")
	}
}
