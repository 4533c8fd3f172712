package proc

import (
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"
)

func TestValid(t *testing.T) {
	for _, pid := range []int{0, -1, pidMax(), 1 << 31, 1<<32 + os.Getpid(), 1<<32 - 1} {
		if Valid(pid) || Alive(pid) {
			t.Errorf("pid %d accepted", pid)
		}
	}
	if !Valid(os.Getpid()) || !Alive(os.Getpid()) {
		t.Errorf("own pid %d refused", os.Getpid())
	}
}

// TestHandleOutlivesProcess: a handle on a process that exited signals
// nothing (even if its pid were reused) and says it is gone; Inspect sees
// the executable, owner, cwd and start time of a live one.
func TestHandleOutlivesProcess(t *testing.T) {
	dir := t.TempDir()
	cmd := exec.Command("sleep", "30")
	cmd.Dir = dir
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	h, err := Open(cmd.Process.Pid)
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	in, err := Inspect(cmd.Process.Pid)
	if err != nil {
		t.Fatal(err)
	}
	if filepath.Base(in.Exe) != "sleep" || in.UID != os.Geteuid() || !SameFile(in.Cwd, dir) || in.Start != StartTime(cmd.Process.Pid) || in.Start == 0 {
		t.Errorf("inspect: %+v (dir %s)", in, dir)
	}
	if !h.Alive() {
		t.Fatal("live process reported gone")
	}
	if err := h.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	_ = cmd.Wait()
	if h.Alive() {
		t.Error("exited process reported alive")
	}
	if err := h.Signal(syscall.SIGKILL); err != nil {
		t.Errorf("signal to an exited process: %v, want nil", err)
	}
}
