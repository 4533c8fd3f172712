package flock

import (
	"context"
	"errors"
	"path/filepath"
	"testing"
	"time"
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
