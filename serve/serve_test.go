package serve_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/pgfork/pgfork/clone"
	"github.com/pgfork/pgfork/instance"
	"github.com/pgfork/pgfork/internal/errs"
	"github.com/pgfork/pgfork/internal/pgtest"
	"github.com/pgfork/pgfork/internal/statedir"
	"github.com/pgfork/pgfork/internal/testenv"
	"github.com/pgfork/pgfork/pgbin"
	"github.com/pgfork/pgfork/pgdata"
	"github.com/pgfork/pgfork/pool"
	"github.com/pgfork/pgfork/serve"
	"github.com/pgfork/pgfork/server/managed"
)

func managedOptions(t testing.TB, root string) serve.ManagedOptions {
	t.Helper()
	pg, err := pgbin.Find(pgbin.Options{Explicit: testenv.PGBinDirs(t)[0]}, 0)
	if err != nil {
		t.Fatal(err)
	}
	u := pgtest.User(t)
	return serve.ManagedOptions{Manager: pool.ManagerConfig{Prefix: "pfsv", Max: 4, Parallel: 2},
		Layout: statedir.Layout{Root: root}, PG: pg, User: u}
}

func running(data string) bool {
	_, err := instance.Attach(data)
	return err == nil
}

// TestManagedClosedOnEveryPath: the managed server NewManaged starts is
// stopped by Close, and also when the constructor fails after starting it
// (here: the manager refuses its configuration), so no exit path of
// `pgfork serve` leaves it running.
func TestManagedClosedOnEveryPath(t *testing.T) {
	root := testenv.Dir(t)
	ctx := context.Background()

	o := managedOptions(t, root)
	data := filepath.Join(managed.Dir(filepath.Join(root, "serve"), o.PG.Major), "pgdata")
	b, err := serve.NewManaged(ctx, o)
	if err != nil {
		t.Fatal(err)
	}
	if !running(data) {
		t.Fatal("the managed server does not run after NewManaged")
	}
	if b.Owner == "" || b.Conn.Port == 0 || b.Manager == nil {
		t.Fatalf("backend = %+v, want an owner, a port and a manager", b)
	}
	if _, err := b.Manager.InitializeTemplate(ctx, "closepath"); err != nil {
		t.Fatal(err)
	}
	cctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	if err := b.Close(cctx); err != nil {
		t.Fatalf("Close: %v", err)
	}
	if running(data) {
		t.Fatal("the managed server still runs after Close")
	}
	if err := b.Close(cctx); err != nil {
		t.Fatalf("second Close: %v", err)
	}

	// A failure after the server started stops it too.
	bad := managedOptions(t, root)
	bad.Manager.Prefix = "Not A Prefix"
	if _, err := serve.NewManaged(ctx, bad); errs.KindOf(err) != errs.Usage {
		t.Fatalf("NewManaged with a bad prefix: %v, want a usage error", err)
	}
	if running(data) {
		t.Fatal("the managed server still runs after NewManaged failed")
	}
}

// TestExternalUnreachable: an external server that does not answer is an
// error naming the connection, and nothing is left open.
func TestExternalUnreachable(t *testing.T) {
	conn, err := serve.ParseConn("postgres://someone:pw@127.0.0.1:1/postgres?connect_timeout=5")
	if err != nil {
		t.Fatal(err)
	}
	if conn.Username != "someone" || conn.Port != 1 || conn.Password != "pw" {
		t.Fatalf("ParseConn = %+v", conn)
	}
	_, err = serve.NewExternal(context.Background(), serve.ExternalOptions{
		Manager: pool.ManagerConfig{Prefix: "pfsv"}, AdminURL: "postgres://someone:pw@127.0.0.1:1/postgres?connect_timeout=5", Conn: conn})
	if err == nil {
		t.Fatal("NewExternal of an unreachable server succeeded")
	}
	if _, err := serve.ParseConn("postgres://[bad"); errs.KindOf(err) != errs.Usage {
		t.Fatalf("ParseConn of a bad URL: %v, want a usage error", err)
	}
}

