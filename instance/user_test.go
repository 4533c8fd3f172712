package instance

import (
	"os"
	"path/filepath"
	"syscall"
	"testing"
)

// TestMkdirOwnedRefusesSymlink plants a symlink to a root-only directory
// where MkdirOwned is to make a directory for the run-as user (as that
// user could): the target's mode and owner must stay as they were.
func TestMkdirOwnedRefusesSymlink(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("changing owners needs root")
	}
	base := t.TempDir()
	secret := filepath.Join(base, "secret")
	if err := os.Mkdir(secret, 0o700); err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(base, "run")
	if err := os.Symlink(secret, dir); err != nil {
		t.Fatal(err)
	}
	u := &OSUser{UID: 4242, GID: 4243}
	if err := u.MkdirOwned(dir, 0o755); err == nil {
		t.Error("MkdirOwned accepted a symlink")
	}
	fi, err := os.Stat(secret)
	if err != nil {
		t.Fatal(err)
	}
	if st := fi.Sys().(*syscall.Stat_t); st.Uid != 0 || fi.Mode().Perm() != 0o700 {
		t.Fatalf("the symlink's target was changed: uid %d mode %v", st.Uid, fi.Mode().Perm())
	}
}
