package branches

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/pgfork/pgfork/cluster"
	"github.com/pgfork/pgfork/instance"
	"github.com/pgfork/pgfork/internal/pgtest"
	"github.com/pgfork/pgfork/internal/statedir"
	"github.com/pgfork/pgfork/internal/testenv"
)

// envWith is env on build b.
func envWith(t *testing.T, b pgtest.Build) Options {
	t.Helper()
	dir := testenv.XFSDir(t)
	src := filepath.Join(dir, "src")
	pgtest.InitDB(t, src, pgtest.Server{BinDir: b.Bin})
	in := pgtest.Start(t, src, pgtest.Server{BinDir: b.Bin})
	pgtest.Exec(t, in.ConnString("", ""), "CREATE TABLE seed (id int)", "INSERT INTO seed VALUES (1)")
	return Options{Layout: statedir.Layout{Root: filepath.Join(dir, "state")}, Installation: b.Inst, User: b.User,
		Sources:     []Source{{Name: "prod", Kind: SourceCluster, DataDir: src, ConnString: in.ConnString("", "")}},
		AdminTokens: []string{"admin"}}
}

// within runs f and fails the test when it takes longer than d (f is
// left running).
func within(t *testing.T, what string, d time.Duration, f func()) bool {
	t.Helper()
	done := make(chan struct{})
	go func() { defer close(done); f() }()
	select {
	case <-done:
		return true
	case <-time.After(d):
		t.Errorf("%s did not return in %v", what, d)
		return false
	}
}

