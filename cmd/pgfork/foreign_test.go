package main

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/pgfork/pgfork/internal/pgtest"
	"github.com/pgfork/pgfork/internal/testenv"
)

// TestForeignClusterCommands (issue 57, rule 4: G4, G11): root's documented
// commands on a cluster user nobody made to attack it (pgtest.Hostile: a
// preload library and command settings writing marks, a tablespace link to
// a root-only directory). As the run-as user postgres, `clone --start` and
// `branch create --source cluster:SRC` are refused (the data is nobody's);
// as nobody (--run-as nobody), `clone --start` refuses the tablespace link
// and copies nothing of it; without the link, `clone --start` makes a
// branch and `clone` a copy whose printed start command works, and none of
// nobody's code runs. Before: the clone was made and started as postgres,
// and the library ran as postgres.
func TestForeignClusterCommands(t *testing.T) {
	p := newTestPgfk(t)
	var env []string
	for _, b := range pgtest.Builds(t, 0) {
		if b.Bin == p.pgBin {
			env = b.Inst.Env()
		}
	}
	base := testenv.Dir(t)
	h := pgtest.NewHostile(t, base, p.pgBin, env)
	refused := func(r cliResult, what, says string) {
		t.Helper()
		if r.code != 8 || !strings.Contains(r.stderr, says) || !strings.Contains(r.stderr, "hint:") {
			t.Errorf("%s: exit %d (want 8), stderr: %s", what, r.code, r.stderr)
		}
	}
	refused(p.run("clone", h.Data, filepath.Join(base, "a"), "--start"), "clone --start as postgres", "nobody")
	refused(p.run("branch", "create", "b", "--source", "cluster:"+h.Data), "branch create as postgres", "nobody")
	refused(p.run("--run-as", "nobody", "clone", h.Data, filepath.Join(base, "c"), "--start"), "clone --start with a link to a root-only directory", "pg_tblspc/16400")
	h.CheckSecretNotIn(t, p.home)

	if err := os.Remove(h.Link); err != nil {
		t.Fatal(err)
	}
	if r := p.run("--run-as", "nobody", "clone", h.Data, filepath.Join(base, "d"), "--start"); r.code != 0 {
		t.Errorf("clone --start as nobody: exit %d, stderr: %s", r.code, r.stderr)
	} else {
		p.run("branch", "rm", "d")
	}
	// The printed start command runs the copy with its own settings: a
	// socket directory nobody can write (not Debian's default).
	f, err := os.OpenFile(filepath.Join(h.Data, "postgresql.conf"), os.O_WRONLY|os.O_APPEND, 0)
	if err != nil {
		t.Fatal(err)
	}
	_, _ = f.WriteString("unix_socket_directories = '/tmp'\n")
	f.Close()
	dst := filepath.Join(base, "e")
	o := p.run("--run-as", "nobody", "clone", "--json", "--port", "auto", h.Data, dst)
	if o.code != 0 {
		t.Fatalf("clone as nobody: exit %d, stderr: %s", o.code, o.stderr)
	}
	var out cloneOut
	if err := json.Unmarshal([]byte(o.stdout), &out); err != nil {
		t.Fatal(err)
	}
	if b, err := exec.Command("/bin/sh", "-c", out.StartCommand).CombinedOutput(); err != nil {
		log, _ := os.ReadFile(filepath.Join(dst, "pgfork-server.log"))
		t.Errorf("the printed start command: %v\n%s\n%s", err, b, log)
	}
	_ = exec.Command("/bin/sh", "-c", out.StopCommand).Run()
	h.CheckNothingRan(t)
}
