package pgbackup

import (
	"context"
	"errors"
	"os"
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
