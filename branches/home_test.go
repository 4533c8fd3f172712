package branches

import (
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/pgfork/pgfork/cluster"
	"github.com/pgfork/pgfork/internal/errs"
	"github.com/pgfork/pgfork/internal/pgtest"
	"github.com/pgfork/pgfork/internal/statedir"
	"github.com/pgfork/pgfork/internal/testenv"
)

// TestNamedDataDirKilled: a create of a branch whose data directory the
// user named (restore --start DST), the state directory on a tmpfs, the
// source and DST on XFS, killed with SIGKILL once DST is in place and its
// server started but before the branch is recorded complete: the next
// Open stops that server and removes DST (proven to be the one pgfork
// put there) and the home beside it. Killed earlier (its snapshot being
// prepared, before DST exists), the next Open removes the home but not
// a DST someone made meanwhile (issue 60).
func TestNamedDataDirKilled(t *testing.T) {
	t.Parallel() // see env
	for _, step := range []string{"started", "preparing"} {
		t.Run(step, func(t *testing.T) {
			t.Parallel()
			killedNamedCreate(t, step)
		})
	}
}

func killedNamedCreate(t *testing.T, step string) {
	if os.Getenv("PGFORK_BRANCHES_CHILD") != "" {
		var c struct{ Root, Src, Dst, Step string }
		if err := json.Unmarshal([]byte(os.Getenv("PGFORK_BRANCHES_CHILD")), &c); err != nil {
			t.Fatal(err)
		}
		if c.Step != step {
			t.Skip("another step's child")
		}
		b := pgtest.Builds(t, 0)[0]
		m, err := Open(context.Background(), Options{Layout: statedir.Layout{Root: c.Root}, Installation: b.Inst, User: b.User,
			Sources: []Source{{Name: "prod", Kind: SourceCluster, DataDir: c.Src}}})
		if err != nil {
			t.Fatal(err)
		}
		testHook = func(s string) {
			if s == c.Step {
				_ = syscall.Kill(os.Getpid(), syscall.SIGKILL)
			}
		}
		_, err = m.Create(context.Background(), Caller{Token: "alice"}, CreateOptions{Name: "k1", Source: "prod", DataDir: c.Dst})
		t.Fatalf("create returned (%v) instead of being killed", err)
	}
	o := env(t)
	o.Layout.Root = filepath.Join(testenv.TmpfsDir(t), "state")
	xfs := filepath.Dir(o.Sources[0].DataDir)
	dst := filepath.Join(xfs, "restored")
	home := filepath.Join(xfs, ".restored"+homeSuffix)
	raw, err := json.Marshal(struct{ Root, Src, Dst, Step string }{o.Layout.Root, o.Sources[0].DataDir, dst, step})
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(os.Args[0], "-test.run=^"+t.Name()+"$", "-test.count=1")
	cmd.Env = append(os.Environ(), "PGFORK_BRANCHES_CHILD="+string(raw))
	out, err := cmd.CombinedOutput()
	if ee, ok := err.(*exec.ExitError); !ok || ee.Sys().(syscall.WaitStatus).Signal() != syscall.SIGKILL {
		t.Fatalf("the child was not killed (%v):\n%s", err, out)
	}
	var st state
	if raw, err = os.ReadFile(filepath.Join(Dir(o.Layout), "state.json")); err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(raw, &st); err != nil || len(st.Branches) != 1 || st.Branches[0].State != stateCreating ||
		st.Branches[0].DataDir != dst || st.Branches[0].Home != home || len(st.Homes) != 1 {
		t.Fatalf("state before reopening: %s", raw)
	}
	if _, err := os.Stat(filepath.Join(home, "snap")); err != nil {
		t.Fatalf("no home beside the data directory: %v", err)
	}
	_, err = os.Stat(filepath.Join(dst, "PG_VERSION"))
	if placed := step == "started"; placed != (err == nil) {
		t.Fatalf("killed at %s: the data directory in place %v, want %v", step, err == nil, placed)
	}
	if step == "preparing" {
		// Someone else's directory at DST: never removed.
		if err := os.Mkdir(dst, 0o700); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dst, "mine"), []byte("x"), 0o600); err != nil {
			t.Fatal(err)
		}
	}

	m := open(t, o)
	if len(m.st.Branches) != 0 || len(m.st.Snapshots) != 0 || len(m.st.Homes) != 0 {
		t.Errorf("after reopening: %+v", m.st)
	}
	if _, err := os.Lstat(home); !os.IsNotExist(err) {
		t.Errorf("the home %s is left (%v)", home, err)
	}
	_, err = os.Stat(filepath.Join(dst, "mine"))
	if step == "preparing" && err != nil {
		t.Errorf("a directory someone made at DST after the crash was removed: %v", err)
	}
	if _, err := os.Lstat(dst); step == "started" && !os.IsNotExist(err) {
		t.Errorf("the killed create's data directory %s is left (%v)", dst, err)
	}
	if l, _ := cluster.List(o.Layout); len(l) != 0 {
		t.Errorf("the registry keeps %+v", l)
	}
}

