package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/pgfork/pgfork/internal/testenv"
)

// TestCloneStartIsABranch: `pgfork clone --start` records the clone as a
// branch — `pgfork ls` lists it with its kind and source, a second clone
// --start under the same name is refused before any copy (exit 4), and
// `pgfork down NAME` stops it and removes its data directory.
func TestCloneStartIsABranch(t *testing.T) {
	t.Parallel() // see TestMain
	p := newTestPgfk(t)
	pgBin := p.pgBin
	src := cloneSource(t, pgBin)
	dst := filepath.Join(testenv.Dir(t), "branch")
	o := p.clone(src, dst, "--start", "--name", "br-1")
	if o.Pid == 0 {
		t.Fatalf("clone --start did not start: %+v", o)
	}
	t.Cleanup(func() { p.run("down", "br-1") })

	r := p.run("ls", "--json")
	var list []struct {
		Name, Kind, Source, State string
	}
	if err := json.Unmarshal([]byte(r.stdout), &list); err != nil || r.code != 0 {
		t.Fatalf("ls --json: exit %d, %v: %s", r.code, err, r.stdout)
	}
	abs, _ := filepath.Abs(src)
	if len(list) != 1 || list[0].Name != "br-1" || list[0].Kind != "clone" || list[0].Source != abs || list[0].State != "running" {
		t.Fatalf("ls lists %+v, want the running clone br-1 from %s", list, abs)
	}
	if r := p.run("ls"); r.code != 0 || !strings.Contains(r.stdout, "clone") {
		t.Errorf("ls (text) does not show the branch's kind:\n%s", r.stdout)
	}
	if r := p.run("__complete", "down", "br"); r.code != 0 || !strings.Contains(r.stdout, "br-1") {
		t.Errorf("completion of cluster names: exit %d %q", r.code, r.stdout)
	}

	other := filepath.Join(testenv.Dir(t), "other")
	if r := p.run("clone", "--port", "auto", src, other, "--start", "--name", "br-1"); r.code != 4 {
		t.Errorf("clone --start under a taken name: exit %d, want 4\n%s", r.code, r.stderr)
	}
	if _, err := os.Stat(other); !os.IsNotExist(err) {
		t.Errorf("the refused clone copied into %s anyway", other)
	}

	if r := p.run("down", "br-1"); r.code != 0 {
		t.Fatalf("down br-1: exit %d\n%s", r.code, r.stderr)
	}
	if _, err := os.Stat(dst); !os.IsNotExist(err) {
		t.Errorf("down left the clone's data directory (%v)", err)
	}
}
