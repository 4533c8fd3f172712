package proc

import (
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"testing"

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
		b, err := os.ReadFile("/proc/self/task/" + e.Name() + "/stat")
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
			t.Errorf("thread %d: nice %s, I/O priority %#x; want nice %d, %#x (best effort, lowest)", tid, nice, prio, BackgroundNice, backgroundIOPrio)
		}
	}
	t.Logf("threads lowered: %d", len(ents))
}
