package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/pgfork/pgfork/internal/pgtest"
	"github.com/pgfork/pgfork/internal/testenv"
)

// TestCloneStartIsABranch (issues 35, 60): `pgfork clone SRC DST --start`
// is pgfork branch create NAME --source cluster:SRC --data-dir DST and says
// so: SRC, a stopped cluster, is cloned offline, DST is the branch's data
// directory; pgfork ls lists the branch; a second one under the same name
// is refused before any copy (exit 4); it resets, and pgfork branch rm
// removes it and DST.
func TestCloneStartIsABranch(t *testing.T) {
	t.Parallel() // see TestMain
	p := newTestPgfk(t)
	src := cloneSource(t, p.pgBin)
	dst := filepath.Join(testenv.Dir(t), "branch")
	r := p.run("clone", "--json", src, dst, "--start", "--name", "br-1")
	var b struct{ Name, From, URL string }
	if err := json.Unmarshal([]byte(r.stdout), &b); r.code != 0 || err != nil || b.Name != "br-1" || b.From != "source:src" || b.URL == "" {
		t.Fatalf("clone --start --json: exit %d, %v, %+v\n%s%s", r.code, err, b, r.stdout, r.stderr)
	}
	t.Cleanup(func() { p.run("branch", "rm", "br-1") })
	abs, _ := filepath.Abs(src)
	if want := "the same as `pgfork branch create br-1 --source cluster:" + abs + " --data-dir " + dst + "`"; !strings.Contains(r.stderr, want) {
		t.Errorf("clone --start does not say it makes a branch (%q):\n%s", want, r.stderr)
	}
	if _, err := os.Stat(filepath.Join(dst, "PG_VERSION")); err != nil {
		t.Errorf("DST is not the branch's data directory: %v", err)
	}

	r = p.run("ls", "--json")
	var list []struct{ Name, Kind, State string }
	if err := json.Unmarshal([]byte(r.stdout), &list); err != nil || r.code != 0 {
		t.Fatalf("ls --json: exit %d, %v: %s", r.code, err, r.stdout)
	}
	if len(list) != 1 || list[0].Name != "branch.br-1" || list[0].Kind != "branch" || list[0].State != "running" {
		t.Fatalf("ls lists %+v, want the running branch.br-1", list)
	}

	other := filepath.Join(testenv.Dir(t), "other")
	if r := p.run("clone", src, other, "--start", "--name", "br-1"); r.code != 4 {
		t.Errorf("clone --start under a taken name: exit %d, want 4\n%s", r.code, r.stderr)
	}
	if r := p.run("clone", "--jobs", "2", src, other, "--start"); r.code != 2 || !strings.Contains(r.stderr, "--jobs is not for --start") {
		t.Errorf("clone --start --jobs: exit %d, want 2 saying --jobs is not for it\n%s", r.code, r.stderr)
	}

	pgtest.Exec(t, b.URL, "CREATE TABLE made_here (x int)")
	if r := p.run("branch", "reset", "br-1"); r.code != 0 {
		t.Fatalf("branch reset br-1: exit %d\n%s", r.code, r.stderr)
	}
	if n := pgtest.Query(t, b.URL, "SELECT count(*) FROM pg_class WHERE relname = 'made_here'"); n != "0" {
		t.Errorf("after reset the table made in the branch is still there")
	}
	if r := p.run("branch", "rm", "br-1"); r.code != 0 {
		t.Fatalf("branch rm br-1: exit %d\n%s", r.code, r.stderr)
	}
	if r := p.run("ls", "--json"); strings.Contains(r.stdout, "br-1") {
		t.Errorf("ls after branch rm: %s", r.stdout)
	}
	if _, err := os.Lstat(dst); !os.IsNotExist(err) {
		t.Errorf("branch rm left DST %s (%v)", dst, err)
	}
}
