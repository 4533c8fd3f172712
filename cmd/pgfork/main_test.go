package main

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/pgfork/pgfork/internal/testenv"
)

// runMainEnv, set in a process started from the test binary, makes it run
// pgfork's main instead of the tests (TestMain). Tests that need pgfork as
// a process of its own (signals, kills, another OS user, a long-running
// server) run the test binary so, without a `go build`; so does pgfork's
// own self-exec under test (spawnRefill's background `template refill`).
const runMainEnv = "PGFORK_TEST_RUN_MAIN"

// TestMain runs pgfork's main when the test binary is started as pgfork
// (runMainEnv), the tests otherwise.
//
// The tests that call t.Parallel() mostly wait on PostgreSQL, pgfork
// processes and the disks; Go starts them only once every test that does
// not has finished. Each works on state directories, data directories and
// ports of its own (testenv.Dir, testenv.XFSDir, --listen 127.0.0.1:0,
// instance.FreePort) and looks at nothing else. A test stays serial when it
// changes the process's environment (setProcessEnv: the db tests), uses
// the machine's loop devices and mounts (volume, ci-setup, doctor), holds
// pgfork to a time budget that load beside it would break (serve's stop
// and lease timings, the browser's page), or checks that socket
// directories of other pgfork runs are cleaned.
func TestMain(m *testing.M) {
	if v := os.Getenv(fakeServeEnv); v != "" {
		os.Exit(fakeServe(v))
	}
	if os.Getenv(runMainEnv) == "1" {
		main()
		return
	}
	// Every process started from here on that runs this binary is pgfork.
	_ = os.Setenv(runMainEnv, "1")
	code := m.Run()
	for _, d := range []string{selfBin.dir, plainBin.dir} {
		if d != "" {
			_ = os.RemoveAll(d)
		}
	}
	os.Exit(code)
}

var plainBin struct {
	once     sync.Once
	dir, bin string
	out      []byte
	err      error
}

// plainBuild returns pgfork built as users build it, a plain `go build`
// (`go install`: -buildvcs=true, as this machine's GOFLAGS may turn VCS
// stamping off), made once per test process for the tests that run it
// (TestEndToEndBinary, TestVersion).
func plainBuild(t *testing.T) string {
	t.Helper()
	plainBin.once.Do(func() {
		if plainBin.dir, plainBin.err = os.MkdirTemp("", "pgfork-test-plain-"); plainBin.err != nil {
			return
		}
		plainBin.bin = filepath.Join(plainBin.dir, "pgfork")
		plainBin.out, plainBin.err = exec.Command("go", "build", "-buildvcs=true", "-o", plainBin.bin, ".").CombinedOutput()
	})
	if plainBin.err != nil {
		t.Fatalf("go build: %v\n%s", plainBin.err, plainBin.out)
	}
	return plainBin.bin
}

var selfBin struct {
	once     sync.Once
	dir, bin string
	err      error
}

// pgforkBinary returns pgfork as a program: a copy of this test binary
// (which runs main, see TestMain) in a directory every user can run it
// from, made once per test process.
func pgforkBinary(t *testing.T) string {
	t.Helper()
	selfBin.once.Do(func() {
		self, err := os.Executable()
		if err != nil {
			selfBin.err = err
			return
		}
		if selfBin.dir, err = os.MkdirTemp("", "pgfork-test-bin-"); err != nil {
			selfBin.err = err
			return
		}
		bin := filepath.Join(selfBin.dir, "pgfork")
		if selfBin.err = copyExecutable(self, bin); selfBin.err == nil {
			selfBin.err = os.Chmod(selfBin.dir, 0o755)
		}
		selfBin.bin = bin
	})
	if selfBin.err != nil {
		t.Fatalf("pgfork binary: %v", selfBin.err)
	}
	return selfBin.bin
}

func copyExecutable(src, dst string) error {
	data, err := os.ReadFile(src)
	if err != nil {
		return err
	}
	return os.WriteFile(dst, data, 0o755)
}

// runInProcess runs pgfork's command line in this process, as main does
// (a fresh command tree, the same mapping of errors to exit codes), with
// PGFORK_HOME a fresh directory and env (KEY=VALUE) over the test's
// environment.
func runInProcess(t *testing.T, args ...string) cliResult {
	t.Helper()
	return runInProcessEnv(t, []string{"PGFORK_HOME=" + testenv.Dir(t)}, args...)
}

