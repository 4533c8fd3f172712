package proc

import (
	"bufio"
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// TestBackgroundLowersEveryThread: after Background, every thread of the
// process — those that existed and those made later — runs at nice 19 with
// the lowest I/O priority (lowering only the calling thread left most of a Go
// program's threads, and so most of its work, at full priority). It runs
// in a child process, so that this test binary keeps its priority.
func TestBackgroundLowersEveryThread(t *testing.T) {
	cmd := exec.Command(os.Args[0], "-test.run=^TestBackgroundChild$", "-test.v")
	cmd.Env = append(os.Environ(), "PGFORK_PROC_BACKGROUND_CHILD=1")
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("child: %v\n%s", err, out)
	}
	if !strings.Contains(string(out), "threads lowered:") {
		t.Fatalf("child did not report:\n%s", out)
	}
	t.Logf("%s", out)
}

func TestBackgroundChild(t *testing.T) {
	if os.Getenv("PGFORK_PROC_BACKGROUND_CHILD") == "" {
		return // run by TestBackgroundLowersEveryThread only
	}
	// Some threads before, some after.
	hold := func(n int) func() {
		var wg sync.WaitGroup
		stop := make(chan struct{})
		for range n {
			wg.Add(1)
			ready := make(chan struct{})
			go func() {
				defer wg.Done()
				runtime.LockOSThread()
				close(ready)
				<-stop
			}()
			<-ready
		}
		return func() { close(stop); wg.Wait() }
	}
	release := hold(3)
	defer release()
	if err := Background(); err != nil {
		t.Fatal(err)
	}
	release2 := hold(3)
	defer release2()
	ents, err := os.ReadDir("/proc/self/task")
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range ents {
		tid, _ := strconv.Atoi(e.Name())
		checkLowered(t, "/proc/self/task/"+e.Name(), tid)
	}
	t.Logf("threads lowered: %d", len(ents))
}

// checkLowered fails t unless the thread or process at dir (/proc/PID or
// /proc/self/task/TID) runs at Background's nice and I/O priority.
func checkLowered(t *testing.T, dir string, tid int) {
	t.Helper()
	b, err := os.ReadFile(dir + "/stat")
	if err != nil {
		t.Fatal(err)
	}
	f := strings.Fields(string(b[strings.LastIndexByte(string(b), ')')+2:]))
	nice := f[16] // field 19 of stat, counted after the comm
	prio, _, e1 := unix.Syscall(unix.SYS_IOPRIO_GET, ioprioWhoProcess, uintptr(tid), 0)
	if e1 != 0 {
		t.Fatalf("ioprio_get %d: %v", tid, e1)
	}
	if nice != strconv.Itoa(BackgroundNice) || prio != backgroundIOPrio {
		t.Errorf("%s: nice %s, I/O priority %#x; want nice %d, %#x (best effort, lowest)", dir, nice, prio, BackgroundNice, backgroundIOPrio)
	}
}

// TestLowerTree: a child lowered by LowerTree runs at background priority,
// and so do the processes it had started before and those it starts after;
// pgfork itself keeps its priority.
func TestLowerTree(t *testing.T) {
	cmd := exec.Command("sh", "-c", "sleep 60 & read x; sleep 60 & echo started; wait")
	in, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	pid := cmd.Process.Pid
	t.Cleanup(func() {
		for _, c := range children(pid) {
			_ = unix.Kill(c, unix.SIGKILL)
		}
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	})
	for i := 0; len(children(pid)) == 0; i++ {
		if i > 5000 {
			t.Fatal("the shell started no child")
		}
		time.Sleep(time.Millisecond)
	}
	if err := LowerTree(pid); err != nil {
		t.Fatal(err)
	}
	if _, err := in.Write([]byte("go\n")); err != nil {
		t.Fatal(err)
	}
	if _, err := bufio.NewReader(out).ReadString('\n'); err != nil {
		t.Fatal(err)
	}
	kids := children(pid)
	if len(kids) != 2 {
		t.Fatalf("children of the shell: %v, want 2", kids)
	}
	for _, p := range append(kids, pid) {
		checkLowered(t, "/proc/"+strconv.Itoa(p), p)
	}
	if n, err := unix.Getpriority(unix.PRIO_PROCESS, 0); err != nil || 20-n == BackgroundNice {
		t.Errorf("the test process itself was lowered (getpriority %d, %v)", n, err)
	}
	if err := LowerTree(-1); err == nil {
		t.Error("LowerTree(-1) did not refuse")
	}
}
