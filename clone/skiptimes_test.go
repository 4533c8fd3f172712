package clone

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// TestSkipTimes: a copy keeps its source's modification times (files,
// directories, the root), unless SkipTimes asks to leave them as the copy
// made them; the content is copied either way.
func TestSkipTimes(t *testing.T) {
	for _, fc := range filesystems {
		t.Run(fc.name, func(t *testing.T) {
			dir := fc.dir(t)
			src := filepath.Join(dir, "src")
			old := time.Date(2001, 2, 3, 4, 5, 6, 0, time.UTC)
			files := []string{"a", "sub/b", "sub/deeper/c"}
			for _, f := range files {
				p := filepath.Join(src, f)
				if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
					t.Fatal(err)
				}
				if err := os.WriteFile(p, []byte("content of "+f), 0o600); err != nil {
					t.Fatal(err)
				}
			}
			paths := []string{".", "sub", "sub/deeper", "a", "sub/b", "sub/deeper/c"}
			for i := len(paths) - 1; i >= 0; i-- { // children first: a parent's mtime sticks
				if err := os.Chtimes(filepath.Join(src, paths[i]), old, old); err != nil {
					t.Fatal(err)
				}
			}
			for _, skip := range []bool{false, true} {
				dst := filepath.Join(dir, "dst-"+map[bool]string{false: "times", true: "skip"}[skip])
				start := time.Now().Add(-time.Minute)
				if _, err := Copy(context.Background(), src, dst, Options{Sync: SyncNone, SkipTimes: skip}); err != nil {
					t.Fatal(err)
				}
				for _, p := range paths {
					fi, err := os.Stat(filepath.Join(dst, p))
					if err != nil {
						t.Fatal(err)
					}
					if skip && fi.ModTime().Before(start) {
						t.Errorf("SkipTimes: %s has the source's time %s", p, fi.ModTime())
					}
					if !skip && !fi.ModTime().Equal(old) {
						t.Errorf("%s has time %s, want the source's %s", p, fi.ModTime(), old)
					}
				}
				for _, f := range files {
					if b, err := os.ReadFile(filepath.Join(dst, f)); err != nil || string(b) != "content of "+f {
						t.Errorf("%s copied as %q, %v", f, b, err)
					}
				}
			}
		})
	}
}
