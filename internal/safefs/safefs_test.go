package safefs

import (
	"errors"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/pgfork/pgfork/internal/testenv"
)

func TestOpenRefusesSymlinksAnywhere(t *testing.T) {
	base := t.TempDir()
	root := filepath.Join(base, "backup")
	outside := filepath.Join(base, "outside")
	for _, d := range []string{filepath.Join(root, "base", "1"), outside} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	write := func(p, s string) {
		if err := os.WriteFile(p, []byte(s), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	write(filepath.Join(root, "base", "1", "2227"), "mine")
	write(filepath.Join(outside, "secret"), "secret")
	must := func(err error) {
		if err != nil {
			t.Fatal(err)
		}
	}
	must(os.Symlink(filepath.Join(outside, "secret"), filepath.Join(root, "base", "1", "2228")))
	must(os.Symlink("2227", filepath.Join(root, "base", "1", "inside-link")))
	must(os.Symlink(outside, filepath.Join(root, "linked-dir")))
	must(syscall.Mkfifo(filepath.Join(root, "fifo"), 0o600))

	d, err := OpenDir(root)
	must(err)
	defer d.Close()
	f, err := d.OpenRegular("base/1/2227")
	must(err)
	f.Close()
	for _, rel := range []string{"base/1/2228", "base/1/inside-link", "linked-dir/secret"} {
		if f, err := d.Open(rel); !errors.Is(err, ErrSymlink) {
			if f != nil {
				f.Close()
			}
			t.Errorf("Open(%s) = %v, want ErrSymlink", rel, err)
		}
	}
	for _, rel := range []string{"../outside/secret", "/etc/passwd", ""} {
		if _, err := d.Open(rel); err == nil {
			t.Errorf("Open(%q) succeeded", rel)
		}
	}
	done := make(chan error, 1)
	go func() { _, err := d.OpenRegular("fifo"); done <- err }()
	select {
	case err := <-done:
		if !errors.Is(err, ErrNotRegular) {
			t.Errorf("OpenRegular(fifo) = %v, want ErrNotRegular", err)
		}
	case <-time.After(testenv.WaitTimeout): // a block is for ever: a wait's deadline tells it, not the load
		t.Fatal("OpenRegular blocked on a FIFO")
	}
	if _, err := d.OpenRegular("base"); !errors.Is(err, ErrNotRegular) {
		t.Errorf("OpenRegular(dir) = %v", err)
	}
	write(filepath.Join(root, "big"), "0123456789")
	if _, err := d.ReadFile("big", 5); !errors.Is(err, ErrTooLarge) {
		t.Errorf("ReadFile over the limit = %v, want ErrTooLarge", err)
	}
	if b, err := d.ReadFile("big", 10); err != nil || string(b) != "0123456789" {
		t.Errorf("ReadFile = %q, %v", b, err)
	}
}

// TestWalkSkipsLinksAndFIFOs: Walk sees the regular files and directories
// below the root, never what a symlink (to a file or a directory) points
// to, never blocks on a FIFO, and Sub refuses a symlinked directory.
func TestWalkSkipsLinksAndFIFOs(t *testing.T) {
	base := t.TempDir()
	root := filepath.Join(base, "data")
	outside := filepath.Join(base, "outside")
	for _, d := range []string{filepath.Join(root, "base", "1"), outside} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(os.WriteFile(filepath.Join(root, "base", "1", "2227"), []byte("mine"), 0o600))
	must(os.WriteFile(filepath.Join(outside, "secret"), []byte("secret"), 0o600))
	must(os.Symlink(filepath.Join(outside, "secret"), filepath.Join(root, "base", "1", "2228")))
	must(os.Symlink(outside, filepath.Join(root, "linked-dir")))
	must(syscall.Mkfifo(filepath.Join(root, "base", "fifo"), 0o600))

	d, err := OpenDir(root)
	must(err)
	defer d.Close()
	var seen []string
	done := make(chan error, 1)
	go func() {
		done <- d.Walk(func(rel string, f *os.File, fi os.FileInfo) error {
			seen = append(seen, rel)
			return nil
		})
	}()
	select {
	case err := <-done:
		must(err)
	case <-time.After(testenv.WaitTimeout):
		t.Fatal("Walk blocked")
	}
	want := map[string]bool{"base": true, "base/1": true, "base/1/2227": true}
	if len(seen) != len(want) {
		t.Errorf("walked %v, want the entries of %v", seen, want)
	}
	for _, s := range seen {
		if !want[s] {
			t.Errorf("walked %q", s)
		}
	}
	if _, err := d.Sub("linked-dir"); !errors.Is(err, ErrSymlink) {
		t.Errorf("Sub of a symlinked directory: %v, want ErrSymlink", err)
	}
}
