package fsutil_test

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"syscall"
	"testing"

	"github.com/pgfork/pgfork/internal/fsutil"
	"github.com/pgfork/pgfork/internal/testenv"
)

func TestWriteFileAtomic(t *testing.T) {
	for _, dir := range []string{testenv.Dir(t), testenv.XFSDir(t), testenv.TmpfsDir(t)} {
		p := filepath.Join(dir, "state.json")
		for _, content := range []string{"first\n", "second, longer\n", ""} {
			if err := fsutil.WriteFileAtomic(p, []byte(content), 0o640); err != nil {
				t.Fatal(err)
			}
			b, err := os.ReadFile(p)
			if err != nil || string(b) != content {
				t.Fatalf("%s: %q, %v; want %q", p, b, err, content)
			}
		}
		if fi, _ := os.Stat(p); fi.Mode().Perm() != 0o640 {
			t.Errorf("mode %v, want 0640", fi.Mode().Perm())
		}
		if err := fsutil.ReplaceFile(p, []byte("x"), 0o600); err != nil {
			t.Fatal(err)
		}
		if ents, _ := os.ReadDir(dir); len(ents) != 1 {
			t.Errorf("temporary files left in %s: %v", dir, ents)
		}
		if err := fsutil.SyncDir(dir); err != nil {
			t.Error(err)
		}
		if err := fsutil.SyncFS(dir); err != nil {
			t.Error(err)
		}
	}
}

// TestWriteFileAtomicFailures: errors come back as the OS's (callers
// classify them), the old content stays and no temporary file is left.
func TestWriteFileAtomicFailures(t *testing.T) {
	dir := testenv.Dir(t)
	if err := fsutil.WriteFileAtomic(filepath.Join(dir, "missing", "f"), []byte("x"), 0o644); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("missing directory: %v", err)
	}
	// A directory where the file should go: the rename fails.
	p := filepath.Join(dir, "taken")
	if err := os.MkdirAll(filepath.Join(p, "child"), 0o755); err != nil {
		t.Fatal(err)
	}
	err := fsutil.WriteFileAtomic(p, []byte("x"), 0o644)
	if !errors.Is(err, syscall.EISDIR) && !errors.Is(err, syscall.EEXIST) && !errors.Is(err, syscall.ENOTEMPTY) {
		t.Errorf("directory in the way: %v", err)
	}
	if ents, _ := os.ReadDir(dir); len(ents) != 1 {
		t.Errorf("left behind: %v", ents)
	}
	if err := fsutil.SyncDir(filepath.Join(dir, "nope")); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("SyncDir of a missing directory: %v", err)
	}
}
