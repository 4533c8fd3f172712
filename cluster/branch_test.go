package cluster

import (
	"context"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/pgfork/pgfork/internal/errs"
	"github.com/pgfork/pgfork/internal/pgtest"
	"github.com/pgfork/pgfork/internal/statedir"
	"github.com/pgfork/pgfork/internal/testenv"
)

// TestBranchLifecycle: a data directory made elsewhere started as a
// branch is listed with its kind and source, its name is taken while it
// runs, `down --keep-data` stops and forgets it but keeps the directory,
// and a plain down removes the directory and its log as well.
func TestBranchLifecycle(t *testing.T) {
	ctx := context.Background()
	bin := testenv.PGBinDirs(t)[0]
	data := filepath.Join(testenv.Dir(t), "branch-a")
	pgtest.InitDB(t, data, pgtest.Server{BinDir: bin})
	lay := statedir.Layout{Root: testenv.Dir(t)}
	start := func() *Branch {
		t.Helper()
		b, err := StartBranch(ctx, lay, BranchOptions{DataDir: data, Kind: KindClone, Source: "/srv/src",
			BinDir: bin, User: pgtest.User(t), PGVersion: "test", PGMajor: 15})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = Down(ctx, lay, b.Name, DownOptions{Timeout: time.Second, KeepData: true}) })
		return b
	}

	b := start()
	if b.Name != "branch-a" {
		t.Errorf("branch named %q, want the data directory's name", b.Name)
	}
	list, err := List(lay)
	if err != nil {
		t.Fatal(err)
	}
	if len(list) != 1 || list[0].Kind != KindClone || list[0].Source != "/srv/src" || list[0].State != Running {
		t.Fatalf("List = %+v, want one running clone branch from /srv/src", list)
	}
	if err := CheckBranchName(lay, data, ""); errs.KindOf(err) != errs.Exists {
		t.Errorf("CheckBranchName while the branch runs: %v, want Exists", err)
	}

	if err := Down(ctx, lay, b.Name, DownOptions{Timeout: 10 * time.Second, KeepData: true}); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(data, "PG_VERSION")); err != nil {
		t.Fatalf("down --keep-data removed the data directory: %v", err)
	}
	if _, err := os.Stat(filepath.Join(data, "postmaster.pid")); err == nil {
		t.Fatal("the branch still runs after down --keep-data")
	}
	if list, _ := List(lay); len(list) != 0 {
		t.Fatalf("registry still lists %+v", list)
	}
	if _, err := os.Stat(b.SocketDir); err == nil {
		t.Errorf("socket directory %s left behind", b.SocketDir)
	}

	b = start()
	if err := Down(ctx, lay, b.Name, DownOptions{Timeout: 10 * time.Second}); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(data); !os.IsNotExist(err) {
		t.Errorf("down left the branch's data directory (%v)", err)
	}
	if _, err := os.Stat(data + ".log"); err == nil {
		t.Errorf("the branch wrote its log beside its data directory, at %s", data+".log")
	}
}