// TestNamedDataDirParentChecked: as root, a data directory is named only
// in a directory that belongs to root or the servers' user and that no
// other user can write: one writable by all, or another user's, is
// refused (Permission) before anything is made; an existing one is
// refused (Exists).
func TestNamedDataDirParentChecked(t *testing.T) {
	t.Parallel() // see env
	if os.Geteuid() != 0 {
		t.Skip("the parent's owner is checked as root")
	}
	o := env(t)
	o.Layout.Root = filepath.Join(testenv.TmpfsDir(t), "state")
	m := open(t, o)
	xfs := filepath.Dir(o.Sources[0].DataDir)
	open := filepath.Join(xfs, "open")
	other := filepath.Join(xfs, "other")
	for _, d := range []string{open, other} {
		if err := os.Mkdir(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Chmod(open, 0o777); err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(other, 12345, 12345); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		dst, why string
		kind     errs.Kind
	}{
		{filepath.Join(open, "dst"), "others may write", errs.Permission},
		{filepath.Join(other, "dst"), "belongs to uid 12345", errs.Permission},
		{o.Sources[0].DataDir, "already exists", errs.Exists},
	} {
		_, err := m.Create(context.Background(), Caller{Token: "admin"}, CreateOptions{Name: "b", Source: "prod", DataDir: c.dst})
		if errs.KindOf(err) != c.kind || err == nil || !strings.Contains(err.Error(), c.why) {
			t.Errorf("data directory %s: %v, want %v saying %q", c.dst, err, c.kind, c.why)
		}
		if ents, _ := os.ReadDir(filepath.Dir(c.dst)); filepath.Dir(c.dst) != xfs && len(ents) != 0 {
			t.Errorf("refused, but %s holds %v", filepath.Dir(c.dst), ents)
		}
	}
	if len(m.st.Branches) != 0 || len(m.st.Homes) != 0 {
		t.Errorf("refused creates left %+v", m.st)
	}
}

// TestNamedDataDirHomeReplaced: the home beside a branch's data directory
// is renamed away and a symlink to another directory laid out as a home
// put in its place (what the servers' OS user could do in a parent it
// owns): removing the branch removes nothing in that other directory
// (issue 60).
func TestNamedDataDirHomeReplaced(t *testing.T) {
	t.Parallel() // see env
	ctx := context.Background()
	o := env(t)
	o.Layout.Root = filepath.Join(testenv.TmpfsDir(t), "state")
	m := open(t, o)
	xfs := filepath.Dir(o.Sources[0].DataDir)
	dst := filepath.Join(xfs, "restored")
	admin := Caller{Token: "admin"}
	br, err := m.Create(ctx, admin, CreateOptions{Name: "b", Source: "prod", DataDir: dst})
	if err != nil {
		t.Fatal(err)
	}
	if n := pgtest.Query(t, br.URL(), "SELECT count(*) FROM seed"); n != "1" {
		t.Errorf("the branch has %s rows in seed, want 1", n)
	}
	home := filepath.Join(xfs, ".restored"+homeSuffix)
	snap := m.st.Branches[0].Snapshot
	decoy := filepath.Join(xfs, "decoy")
	var planted []string
	for _, rel := range []string{"data/b/keep", "snap/" + snap + "/keep", "tblspc/b/keep"} {
		p := filepath.Join(decoy, rel)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte("x"), 0o644); err != nil {
			t.Fatal(err)
		}
		planted = append(planted, p)
	}
	if err := os.Rename(home, home+".moved"); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(decoy, home); err != nil {
		t.Fatal(err)
	}
	if err := m.Delete(ctx, admin, "b"); err != nil {
		t.Fatal(err)
	}
	for _, p := range planted {
		if _, err := os.Stat(p); err != nil {
			t.Errorf("removing the branch reached through the planted symlink: %v", err)
		}
	}
	if _, err := os.Lstat(dst); !os.IsNotExist(err) {
		t.Errorf("the branch's data directory %s is left (%v)", dst, err)
	}
}
