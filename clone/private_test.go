package clone

import (
	"context"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"syscall"
	"testing"
)

// postgresUser is the unprivileged user the tests act as (the hostile
// "postgres" of issue 19).
func postgresUser(t *testing.T) (uid, gid int) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root: the copy is made for another user")
	}
	u, err := user.Lookup("postgres")
	if err != nil {
		t.Skip("no postgres user")
	}
	uid, _ = strconv.Atoi(u.Uid)
	gid, _ = strconv.Atoi(u.Gid)
	return uid, gid
}

// TestCopyStagingPrivateUntilDone (issue 19, F4b): as root copying a tree
// for another user, the staging directory stays root's and 0700 while it
// is filled, so that user cannot replace a directory in it by a symlink to
// a root-only place; the finished copy then belongs to the user with the
// source's mode. Before, every directory was given to the user as it was
// made.
func TestCopyStagingPrivateUntilDone(t *testing.T) {
	uid, gid := postgresUser(t)
	base := t.TempDir()
	src := filepath.Join(base, "src")
	if err := os.MkdirAll(filepath.Join(src, "pg_wal", "archive_status"), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(src, "pg_wal", "000000010000000000000001"), []byte("wal"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(src, 0o750); err != nil {
		t.Fatal(err)
	}
	etc := filepath.Join(base, "etc")
	if err := os.Mkdir(etc, 0o700); err != nil {
		t.Fatal(err)
	}
	parent := filepath.Join(base, "users")
	if err := os.Mkdir(parent, 0o755); err != nil {
		t.Fatal(err)
	}
	defer func() { testHookAfterDirs = nil }()
	swapped := false
	testHookAfterDirs = func(root string) {
		p := filepath.Join(root, "pg_wal")
		cmd := exec.Command("/bin/sh", "-c", "rm -rf '"+p+"' && ln -s '"+etc+"' '"+p+"'")
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}}
		swapped = cmd.Run() == nil
	}
	dst := filepath.Join(parent, "copy")
	if _, err := Copy(context.Background(), src, dst, Options{Owner: &Owner{UID: uid, GID: gid}, Sync: SyncNone}); err != nil {
		t.Fatal(err)
	}
	if swapped {
		t.Error("the user replaced pg_wal in the staging directory while root filled it")
	}
	if ents, _ := os.ReadDir(etc); len(ents) != 0 {
		t.Errorf("root wrote into the root-only directory: %v", ents)
	}
	fi, err := os.Stat(dst)
	if err != nil {
		t.Fatal(err)
	}
	if st := fi.Sys().(*syscall.Stat_t); int(st.Uid) != uid || fi.Mode().Perm() != 0o750 {
		t.Errorf("copy: owner %d mode %v, want %d and the source's 0750", st.Uid, fi.Mode().Perm(), uid)
	}
	if b, err := os.ReadFile(filepath.Join(dst, "pg_wal", "000000010000000000000001")); err != nil || string(b) != "wal" {
		t.Errorf("copied file: %q %v", b, err)
	}
}
