package server

import (
	"net"
	"os"
	"path/filepath"
	"testing"

	"github.com/pgfork/pgfork/internal/errs"
)

// TestListenUnixRemovesOnlyStaleSockets (issue 19, F14): --socket PATH used
// to delete whatever was at PATH. Now a regular file, a directory and a
// symlink are refused and left as they were, a live socket is busy, and
// only a stale socket is replaced.
func TestListenUnixRemovesOnlyStaleSockets(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "passwd")
	if err := os.WriteFile(file, []byte("root:x:0:0\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	sub := filepath.Join(dir, "empty-dir")
	if err := os.Mkdir(sub, 0o755); err != nil {
		t.Fatal(err)
	}
	link := filepath.Join(dir, "link")
	if err := os.Symlink(file, link); err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{file, sub, link} {
		if l, err := ListenUnix(p); err == nil {
			l.Close()
			t.Errorf("ListenUnix(%s) replaced what was there", p)
		} else if errs.KindOf(err) != errs.Exists {
			t.Errorf("ListenUnix(%s) = %v, want an exists error", p, err)
		}
	}
	if b, err := os.ReadFile(file); err != nil || string(b) != "root:x:0:0\n" {
		t.Errorf("the file was changed: %q %v", b, err)
	}
	if fi, err := os.Lstat(sub); err != nil || !fi.IsDir() {
		t.Errorf("the directory was removed: %v", err)
	}

	live := filepath.Join(dir, "live.sock")
	ll, err := net.Listen("unix", live)
	if err != nil {
		t.Fatal(err)
	}
	defer ll.Close()
	if l, err := ListenUnix(live); err == nil || errs.KindOf(err) != errs.Busy {
		if l != nil {
			l.Close()
		}
		t.Errorf("ListenUnix on a live socket = %v, want busy", err)
	}

	stale := filepath.Join(dir, "stale.sock")
	sl, err := net.ListenUnix("unix", &net.UnixAddr{Name: stale, Net: "unix"})
	if err != nil {
		t.Fatal(err)
	}
	sl.SetUnlinkOnClose(false)
	sl.Close()
	l, err := ListenUnix(stale)
	if err != nil {
		t.Fatalf("ListenUnix on a stale socket: %v", err)
	}
	defer l.Close()
	if fi, err := os.Stat(stale); err != nil || fi.Mode().Perm() != 0o600 {
		t.Errorf("socket mode %v, %v; want 0600", fi.Mode().Perm(), err)
	}
}
