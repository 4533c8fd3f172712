package main

import (
	"bufio"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// walkThrough is the block of docs/branches.md after its walk-through
// marker, as a bash script: each line ending in "# → X" becomes a check
// that the command before it prints X.
func walkThrough(t *testing.T) string {
	t.Helper()
	raw, err := os.ReadFile("../../docs/branches.md")
	if err != nil {
		t.Fatal(err)
	}
	_, rest, ok := strings.Cut(string(raw), "<!-- walk-through:")
	if !ok {
		t.Fatal("docs/branches.md has no walk-through marker")
	}
	_, rest, _ = strings.Cut(rest, "```sh\n")
	block, _, ok := strings.Cut(rest, "```")
	if !ok {
		t.Fatal("docs/branches.md: the walk-through block does not end")
	}
	var script strings.Builder
	script.WriteString("set -euo pipefail\n")
	checks := 0
	sc := bufio.NewScanner(strings.NewReader(block))
	for n := 1; sc.Scan(); n++ {
		line := sc.Text()
		cmd, want, ok := strings.Cut(line, "# → ")
		if !ok {
			script.WriteString(line + "\n")
			continue
		}
		checks++
		cmd = strings.TrimSpace(cmd)
		fmt.Fprintf(&script, "out=$(%s)\n[ \"$out\" = %q ] || { echo %q; echo \"printed: $out\"; exit 1; }\n",
			cmd, strings.TrimSpace(want), fmt.Sprintf("walk-through line %d: %s: want %s", n, cmd, strings.TrimSpace(want)))
	}
	if checks < 3 {
		t.Fatalf("the walk-through checks %d outputs; the test expects its # → lines", checks)
	}
	return script.String()
}

// TestBranchWalkthrough (issue 35): the walk-through of docs/branches.md
// runs as written, with the same commands, on this machine (no server:
// SOURCE=cluster:DATADIR) and against a serve (PGFORK_SERVER and
// PGFORK_TOKEN set, SOURCE=prod declared to it), each on a state directory
// of its own; nothing of either is left running.
func TestBranchWalkthrough(t *testing.T) {
	t.Parallel() // see TestMain
	script := walkThrough(t)
	bin, pgBin, dir, src := branchSource(t, "INSERT INTO seed VALUES (1)")
	path := filepath.Dir(bin) + ":" + pgBin + ":" + os.Getenv("PATH")
	run := func(how string, env ...string) {
		t.Helper()
		cmd := exec.Command("bash", "-c", script)
		cmd.Dir = dir
		cmd.Env = append(os.Environ(), append([]string{"PATH=" + path, "PGFORK_SERVER=", "PGFORK_TOKEN="}, env...)...)
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("%s: the walk-through failed (%v):\n%s", how, err, out)
		}
		if !strings.Contains(string(out), "review") {
			t.Errorf("%s: pgfork branch ls did not list the review branch:\n%s", how, out)
		}
	}

	local := filepath.Join(dir, "local")
	run("on this machine", "PGFORK_HOME="+local, "SOURCE=cluster:"+src)
	if out, err := exec.Command(bin, "--state-dir", local, "ls").CombinedOutput(); err != nil || strings.Contains(string(out), "branch.") {
		t.Errorf("pgfork ls after the walk-through (%v): %s; want no branch left", err, out)
	}

	const tok = "walk-0123456789abcdef"
	s := startServe(t, bin, filepath.Join(dir, "served"), pgBin, []string{"PGFORK_BRANCH_TOKENS=" + tok, "PGFORK_TOKEN=walk-admin-0123456789"},
		"--branch-source", "prod=cluster:"+src, "--branch-min-free", "1MiB")
	run("against a serve", "PGFORK_HOME="+filepath.Join(dir, "unused"), "PGFORK_SERVER="+s.base, "PGFORK_TOKEN="+tok, "SOURCE=prod")
	if code, _, body := branchAPI(t, s.base, "GET", "/api/v2/branches", tok, ""); code != 200 || strings.Contains(body, `"dev"`) {
		t.Errorf("the serve's branches after the walk-through: %d %s; want none", code, body)
	}
}

// TestLsAndDownKnowBranches (issue 35): pgfork ls lists a branch of pgfork
// branch as kind branch with its own role's URL, stopped ones too, and
// pgfork down removes one as pgfork branch rm does: refused while it is
// protected, and never by --all. Before, down removed a branch's data
// directory behind the branches' back (its reset and start then failed)
// and ls showed the bootstrap superuser's URL, which TCP refuses.
func TestLsAndDownKnowBranches(t *testing.T) {
	t.Parallel() // see TestMain
	_, _, dir, src := branchSource(t)
	state := filepath.Join(dir, "state")
	pg := func(args ...string) cliResult {
		return runInProcess(t, append([]string{"--state-dir", state}, args...)...)
	}
	pg("branch", "create", "kept", "--source", "cluster:"+src, "--protect").ok(t)
	pg("branch", "create", "idle", "--from", "kept").ok(t)
	pg("branch", "stop", "idle").ok(t)

	var ls []struct {
		Name, Kind, State, URL string
	}
	if err := json.Unmarshal([]byte(pg("ls", "--json").ok(t)), &ls); err != nil {
		t.Fatal(err)
	}
	seen := map[string]string{}
	for _, e := range ls {
		seen[e.Name] = e.Kind + " " + e.State
		if e.Kind == "branch" && !strings.Contains(e.URL, "branch_") {
			t.Errorf("ls shows %s with URL %s, not its branch role's", e.Name, e.URL)
		}
	}
	if seen["branch.kept"] != "branch running" || seen["branch.idle"] != "branch stopped" {
		t.Errorf("ls lists %v; want branch.kept running and branch.idle stopped, both of kind branch", seen)
	}

	pg("down", "--all").ok(t)
	if r := pg("down", "branch.kept"); r.code != 6 || !strings.Contains(r.stderr, "protected") {
		t.Errorf("down of a protected branch: exit %d (%s), want 6 naming the protection", r.code, r.stderr)
	}
	if r := pg("branch", "reset", "kept"); r.code != 0 {
		t.Fatalf("the branch after down --all and a refused down does not reset: %s", r.stderr)
	}
	pg("branch", "protect", "--off", "kept").ok(t)
	pg("down", "branch.kept", "branch.idle").ok(t)
	if out := pg("branch", "ls", "--json").ok(t); strings.Contains(out, `"kept"`) || strings.Contains(out, `"idle"`) {
		t.Errorf("branches left after down: %s", out)
	}
}
