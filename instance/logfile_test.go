package instance_test

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/pgfork/pgfork/instance"
	"github.com/pgfork/pgfork/internal/errs"
	"github.com/pgfork/pgfork/internal/pgtest"
	"github.com/pgfork/pgfork/internal/testenv"
)

// rootOnlyFile makes a 0600 root file in a 0700 root directory, as a
// secret or /etc/ld.so.preload would be, and returns its path.
func rootOnlyFile(t *testing.T) string {
	t.Helper()
	dir := filepath.Join(testenv.Dir(t), "root-only")
	if err := os.Mkdir(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	p := filepath.Join(dir, "secret")
	if err := os.WriteFile(p, []byte("root's\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

func checkUntouched(t *testing.T, p string) {
	t.Helper()
	fi, err := os.Lstat(p)
	if err != nil {
		t.Fatal(err)
	}
	st := fi.Sys().(*syscall.Stat_t)
	if st.Uid != 0 || st.Gid != 0 {
		t.Errorf("%s now belongs to %d:%d (root chowned what a symlink pointed to)", p, st.Uid, st.Gid)
	}
	if b, _ := os.ReadFile(p); string(b) != "root's\n" {
		t.Errorf("%s was written: %q", p, b)
	}
}

// TestOpenAppendAsTheServersUser (issue 19, F20/F20b): the server log is opened
// with the server user's rights, never root's: a log name planted as a
// symlink to a root file, or reached through a directory swapped for a
// symlink into a root-only directory, is refused and the root file keeps
// its owner and content; a FIFO is refused without blocking; a new log
// belongs to the user. Before, root opened the log by path and chowned it.
func TestOpenAppendAsTheServersUser(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: the log is opened for another user")
	}
	u := pgtest.User(t)
	secret := rootOnlyFile(t)
	userDir := filepath.Join(testenv.Dir(t), "user-dir")
	if err := os.Mkdir(userDir, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(userDir, u.UID, u.GID); err != nil {
		t.Fatal(err)
	}

	link := filepath.Join(userDir, "pgfork-server.log")
	if err := os.Symlink(secret, link); err != nil {
		t.Fatal(err)
	}
	if f, err := instance.OpenAppend(link, u); err == nil {
		f.Close()
		t.Error("OpenAppend followed a symlink to a root file")
	}
	checkUntouched(t, secret)

	// A directory on the way swapped for a symlink into a root-only one.
	swapped := filepath.Join(userDir, "sub")
	if err := os.Symlink(filepath.Dir(secret), swapped); err != nil {
		t.Fatal(err)
	}
	if f, err := instance.OpenAppend(filepath.Join(swapped, "secret"), u); err == nil {
		f.Close()
		t.Error("OpenAppend opened a root file through a swapped directory")
	}
	if f, err := instance.OpenAppend(filepath.Join(swapped, "new.log"), u); err == nil {
		f.Close()
		t.Error("OpenAppend created a file in a root-only directory")
	}
	checkUntouched(t, secret)
	if _, err := os.Lstat(filepath.Join(filepath.Dir(secret), "new.log")); err == nil {
		t.Error("a log was created in the root-only directory")
	}

	fifo := filepath.Join(userDir, "fifo.log")
	if err := syscall.Mkfifo(fifo, 0o600); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() {
		f, err := instance.OpenAppend(fifo, u)
		if err == nil {
			f.Close()
		}
		done <- err
	}()
	select {
	case err := <-done:
		if err == nil {
			t.Error("OpenAppend accepted a FIFO")
		}
	case <-time.After(testenv.WaitTimeout): // a block is for ever: any deadline tells it, a wait's is no verdict on load
		t.Fatal("OpenAppend blocked on a FIFO")
	}

	ok := filepath.Join(userDir, "server.log")
	f, err := instance.OpenAppend(ok, u)
	if err != nil {
		t.Fatal(err)
	}
	f.Close()
	fi, _ := os.Stat(ok)
	if st := fi.Sys().(*syscall.Stat_t); int(st.Uid) != u.UID || fi.Mode().Perm() != 0o600 {
		t.Errorf("new log: owner %d mode %v, want %d and 0600", st.Uid, fi.Mode().Perm(), u.UID)
	}
}

// TestStartRefusesPlantedLog: instance.Start (every server pgfork runs:
// serve's managed cluster, branches, up) refuses a server log that the
// server's user planted as a symlink to a root file, and leaves the file
// as it was.
func TestStartRefusesPlantedLog(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root")
	}
	bin := testenv.PGBinDirs(t)[0]
	data, u := newCluster(t, bin)
	secret := rootOnlyFile(t)
	if err := os.Symlink(secret, filepath.Join(data, instance.LogFileName)); err != nil {
		t.Fatal(err)
	}
	inst, err := instance.Start(context.Background(), instance.Config{BinDir: bin, DataDir: data, User: u, Profile: instance.Test})
	if err == nil {
		_ = inst.Stop(context.Background(), instance.Fast)
		t.Fatal("Start used a server log planted as a symlink to a root file")
	}
	// The refusal says what it is (issue 32, F11): before, it blamed the
	// directory ("postgres cannot write the server log's directory").
	msg := err.Error() + " " + errs.HintOf(err)
	if !strings.Contains(msg, "symbolic link") || !strings.Contains(msg, instance.LogFileName) || !strings.Contains(msg, "remove") ||
		strings.Contains(msg, "cannot write the server log's directory") {
		t.Errorf("Start's refusal of a planted log link: %q; want it to name the link and say to remove it", msg)
	}
	checkUntouched(t, secret)
}

// TestWriteFileAsRefusesPlantedLinks: the configuration files root writes
// into a data directory the server's user owns (pg_hba.conf: serve's
// managed cluster, cluster isolation, up --tcp, upgrade) are written with
// that user's rights: a pg_hba.conf replaced by a symlink to a root file
// is refused and the root file kept whole. Before, root truncated and
// rewrote the link's target and then chowned it to the user.
func TestWriteFileAsRefusesPlantedLinks(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root")
	}
	u := pgtest.User(t)
	secret := rootOnlyFile(t)
	data := filepath.Join(testenv.Dir(t), "data")
	if err := os.Mkdir(data, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(data, u.UID, u.GID); err != nil {
		t.Fatal(err)
	}
	hba := filepath.Join(data, "pg_hba.conf")
	if err := os.Symlink(secret, hba); err != nil {
		t.Fatal(err)
	}
	if err := instance.WritePasswordHBA(data, u); err == nil {
		t.Error("WritePasswordHBA wrote through a symlink")
	}
	checkUntouched(t, secret)
	if err := os.Remove(hba); err != nil {
		t.Fatal(err)
	}
	if err := instance.WritePasswordHBA(data, u); err != nil {
		t.Fatal(err)
	}
	fi, err := os.Stat(hba)
	if err != nil {
		t.Fatal(err)
	}
	if st := fi.Sys().(*syscall.Stat_t); int(st.Uid) != u.UID {
		t.Errorf("pg_hba.conf belongs to %d, want %d", st.Uid, u.UID)
	}
	if b, _ := os.ReadFile(hba); string(b) != instance.PasswordHBA {
		t.Errorf("pg_hba.conf = %q", b)
	}
}
