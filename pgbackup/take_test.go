package pgbackup

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/pgfork/pgfork/internal/errs"
	"github.com/pgfork/pgfork/internal/flock"
	"github.com/pgfork/pgfork/internal/pgtest"
	"github.com/pgfork/pgfork/internal/testenv"
	"github.com/pgfork/pgfork/pgbin"
)

// TestTakeSafety covers issue 19's backup items against a real server:
// F16 (a symlink planted at every name the partial directory used to get
// for the next seconds must not be written through), F6 (a chain
// directory locked by another backup gives busy at once), F5 (a stale
// partial directory of a killed backup is removed by the next run) and
// F7 (a full destination is no-space, naming the destination).
func TestTakeSafety(t *testing.T) {
	bs := pgtest.Builds(t, 0)
	b := bs[len(bs)-1]
	in := pgtest.New(t, b.Server())
	url := in.ConnString("", "")
	pgb := pgbin.Options{Explicit: b.Bin, StateDir: t.TempDir()}
	base := testenv.Dir(t)

	t.Run("planted partial name", func(t *testing.T) {
		dir := filepath.Join(base, "chain1")
		secret := filepath.Join(base, "root-only")
		if err := os.MkdirAll(dir, 0o777); err != nil {
			t.Fatal(err)
		}
		if err := os.Mkdir(secret, 0o700); err != nil {
			t.Fatal(err)
		}
		now := time.Now().UTC()
		for s := -1; s < 30; s++ {
			name := now.Add(time.Duration(s)*time.Second).Format("20060102T150405Z") + "-full"
			if err := os.Symlink(secret, filepath.Join(dir, "."+name+".partial")); err != nil {
				t.Fatal(err)
			}
		}
		bk, err := Take(context.Background(), TakeOptions{Dir: dir, ConnString: url, PGBin: pgb})
		if err != nil {
			t.Fatal(err)
		}
		if ents, _ := os.ReadDir(secret); len(ents) != 0 {
			t.Fatalf("root wrote %d entries through a planted symlink into %s", len(ents), secret)
		}
		if fi, err := os.Lstat(bk.Dir); err != nil || !fi.IsDir() {
			t.Fatalf("the backup %s is not a directory: %v %v", bk.Dir, fi, err)
		}
	})

	t.Run("locked chain and stale partial", func(t *testing.T) {
		dir := filepath.Join(base, "chain2")
		stale := filepath.Join(dir, ".20260101T000000Z-full"+partialMark+"123")
		if err := os.MkdirAll(filepath.Join(stale, "base"), 0o700); err != nil {
			t.Fatal(err)
		}
		if got := StalePartials(dir); len(got) != 1 || got[0] != filepath.Base(stale) {
			t.Fatalf("StalePartials = %q, want %s", got, filepath.Base(stale))
		}
		release, err := flock.LockDir(dir)
		if err != nil {
			t.Fatal(err)
		}
		_, err = Take(context.Background(), TakeOptions{Dir: dir, ConnString: url, PGBin: pgb})
		release()
		if errs.KindOf(err) != errs.Busy {
			t.Fatalf("backup into a chain directory another backup holds: got %v, want busy", err)
		}
		if _, err := Take(context.Background(), TakeOptions{Dir: dir, ConnString: url, PGBin: pgb}); err != nil {
			t.Fatal(err)
		}
		if _, err := os.Lstat(stale); !errors.Is(err, os.ErrNotExist) {
			t.Fatalf("the stale partial %s of a killed backup was left: %v", stale, err)
		}
	})

	t.Run("full disk", func(t *testing.T) {
		dir := filepath.Join(testenv.SmallFSDir(t), "chain")
		if err := os.MkdirAll(dir, 0o700); err != nil {
			t.Fatal(err)
		}
		var st unix.Statfs_t
		if err := unix.Statfs(dir, &st); err != nil {
			t.Fatal(err)
		}
		fill := int64(st.Bavail)*int64(st.Bsize) - 4<<20
		if fill > 0 {
			f, err := os.Create(filepath.Join(dir, "filler"))
			if err != nil {
				t.Fatal(err)
			}
			_, err = f.Write(make([]byte, fill))
			f.Close()
			if err != nil {
				t.Fatal(err)
			}
		}
		_, err := Take(context.Background(), TakeOptions{Dir: dir, ConnString: url, PGBin: pgb})
		if errs.KindOf(err) != errs.NoSpace || !strings.Contains(errs.HintOf(err), dir) {
			t.Fatalf("backup onto a full filesystem: got %v (hint %q), want no-space naming %s", err, errs.HintOf(err), dir)
		}
	})
}

// TestTakeKilledTakesChildAlong runs Take in a child process, kills it
// with SIGKILL once pg_basebackup has started (a hook holds the child
// there), and checks that pg_basebackup died with it (F5): it must not go
// on to finish a backup into the partial directory nobody will rename.
func TestTakeKilledTakesChildAlong(t *testing.T) {
	if os.Getenv("PGFORK_TAKE_CHILD") != "" {
		afterStart = func(partial string) {
			_ = os.WriteFile(os.Getenv("PGFORK_TAKE_CHILD"), []byte(partial), 0o600)
			select {}
		}
		var o TakeOptions
		o.Dir, o.ConnString, o.PGBin.Explicit, o.PGBin.StateDir = os.Getenv("PGFORK_TAKE_DIR"), os.Getenv("PGFORK_TAKE_URL"), os.Getenv("PGFORK_TAKE_BIN"), t.TempDir()
		_, err := Take(context.Background(), o)
		t.Fatal(err)
	}
	bs := pgtest.Builds(t, 0)
	b := bs[len(bs)-1]
	in := pgtest.New(t, b.Server())
	base := testenv.Dir(t)
	marker := filepath.Join(base, "started")
	cmd := exec.Command(os.Args[0], "-test.run=^TestTakeKilledTakesChildAlong$")
	cmd.Env = append(os.Environ(), "PGFORK_TAKE_CHILD="+marker, "PGFORK_TAKE_DIR="+filepath.Join(base, "chain"),
		"PGFORK_TAKE_URL="+in.ConnString("", ""), "PGFORK_TAKE_BIN="+b.Bin)
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	var partial []byte
	for i := 0; ; i++ {
		var err error
		if partial, err = os.ReadFile(marker); err == nil && len(partial) > 0 {
			break
		}
		if i > 1200 {
			_ = cmd.Process.Kill()
			t.Fatal("the child never started pg_basebackup")
		}
		time.Sleep(50 * time.Millisecond)
	}
	_ = cmd.Process.Kill()
	_ = cmd.Wait()
	// Long enough for an orphaned pg_basebackup to finish (it takes well
	// under a second here).
	time.Sleep(3 * time.Second)
	if _, err := os.Stat(filepath.Join(string(partial), "backup_manifest")); err == nil {
		t.Fatalf("pg_basebackup outlived a killed pgfork backup and finished into %s", partial)
	}
}
