//go:build unix

package clone

import (
	"os"
	"path/filepath"
	"syscall"
	"testing"
)

// TestChownTreeNoFollow gives a tree to another owner while, at a hook
// after a subdirectory was listed, that subdirectory is swapped for a
// symlink to a root-only directory (as the run-as user could): nothing
// outside the tree may change owner, and the tree itself is given away.
func TestChownTreeNoFollow(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("changing owners needs root")
	}
	base := t.TempDir()
	top := filepath.Join(base, "tree")
	secret := filepath.Join(base, "secret")
	for _, d := range []string{filepath.Join(top, "sub"), secret} {
		if err := os.MkdirAll(d, 0o700); err != nil {
			t.Fatal(err)
		}
	}
	for _, f := range []string{filepath.Join(top, "sub", "f"), filepath.Join(secret, "f"), filepath.Join(top, "g")} {
		if err := os.WriteFile(f, []byte("x"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	sub := filepath.Join(top, "sub")
	chownTreeHook = func(dir string) {
		if dir == sub {
			if err := os.Rename(sub, sub+".old"); err != nil {
				t.Error(err)
			}
			if err := os.Symlink(secret, sub); err != nil {
				t.Error(err)
			}
		}
	}
	defer func() { chownTreeHook = nil }()
	const uid, gid = 4242, 4243
	_ = ChownTree(top, uid, gid) // may refuse; must never follow
	owner := func(p string) uint32 {
		fi, err := os.Lstat(p)
		if err != nil {
			t.Fatal(err)
		}
		return fi.Sys().(*syscall.Stat_t).Uid
	}
	for _, p := range []string{secret, filepath.Join(secret, "f")} {
		if owner(p) != 0 {
			t.Errorf("%s outside the tree was given away (uid %d)", p, owner(p))
		}
	}
	if owner(top) != uid || owner(filepath.Join(top, "g")) != uid {
		t.Errorf("the tree itself was not given away")
	}
}
