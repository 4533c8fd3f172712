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

// TestRenameNoReplace: an existing destination, even an empty directory,
// is never replaced.
func TestRenameNoReplace(t *testing.T) {
	for _, dir := range []string{testenv.Dir(t), testenv.XFSDir(t), testenv.TmpfsDir(t)} {
		src, dst := filepath.Join(dir, "src"), filepath.Join(dir, "dst")
		if err := os.Mkdir(src, 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.Mkdir(dst, 0o755); err != nil {
			t.Fatal(err)
		}
		if err := fsutil.RenameNoReplace(src, dst); !errors.Is(err, fs.ErrExist) {
			t.Errorf("%s: onto an empty directory: %v, want ErrExist", dir, err)
		}
		if err := os.Remove(dst); err != nil {
			t.Fatal(err)
		}
		if err := fsutil.RenameNoReplace(src, dst); err != nil {
			t.Errorf("%s: %v", dir, err)
		}
		if _, err := os.Stat(dst); err != nil {
			t.Error(err)
		}
	}
}

// TestRemoveAllReadOnlyTree: a tree with read-only directories is removed.
// (As root the first os.RemoveAll already succeeds; the chmod-and-retry path
// runs as an unprivileged user in cmd/pgfork's TestCopyCLIPermission, which
// checks that a failed copy leaves nothing behind.)
func TestRemoveAllReadOnlyTree(t *testing.T) {
	root := filepath.Join(testenv.Dir(t), "tree")
	if err := os.MkdirAll(filepath.Join(root, "a", "b"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(root, "a", "b", "f"), []byte("x"), 0o444); err != nil {
		t.Fatal(err)
	}
	for _, d := range []string{filepath.Join(root, "a", "b"), filepath.Join(root, "a")} {
		if err := os.Chmod(d, 0o555); err != nil {
			t.Fatal(err)
		}
	}
	if err := fsutil.RemoveAll(root); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Lstat(root); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("still there: %v", err)
	}
}

// TestExchange: two directories swap names in one step, where the
// filesystem can (ext4, XFS, tmpfs, APFS); elsewhere ok is false and
// nothing moved.
func TestExchange(t *testing.T) {
	dir := t.TempDir()
	a, b := filepath.Join(dir, "a"), filepath.Join(dir, "b")
	for _, d := range []string{a, b} {
		if err := os.Mkdir(d, 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(d, "was"), []byte(filepath.Base(d)), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	ok, err := fsutil.Exchange(a, b)
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]string{a: "b", b: "a"}
	if !ok {
		want = map[string]string{a: "a", b: "b"}
		t.Log("no atomic exchange on this filesystem")
	}
	for d, w := range want {
		if got, err := os.ReadFile(filepath.Join(d, "was")); err != nil || string(got) != w {
			t.Errorf("%s holds %q (%v), want %q", d, got, err, w)
		}
	}
	if _, err := fsutil.Exchange(a, filepath.Join(dir, "missing")); err == nil && ok {
		t.Error("Exchange with a missing path succeeded")
	}
}