// TestSizingHostileTree: a branch's data directory belongs to the servers'
// OS user; what it plants there must neither hang nor fool the sizing of
// List, Get, the disk quota and `pgfork ls` (cluster.List): a FIFO, a
// symlink to a large root-only file, and a file swapped for a FIFO over and
// over while it is walked (the old walk read the directory, then opened
// the name with os.Open: blocked for ever on the FIFO, under the
// Manager's lock, so every token's requests hung). Each call returns in
// bounded time, and the symlink's target is not counted.
func TestSizingHostileTree(t *testing.T) {
	t.Parallel() // see env
	ctx := context.Background()
	m := open(t, env(t))
	alice, bob := Caller{Token: "alice"}, Caller{Token: "bob"}
	m.o.MaxOwnBytes = 1 << 50
	if _, err := m.Create(ctx, alice, CreateOptions{Name: "b", Source: "prod"}); err != nil {
		t.Fatal(err)
	}
	before, err := m.Get(alice, "b")
	if err != nil {
		t.Fatal(err)
	}
	data := m.branchDir("b")

	// A root-only file of 256 MiB (allocated) and a link to it.
	secretDir := filepath.Join(testenv.XFSDir(t), "root-only")
	if err := os.Mkdir(secretDir, 0o700); err != nil {
		t.Fatal(err)
	}
	secret := filepath.Join(secretDir, "secret")
	f, err := os.OpenFile(secret, os.O_CREATE|os.O_WRONLY, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	if err := syscall.Fallocate(int(f.Fd()), 0, 0, 256<<20); err != nil {
		t.Fatal(err)
	}
	f.Close()
	if err := os.Symlink(secret, filepath.Join(data, "planted_link")); err != nil {
		t.Fatal(err)
	}
	if err := unix.Mkfifo(filepath.Join(data, "planted_fifo"), 0o600); err != nil {
		t.Fatal(err)
	}

	// A name swapped between a file and a FIFO, behind many files so that
	// a walk reads the directory well before it opens the name. Both
	// inodes stay linked in store/, so that a reader blocked on the FIFO
	// can be let go at the end.
	swap := filepath.Join(data, "planted_swap")
	store := filepath.Join(data, "planted_store")
	for _, d := range []string{swap, store} {
		if err := os.Mkdir(d, 0o700); err != nil {
			t.Fatal(err)
		}
	}
	for i := range 3000 {
		if err := os.WriteFile(filepath.Join(swap, fmt.Sprintf("a%04d", i)), []byte("x"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(filepath.Join(store, "reg"), []byte("regular"), 0o600); err != nil {
		t.Fatal(err)
	}
	fifo := filepath.Join(store, "fifo")
	if err := unix.Mkfifo(fifo, 0o600); err != nil {
		t.Fatal(err)
	}
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		tmp, target := filepath.Join(swap, "zz.tmp"), filepath.Join(swap, "zz")
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			from := filepath.Join(store, "reg")
			if i%2 == 1 {
				from = fifo
			}
			_ = os.Remove(tmp)
			if os.Link(from, tmp) == nil {
				_ = os.Rename(tmp, target)
			}
			time.Sleep(200 * time.Microsecond)
		}
	}()
	defer func() {
		close(stop)
		wg.Wait()
		// Let go of a walk blocked opening the FIFO (the old code's hang).
		for range 50 {
			if w, err := os.OpenFile(fifo, os.O_WRONLY|syscall.O_NONBLOCK, 0); err == nil {
				w.Close()
			}
			time.Sleep(20 * time.Millisecond)
		}
	}()

	var list ListResult
	var got Branch
	for i := range 15 {
		ok := within(t, fmt.Sprintf("List #%d", i), testenv.WaitTimeout, func() { list = m.List(alice) })
		ok = ok && within(t, fmt.Sprintf("Get #%d", i), testenv.WaitTimeout, func() { got, err = m.Get(alice, "b") })
		ok = ok && within(t, fmt.Sprintf("the disk quota's measure #%d", i), testenv.WaitTimeout, func() { _ = m.ownUse(alice) })
		ok = ok && within(t, fmt.Sprintf("pgfork ls (cluster.List) #%d", i), testenv.WaitTimeout, func() { _, _ = cluster.List(m.o.Layout) })
		if !ok {
			// Another token meanwhile (the old code held the lock).
			within(t, "bob's List while alice's sizing hangs", 5*time.Second, func() { m.List(bob) })
			return
		}
	}
	if err != nil {
		t.Fatal(err)
	}
	if len(list.Branches) != 1 {
		t.Fatalf("listed %+v", list.Branches)
	}
	for what, size := range map[string]int64{"List": list.Branches[0].Size, "Get": got.Size} {
		if size-before.Size > 64<<20 {
			t.Errorf("%s: the branch's size went from %d to %d bytes: the root-only file behind the link (256 MiB) is counted", what, before.Size, size)
		}
	}
}

// TestOwnBytesCountSelfClones: blocks a branch shares only among its own
// files are its own. A branch writes ~70 MiB, then its data is cloned
// twice inside it: by hand with FICLONE, and (on PostgreSQL 18) by CREATE
// DATABASE ... STRATEGY FILE_COPY with file_copy_method = clone. Its own
// bytes (List's usage, what --branch-disk-quota bounds) stay at least what
// it wrote; the old count (the FIEMAP "shared" flag) dropped to a few MiB.
func TestOwnBytesCountSelfClones(t *testing.T) {
	t.Parallel() // see env
	ctx := context.Background()
	ownOf := func(t *testing.T, m *Manager, c Caller) int64 {
		t.Helper()
		u := m.List(c).Usage
		if len(u) != 1 {
			t.Fatalf("usage %+v", u)
		}
		if own := m.ownUse(c); own > u[0].OwnBytes+(16<<20) || own < u[0].OwnBytes-(16<<20) {
			t.Errorf("the quota's measure (%d) differs from the listing's (%d)", own, u[0].OwnBytes)
		}
		return u[0].OwnBytes
	}
	const wrote = 60 << 20
	t.Run("ficlone", func(t *testing.T) {
		o := env(t)
		o.MaxOwnBytes = 1 << 50
		m := open(t, o)
		me := Caller{Token: "me"}
		b, err := m.Create(ctx, me, CreateOptions{Name: "c", Source: "prod"})
		if err != nil {
			t.Fatal(err)
		}
		fresh := ownOf(t, m, me)
		pgtest.Exec(t, b.URL(), "CREATE TABLE big AS SELECT g, repeat('x', 200) AS pad FROM generate_series(1, 300000) g", "CHECKPOINT")
		rel := pgtest.Query(t, b.URL(), "SELECT pg_relation_filepath('big')")
		own := ownOf(t, m, me)
		if own-fresh < wrote {
			t.Fatalf("after writing ~70 MiB the branch owns %d bytes (was %d)", own, fresh)
		}
		for _, n := range []string{"copy1", "copy2"} {
			src, err := os.Open(filepath.Join(m.branchDir("c"), rel))
			if err != nil {
				t.Fatal(err)
			}
			dst, err := os.Create(filepath.Join(m.branchDir("c"), "pgfork_test_"+n))
			if err != nil {
				t.Fatal(err)
			}
			if err := unix.IoctlFileClone(int(dst.Fd()), int(src.Fd())); err != nil {
				t.Fatal(err)
			}
			src.Close()
			dst.Close()
		}
		if after := ownOf(t, m, me); after < own-(8<<20) {
			t.Errorf("after cloning its own table twice the branch owns %d bytes, was %d: its own blocks counted as shared", after, own)
		}
	})
	t.Run("file_copy", func(t *testing.T) {
		o := envWith(t, pgtest.Builds(t, 18)[0])
		o.MaxOwnBytes = 1 << 50
		m := open(t, o)
		me := Caller{Token: "me"}
		if _, err := m.Create(ctx, me, CreateOptions{Name: "c", Source: "prod"}); err != nil {
			t.Fatal(err)
		}
		e, err := cluster.Get(m.o.Layout, regName("c"))
		if err != nil {
			t.Fatal(err)
		}
		sock := &instance.Instance{SocketDir: e.SocketDir, Port: e.Port}
		pgtest.Exec(t, sock.ConnString(m.o.SuperUser, "postgres"), "CREATE DATABASE app")
		pgtest.Exec(t, sock.ConnString(m.o.SuperUser, "app"),
			"CREATE TABLE big AS SELECT g, repeat('x', 200) AS pad FROM generate_series(1, 300000) g", "CHECKPOINT")
		own := ownOf(t, m, me)
		if own < wrote {
			t.Fatalf("after writing ~70 MiB the branch owns %d bytes", own)
		}
		pgtest.Exec(t, sock.ConnString(m.o.SuperUser, "postgres"), "SET file_copy_method = clone",
			"CREATE DATABASE copy1 TEMPLATE app STRATEGY FILE_COPY", "CREATE DATABASE copy2 TEMPLATE app STRATEGY FILE_COPY")
		after := ownOf(t, m, me)
		if after < own-(8<<20) {
			t.Errorf("after two FILE_COPY clones of its database the branch owns %d bytes, was %d: its own blocks counted as shared", after, own)
		}
		if !strings.Contains(pgtest.Query(t, sock.ConnString(m.o.SuperUser, "copy2"), "SELECT count(*) FROM big"), "300000") {
			t.Error("the clone of the database is not complete")
		}
	})
}

// TestBranchTablespaces: a source's tablespace is a branch's own. Two
// branches of one named snapshot each get a copy of its tablespaces
// (before, both linked to the snapshot's: one saw the other's rows and
// wrote into the snapshot); what a branch writes there counts as its own
// bytes; a reset brings the tablespace back; a restart of serve keeps the
// copies of live branches; a delete removes them.
func TestBranchTablespaces(t *testing.T) {
	t.Parallel() // see env
	ctx := context.Background()
	o := env(t)
	ts := filepath.Join(testenv.XFSDir(t), "ts")
	if err := os.Mkdir(ts, 0o700); err != nil {
		t.Fatal(err)
	}
	if o.User != nil {
		if err := os.Chown(ts, o.User.UID, o.User.GID); err != nil {
			t.Fatal(err)
		}
	}
	pgtest.Exec(t, o.Sources[0].ConnString, "CREATE TABLESPACE ts LOCATION '"+ts+"'",
		"CREATE TABLE tst (x int) TABLESPACE ts", "INSERT INTO tst VALUES (1)")
	o.MaxOwnBytes = 1 << 50
	m := open(t, o)
	me := Caller{Token: "me"}
	if _, err := m.CreateSnapshot(ctx, me, SnapshotOptions{Name: "s", Source: "prod"}); err != nil {
		t.Fatal(err)
	}
	var br [2]Branch
	for i, n := range []string{"a", "b"} {
		var err error
		if br[i], err = m.Create(ctx, me, CreateOptions{Name: n, Snapshot: "s"}); err != nil {
			t.Fatal(err)
		}
		ents, err := os.ReadDir(filepath.Join(m.branchDir(n), "pg_tblspc"))
		if err != nil || len(ents) != 1 {
			t.Fatalf("branch %s's pg_tblspc: %v %v", n, ents, err)
		}
		l, err := os.Readlink(filepath.Join(m.branchDir(n), "pg_tblspc", ents[0].Name()))
		if err != nil || !strings.HasPrefix(l, m.tblspcDir(n)+"/") {
			t.Errorf("branch %s's tablespace link points to %q (%v), want under %s", n, l, err, m.tblspcDir(n))
		}
	}
	ownA := func() int64 {
		t.Helper()
		for _, b := range m.List(me).Branches {
			if b.Name == "a" {
				return b.Size - b.Shared
			}
		}
		t.Fatal("a not listed")
		return 0
	}
	before := ownA()
	pgtest.Exec(t, br[0].URL(), "INSERT INTO tst SELECT g FROM generate_series(2, 1000000) g", "CHECKPOINT")
	if got := pgtest.Query(t, br[1].URL(), "SELECT count(*) FROM tst"); got != "1" {
		t.Errorf("branch b sees %s rows of the tablespace's table after a wrote into it, want 1", got)
	}
	c, err := m.Create(ctx, me, CreateOptions{Name: "c", Snapshot: "s"})
	if err != nil {
		t.Fatal(err)
	}
	if got := pgtest.Query(t, c.URL(), "SELECT count(*) FROM tst"); got != "1" {
		t.Errorf("a new branch of the snapshot sees %s rows, want 1: a branch wrote into the snapshot", got)
	}
	if after := ownA(); after-before < 30<<20 {
		t.Errorf("after writing ~35 MiB into its tablespace branch a owns %d bytes, was %d", after, before)
	}
	if _, err := m.Reset(ctx, me, "a"); err != nil {
		t.Fatal(err)
	}
	if got := pgtest.Query(t, br[0].URL(), "SELECT count(*) FROM tst"); got != "1" {
		t.Errorf("after a reset a sees %s rows, want 1", got)
	}
	m.Close()
	if m, err = Open(ctx, o); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		for _, n := range []string{"a", "b", "c"} {
			_ = m.Delete(ctx, me, n)
		}
		m.Close()
	})
	if got := pgtest.Query(t, br[1].URL(), "SELECT count(*) FROM tst"); got != "1" {
		t.Errorf("after a restart of serve b sees %s rows", got)
	}
	if err := m.Delete(ctx, me, "b"); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Lstat(m.tblspcDir("b")); err == nil {
		t.Error("a deleted branch's tablespaces are left behind")
	}
}
