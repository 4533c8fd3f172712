package branches

import (
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"

	"github.com/pgfork/pgfork/internal/pgtest"
	"github.com/pgfork/pgfork/internal/statedir"
	"github.com/pgfork/pgfork/internal/testenv"
)

// TestStoreKilled: a create from a source on XFS, the state directory on
// a tmpfs, no data directory named, killed with SIGKILL once its data
// directory is in place in the branch store beside the source and its
// server started, before the branch is recorded complete: state.json
// already records the store, the branch's data directory in it and its
// home; the next Open stops the server and removes the data directory
// (proven), the home and the store, leaving nothing beside the source
// (issue 60).
func TestStoreKilled(t *testing.T) {
	t.Parallel() // see env
	if os.Getenv("PGFORK_BRANCHES_CHILD") != "" {
		var c struct{ Root, Src string }
		if err := json.Unmarshal([]byte(os.Getenv("PGFORK_BRANCHES_CHILD")), &c); err != nil {
			t.Fatal(err)
		}
		b := pgtest.Builds(t, 0)[0]
		m, err := Open(context.Background(), Options{Layout: statedir.Layout{Root: c.Root}, Installation: b.Inst, User: b.User,
			Sources: []Source{{Name: "prod", Kind: SourceCluster, DataDir: c.Src}}, BranchStore: true})
		if err != nil {
			t.Fatal(err)
		}
		testHook = func(s string) {
			if s == "started" {
				_ = syscall.Kill(os.Getpid(), syscall.SIGKILL)
			}
		}
		_, err = m.Create(context.Background(), Caller{Token: "alice"}, CreateOptions{Name: "k1", Source: "prod"})
		t.Fatalf("create returned (%v) instead of being killed", err)
	}
	o := env(t)
	o.Layout.Root = filepath.Join(testenv.TmpfsDir(t), "state")
	o.BranchStore = true
	xfs := filepath.Dir(o.Sources[0].DataDir)
	store := filepath.Join(xfs, storeName)
	raw, err := json.Marshal(struct{ Root, Src string }{o.Layout.Root, o.Sources[0].DataDir})
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
		st.Branches[0].Store != store || st.Branches[0].DataDir != filepath.Join(store, "k1") ||
		st.Branches[0].Home != filepath.Join(store, ".k1"+homeSuffix) || st.Stores[store].zero() {
		t.Fatalf("state before reopening: %s", raw)
	}
	if _, err := os.Stat(filepath.Join(store, "k1", "PG_VERSION")); err != nil {
		t.Fatalf("the branch's data directory is not in the store: %v", err)
	}
	m := open(t, o)
	if l := m.List(Caller{Token: "admin"}); len(l.Branches) != 0 || len(l.Snapshots) != 0 {
		t.Errorf("after reopening: %+v, want nothing", l)
	}
	if _, err := os.Lstat(store); err == nil {
		ents, _ := os.ReadDir(store)
		t.Errorf("the branch store is left after reopening, holding %v", ents)
	}
	if len(m.st.Stores) != 0 || len(m.st.Homes) != 0 {
		t.Errorf("after reopening the state records stores %v, homes %v", m.st.Stores, m.st.Homes)
	}
}