// TestDownRemovesOnlyTheBranch (issue 19, F10): after the branch's server
// is stopped and before its data directory is removed, a parent directory
// of it is swapped for a symlink into a root-only directory holding a
// directory of the same name, as the PostgreSQL user could where it owns
// that parent's parent. Down removes nothing then (the path no longer names
// the directory the branch started on) and says so. Before, root removed
// whatever the path named. A branch of a backup keeps its data without
// --delete-data (F9).
func TestDownRemovesOnlyTheBranch(t *testing.T) {
	ctx := context.Background()
	bin := testenv.PGBinDirs(t)[0]
	u := pgtest.User(t)
	base := testenv.Dir(t)
	grand := filepath.Join(base, "users")
	if err := os.MkdirAll(filepath.Join(grand, "p"), 0o755); err != nil {
		t.Fatal(err)
	}
	data := filepath.Join(grand, "p", "branch-f10")
	pgtest.InitDB(t, data, pgtest.Server{BinDir: bin})
	victim := filepath.Join(base, "root-only")
	if err := os.MkdirAll(filepath.Join(victim, "branch-f10"), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(victim, "branch-f10", "precious"), []byte("root's"), 0o600); err != nil {
		t.Fatal(err)
	}
	lay := statedir.Layout{Root: filepath.Join(base, "state")}
	start := func(kind string) *Branch {
		t.Helper()
		b, err := StartBranch(ctx, lay, BranchOptions{DataDir: data, Kind: kind, Source: "/srv/src",
			BinDir: bin, User: u, PGVersion: "test", PGMajor: 15})
		if err != nil {
			t.Fatal(err)
		}
		return b
	}

	// A branch of a backup: down keeps its data.
	b := start(KindRestore)
	if err := Down(ctx, lay, b.Name, DownOptions{Timeout: 10 * time.Second}); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(data, "PG_VERSION")); err != nil {
		t.Fatalf("down of a restore branch removed its data without --delete-data: %v", err)
	}

	// A branch of a running cluster, its parent swapped before removal.
	b = start(KindClone)
	defer func() { testHookBeforeRemoveData = nil }()
	testHookBeforeRemoveData = func(string) {
		if err := os.Rename(filepath.Join(grand, "p"), filepath.Join(grand, "p.moved")); err != nil {
			t.Fatal(err)
		}
		if err := os.Symlink(victim, filepath.Join(grand, "p")); err != nil {
			t.Fatal(err)
		}
	}
	err := Down(ctx, lay, b.Name, DownOptions{Timeout: 10 * time.Second})
	testHookBeforeRemoveData = nil
	if err == nil {
		t.Error("down removed a directory that is no longer the branch's without a word")
	}
	if _, err := os.Stat(filepath.Join(victim, "branch-f10", "precious")); err != nil {
		t.Fatalf("down removed the root-only directory the swapped path pointed to: %v", err)
	}
	if _, err := os.Stat(filepath.Join(grand, "p.moved", "branch-f10", "PG_VERSION")); err != nil {
		t.Errorf("the branch's own data is gone too: %v", err)
	}
	if list, _ := List(lay); len(list) != 0 {
		t.Errorf("the branch is still listed: %+v", list)
	}
}

// TestRenamedBranchStillTracked (issue 19, F11): a branch whose data
// directory is renamed under its running server, or whose postmaster.pid
// is forged, is still listed as running (by the pid, start time and user
// recorded at start), the reaper leaves it, and down stops its postmaster
// before forgetting it. Before, ls and down forgot it while it kept running.
func TestRenamedBranchStillTracked(t *testing.T) {
	ctx := context.Background()
	bin := testenv.PGBinDirs(t)[0]
	base := testenv.Dir(t)
	data := filepath.Join(base, "branch-f11")
	pgtest.InitDB(t, data, pgtest.Server{BinDir: bin})
	lay := statedir.Layout{Root: filepath.Join(base, "state")}
	b, err := StartBranch(ctx, lay, BranchOptions{DataDir: data, Kind: KindClone, Source: "/srv/src",
		BinDir: bin, User: pgtest.User(t), PGVersion: "test", PGMajor: 15})
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(data, data+".moved"); err != nil {
		t.Fatal(err)
	}
	if _, err := Reap(ctx, lay); err != nil {
		t.Fatal(err)
	}
	list, err := List(lay)
	if err != nil {
		t.Fatal(err)
	}
	if len(list) != 1 || list[0].State != Running {
		t.Fatalf("after its directory was renamed, List = %+v, want the branch still running", list)
	}
	_ = Down(ctx, lay, b.Name, DownOptions{Timeout: 10 * time.Second, KeepData: true})
	if list, _ := List(lay); len(list) != 0 {
		t.Errorf("down left it listed: %+v", list)
	}
	testenv.WaitFor(t, "the branch's postmaster to be gone after down", func() bool { return !running(b.Pid) })
}

// running reports whether pid runs and is not a zombie.
func running(pid int) bool {
	b, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "stat"))
	if err != nil {
		return false
	}
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	return i >= 0 && i+2 < len(s) && s[i+2] != 'Z'
}
