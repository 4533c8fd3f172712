package flock

import (
	"context"
	"errors"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

func TestExclusiveAndShared(t *testing.T) {
	p := filepath.Join(t.TempDir(), "x.lock")
	a, err := TryShared(p)
	if err != nil {
		t.Fatal(err)
	}
	b, err := TryShared(p)
	if err != nil {
		t.Fatal("two shared locks must coexist:", err)
	}
	if _, err := TryExclusive(p); !errors.Is(err, ErrBusy) {
		t.Fatalf("exclusive under shared: %v, want ErrBusy", err)
	}
	a.Unlock()
	b.Unlock()
	b.Unlock() // twice is fine
	ex, err := TryExclusive(p)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	if _, err := Shared(ctx, p); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("wait under exclusive: %v, want deadline", err)
	}
	ex.Unlock()
}

// A waiter whose lock file is removed by the holder must not believe it
// holds the lock alongside a process that locked the new file.
func TestRemoveWhileWaiting(t *testing.T) {
	p := filepath.Join(t.TempDir(), "x.lock")
	holder, err := TryExclusive(p)
	if err != nil {
		t.Fatal(err)
	}
	got := make(chan *Lock)
	go func() {
		l, err := Exclusive(context.Background(), p)
		if err != nil {
			t.Error(err)
		}
		got <- l
	}()
	time.Sleep(20 * time.Millisecond)
	// The holder removes the file; a third party then locks the new file.
	holder.Remove()
	third, err := TryExclusive(p)
	if err == nil {
		select {
		case l := <-got:
			t.Fatalf("waiter got a lock (%v) while another process holds the new file", l)
		case <-time.After(100 * time.Millisecond):
		}
		third.Unlock()
	}
	(<-got).Unlock()
}

// Held sees a shared lock of anyone, and no lock once it is gone; a
// missing file is not held.
func TestHeld(t *testing.T) {
	p := filepath.Join(t.TempDir(), "lease")
	if held, err := Held(p); held || err != nil {
		t.Fatalf("missing file: held %v, %v", held, err)
	}
	l, err := TryShared(p)
	if err != nil {
		t.Fatal(err)
	}
	if held, err := Held(p); !held || err != nil {
		t.Fatalf("under a shared lock: held %v, %v", held, err)
	}
	// Asking takes no lock that stays: another shared lock still comes.
	l2, err := TryShared(p)
	if err != nil {
		t.Fatal("a shared lock after Held:", err)
	}
	l.Unlock()
	if held, _ := Held(p); !held {
		t.Fatal("the second shared lock is not seen")
	}
	l2.Unlock()
	if held, err := Held(p); held || err != nil {
		t.Fatalf("after unlock: held %v, %v", held, err)
	}
}

// CloseInherited closes every descriptor of this process on the file (as
// a child's inherited copies of its starter's lock), and those only: the
// lock they held goes with them.
func TestCloseInherited(t *testing.T) {
	dir := t.TempDir()
	p := filepath.Join(dir, "lease")
	l, err := TryShared(p)
	if err != nil {
		t.Fatal(err)
	}
	dup, err := unix.Dup(int(l.f.Fd()))
	if err != nil {
		t.Fatal(err)
	}
	other, err := os.Create(filepath.Join(dir, "other"))
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()
	n, err := CloseInherited(p)
	if err != nil || n != 2 {
		t.Fatalf("CloseInherited: %d, %v; want the lock's descriptor and its dup", n, err)
	}
	var st unix.Stat_t
	if err := unix.Fstat(dup, &st); err == nil {
		t.Error("the dup is still open")
	}
	if _, err := other.Stat(); err != nil {
		t.Errorf("another file's descriptor was closed: %v", err)
	}
	if held, _ := Held(p); held {
		t.Error("the lock outlived its descriptors")
	}
	l.f = nil // closed underneath
}

// A JVM holds a lease with FileChannel.lock, a POSIX record lock (fcntl),
// which flock(2) does not see on Linux: Held must see it too. The holder
// is another process (a process never sees its own record locks).
func TestHeldSeesRecordLocks(t *testing.T) {
	py, err := exec.LookPath("python3")
	if err != nil {
		t.Skip("python3 (to hold an fcntl lock in another process) not found:", err)
	}
	p := filepath.Join(t.TempDir(), "lease")
	if err := os.WriteFile(p, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(py, "-c", `import fcntl,sys
f=open(sys.argv[1],'r+'); fcntl.lockf(f, fcntl.LOCK_SH); print('held', flush=True); sys.stdin.read()`, p)
	stdin, _ := cmd.StdinPipe()
	out, _ := cmd.StdoutPipe()
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { stdin.Close(); _ = cmd.Wait() }()
	buf := make([]byte, 5)
	if _, err := io.ReadFull(out, buf); err != nil {
		t.Fatal("the holder did not take its lock:", err)
	}
	if held, err := Held(p); !held || err != nil {
		t.Fatalf("Held under another process's fcntl read lock = %v, %v; want true", held, err)
	}
	stdin.Close()
	_ = cmd.Wait()
	if held, err := Held(p); held || err != nil {
		t.Fatalf("Held after the holder exited = %v, %v; want false", held, err)
	}
}

// TestUnlockReleasesInheritedCopies: a child that holds a copy of the
// lock's descriptor (as one forked by another goroutine does until it
// execs) does not keep the lock past Unlock: right after, another
// TryExclusive takes it.
func TestUnlockReleasesInheritedCopies(t *testing.T) {
	p := filepath.Join(t.TempDir(), "lock")
	l, err := TryExclusive(p)
	if err != nil {
		t.Fatal(err)
	}
	child := exec.Command("sleep", "30")
	child.ExtraFiles = []*os.File{l.f}
	if err := child.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = child.Process.Kill(); _ = child.Wait() })
	l.Unlock()
	l2, err := TryExclusive(p)
	if err != nil {
		t.Fatalf("TryExclusive after Unlock, while a child holds a copy of the descriptor: %v", err)
	}
	l2.Unlock()
}