// TestManagedEveryMajor: one state directory serves any major (issue 33):
// the managed cluster of the layout before per-major directories
// (serve/pgdata) is moved to its major's directory with its templates, a
// second major starts a cluster of its own beside it (it used to start the
// first major's data directory and fail on its settings), and the first
// major finds its template again.
func TestManagedEveryMajor(t *testing.T) {
	dirs := testenv.RequireMajors(t, 2)
	root := testenv.Dir(t)
	ctx := context.Background()
	open := func(bin string) (*serve.Backend, serve.ManagedOptions) {
		t.Helper()
		o := managedOptions(t, root)
		pg, err := pgbin.Find(pgbin.Options{Explicit: bin}, 0)
		if err != nil {
			t.Fatal(err)
		}
		o.PG = pg
		b, err := serve.NewManaged(ctx, o)
		if err != nil {
			t.Fatalf("NewManaged(%s): %v", pg, err)
		}
		return b, o
	}
	closeB := func(b *serve.Backend) {
		t.Helper()
		cctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
		defer cancel()
		if err := b.Close(cctx); err != nil {
			t.Fatal(err)
		}
	}
	first, o1 := open(dirs[0])
	if _, err := first.Manager.InitializeTemplate(ctx, "kept"); err != nil {
		t.Fatal(err)
	}
	if err := first.Manager.FinalizeTemplate(ctx, "kept"); err != nil {
		t.Fatal(err)
	}
	closeB(first)
	// Back to the old layout: serve/pgdata and serve/password.
	base := filepath.Join(root, "serve")
	own := managed.Dir(base, o1.PG.Major)
	for _, n := range []string{"pgdata", "password"} {
		if err := os.Rename(filepath.Join(own, n), filepath.Join(base, n)); err != nil {
			t.Fatal(err)
		}
	}
	// The old layout had no record of the port either (server/managed's port file).
	if err := os.Remove(filepath.Join(own, "port")); err != nil && !errors.Is(err, os.ErrNotExist) {
		t.Fatal(err)
	}
	if err := os.Remove(own); err != nil {
		t.Fatal(err)
	}
	second, o2 := open(dirs[len(dirs)-1])
	if o2.PG.Major == o1.PG.Major {
		t.Fatalf("PGFORK_TEST_PG_BINS gives one major (%d) twice", o1.PG.Major)
	}
	if _, err := os.Stat(filepath.Join(base, "pgdata")); err == nil {
		t.Error("the old layout's serve/pgdata is still there")
	}
	if v, err := pgdata.Version(filepath.Join(managed.Dir(base, o2.PG.Major), "pgdata")); err != nil || v != o2.PG.Major {
		t.Errorf("the second major's cluster: version %d (%v), want %d", v, err, o2.PG.Major)
	}
	closeB(second)
	again, _ := open(dirs[0])
	defer closeB(again)
	if _, err := again.Manager.GetTestDatabase(ctx, "kept"); err != nil {
		t.Fatalf("the first major's template after the move and the other major: %v", err)
	}
}

// TestManagedSizesPoolsFromFilesystem (issue 33): with the state on a
// reflink filesystem and PostgreSQL 18 (test databases are clones) the
// pools not sized by the user get the clone defaults; a size the user
// gave stays.
func TestManagedSizesPoolsFromFilesystem(t *testing.T) {
	dirs := testenv.RequireMajors(t, 2)
	root := filepath.Join(testenv.XFSDir(t), "state")
	ctx := context.Background()
	o := managedOptions(t, root)
	pg, err := pgbin.Find(pgbin.Options{Explicit: dirs[len(dirs)-1]}, 0)
	if err != nil {
		t.Fatal(err)
	}
	if pg.Major < 18 {
		t.Skipf("the last PostgreSQL of the test environment is %d: no clone", pg.Major)
	}
	o.PG = pg
	o.Manager.Max, o.Manager.Initial, o.Manager.Parallel = 8, 2, 2
	o.DB.Given = &pool.Given{Parallel: true}
	o.Manager.Parallel = 1
	b, err := serve.NewManaged(ctx, o)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close(ctx)
	t.Log(b.Sized)
	want := pool.DefaultSizes(true, runtime.NumCPU())
	if !strings.Contains(b.Sized, "clones") || !strings.Contains(b.Sized, fmt.Sprintf("at most %d (%d for the demand a run took), 1 created at once", want.Max, want.Learned)) {
		t.Fatalf("sized %q, want clone defaults %+v with the given parallel 1", b.Sized, want)
	}
	if _, err := b.Manager.InitializeTemplate(ctx, "sized"); err != nil {
		t.Fatal(err)
	}
	if err := b.Manager.FinalizeTemplate(ctx, "sized"); err != nil {
		t.Fatal(err)
	}
	ts, _ := b.Manager.Stats()
	if len(ts) != 1 || ts[0].Pool.Max != want.Learned {
		t.Fatalf("pool stats %+v, want max %d (a learned demand's)", ts, want.Learned)
	}
}

// TestManagedSizesFullCopiesByDisk (issue 33): with test databases that
// are full copies (the managed server on ext4), a pool's maximum not given
// by the user is how many copies of its template fit in a quarter of the
// free space of the data directory, within 4 to 256 per core; a maximum
// the user gave stays.
func TestManagedSizesFullCopiesByDisk(t *testing.T) {
	ctx := context.Background()
	for _, given := range []bool{false, true} {
		o := managedOptions(t, testenv.Dir(t))
		o.DB.Given = &pool.Given{Max: given}
		b, err := serve.NewManaged(ctx, o)
		if err != nil {
			t.Fatal(err)
		}
		t.Log(b.Sized)
		if strings.Contains(b.Sized, "clones") || strings.Contains(b.Sized, "by the template's size") == given {
			b.Close(ctx)
			t.Fatalf("max given %v: sized %q", given, b.Sized)
		}
		if _, err := b.Manager.InitializeTemplate(ctx, "disk"); err != nil {
			t.Fatal(err)
		}
		if err := b.Manager.FinalizeTemplate(ctx, "disk"); err != nil {
			t.Fatal(err)
		}
		// An empty template (created from template0) takes 7–8 MB.
		data := filepath.Join(managed.Dir(filepath.Join(o.Layout.Root, "serve"), o.PG.Major), "pgdata")
		free, err := clone.FreeBytes(data)
		if err != nil {
			t.Fatal(err)
		}
		lo, hi := pool.SpaceMax(free, 16<<20, runtime.NumCPU()), pool.SpaceMax(free, 5<<20, runtime.NumCPU())
		if given {
			lo, hi = o.Manager.Max, o.Manager.Max
		}
		ts, _ := b.Manager.Stats()
		b.Close(ctx)
		if len(ts) != 1 || ts[0].Pool.Max < lo || ts[0].Pool.Max > hi {
			t.Fatalf("max given %v: pool stats %+v, want max %d to %d (free %d bytes)", given, ts, lo, hi, free)
		}
	}
}