// runInProcessEnv is runInProcess with the environment env over the test's.
func runInProcessEnv(t *testing.T, env []string, args ...string) cliResult {
	t.Helper()
	over := map[string]string{}
	for _, kv := range env {
		k, v, _ := strings.Cut(kv, "=")
		over[k] = v
	}
	var o, e bytes.Buffer
	code := newCLI(streams{stdout: &o, stderr: &e, lookupEnv: func(k string) (string, bool) {
		if v, ok := over[k]; ok {
			return v, true
		}
		return os.LookupEnv(k)
	}}).run(context.Background(), args)
	return cliResult{code, o.String(), e.String()}
}

// setProcessEnv sets env (KEY=VALUE) in the process's environment, for
// what libraries read there, and returns the function that restores it.
// Tests that use it do not run in parallel.
func setProcessEnv(t *testing.T, env []string) (restore func()) {
	t.Helper()
	var undo []func()
	for _, kv := range env {
		k, v, _ := strings.Cut(kv, "=")
		old, had := os.LookupEnv(k)
		if err := os.Setenv(k, v); err != nil {
			t.Fatal(err)
		}
		undo = append(undo, func() {
			if had {
				_ = os.Setenv(k, old)
			} else {
				_ = os.Unsetenv(k)
			}
		})
	}
	return func() {
		for i := len(undo) - 1; i >= 0; i-- {
			undo[i]()
		}
	}
}

// TestEndToEndBinary runs pgfork built as users build it (plainBuild, which
// TestVersion also looks at; the other tests run the test binary as
// pgfork): its main, its exit codes and its hint on stderr, run as a
// process of its own.
func TestEndToEndBinary(t *testing.T) {
	t.Parallel() // see TestMain
	bin := plainBuild(t)
	base := testenv.Dir(t)
	src, dst := filepath.Join(base, "src"), filepath.Join(base, "dst")
	writeTree(t, src, 4, 1000)
	r := runCLI(t, exec.Command(bin, "copy", src, dst, "--json"))
	var sum struct{ Files int }
	if err := json.Unmarshal([]byte(r.stdout), &sum); r.code != 0 || err != nil || sum.Files != 4 {
		t.Fatalf("pgfork copy --json: exit %d, %v: %s%s", r.code, err, r.stdout, r.stderr)
	}
	r = runCLI(t, exec.Command(bin, "copy", src, dst))
	if r.code != exitExists || !strings.Contains(r.stderr, "pgfork: error:") || !strings.Contains(r.stderr, "hint:") || !strings.Contains(r.stderr, "--force") {
		t.Errorf("pgfork copy onto an existing DST: exit %d (want %d), stderr %q", r.code, exitExists, r.stderr)
	}
}

// TestInProcessParallel: commands run in-process at the same time keep
// their flags and output apart (nothing of an invocation is kept at
// package level; run with -race).
func TestInProcessParallel(t *testing.T) {
	base := testenv.Dir(t)
	src := filepath.Join(base, "src")
	writeTree(t, src, 3, 100)
	const n = 8
	var wg sync.WaitGroup
	res := make([]cliResult, n)
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			args := []string{"copy", src, filepath.Join(base, "d"+strconv.Itoa(i))}
			if i%2 == 0 {
				args = append(args, "--json")
			} else {
				args = append(args, "-q", "--method", "copy")
			}
			res[i] = runInProcess(t, args...)
		}()
	}
	wg.Wait()
	for i, r := range res {
		if r.code != 0 {
			t.Errorf("copy %d: exit %d: %s", i, r.code, r.stderr)
			continue
		}
		isJSON := json.Valid([]byte(r.stdout))
		if i%2 == 0 != isJSON || !strings.Contains(r.stdout, "d"+strconv.Itoa(i)) {
			t.Errorf("copy %d printed another invocation's output (JSON %v): %q", i, isJSON, r.stdout)
		}
		if i%2 == 1 && !strings.Contains(r.stdout, "copy 3") {
			t.Errorf("copy %d did not use its own --method copy: %q", i, r.stdout)
		}
	}
}
