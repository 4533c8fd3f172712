package pgforktest_test

import (
	"bufio"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"syscall"
	"testing"
)

// fakeEnv makes the test binary the fake server of
// TestMainNeverAdoptsTheDefaultURL (TestFakeServer).
const fakeEnv = "PGFORKTEST_FAKE_SERVER"

// TestFakeServer, in a process of its own (fakeEnv), becomes the user
// nobody, listens on 127.0.0.1:5000, prints "ready", then "req …" for every
// request, and answers each 200, as serve's /healthz does.
func TestFakeServer(t *testing.T) {
	if os.Getenv(fakeEnv) == "" {
		return
	}
	for _, err := range []error{syscall.Setgroups(nil), syscall.Setgid(65534), syscall.Setuid(65534)} {
		if err != nil {
			fmt.Println("error", err)
			return
		}
	}
	ln, err := net.Listen("tcp", "127.0.0.1:5000")
	if err != nil {
		fmt.Println("error", err)
		return
	}
	fmt.Println("ready")
	_ = http.Serve(ln, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Printf("req %s %s auth=%q\n", r.Method, r.URL.Path, r.Header.Get("Authorization"))
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprint(w, `{"status":"ok"}`)
	}))
}

// TestMainNeverAdoptsTheDefaultURL (issue 57, G5; docs/SECURITY.md, rule
// 3): with no server configured, Main starts a pgfork serve of its own
// even when something answers at the default URL, which another local user
// may hold: here a fake run as nobody, which must get nothing. Before, Main
// used it as the tests' server. The run's pgfork (PGFORK_BIN) is a script
// that fails, so the run ends where it would have started serve.
func TestMainNeverAdoptsTheDefaultURL(t *testing.T) {
	if runtime.GOOS != "linux" || os.Geteuid() != 0 {
		t.Skip("KNOWN SKIP: the fake server runs as another user (nobody), which takes root on Linux")
	}
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	fake := exec.Command(exe, "-test.run=^TestFakeServer$")
	fake.Env = append(os.Environ(), fakeEnv+"=1", "PGFORK_URL=http://127.0.0.1:1")
	out, err := fake.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := fake.Start(); err != nil {
		t.Fatal(err)
	}
	lines := bufio.NewScanner(out)
	if !lines.Scan() || lines.Text() != "ready" {
		_ = fake.Process.Kill()
		_ = fake.Wait()
		if strings.Contains(lines.Text(), "address already in use") {
			t.Skip("KNOWN SKIP: 127.0.0.1:5000 is taken on this host: what listens there cannot be watched")
		}
		t.Fatalf("the fake server did not start: %q", lines.Text())
	}
	bin := filepath.Join(t.TempDir(), "pgfork")
	if err := os.WriteFile(bin, []byte("#!/bin/sh\necho 'no pgfork serve in this test' >&2\nexit 3\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	run := exec.Command(exe, "-test.run=^$")
	for _, kv := range os.Environ() {
		if k, _, _ := strings.Cut(kv, "="); k != "PGFORK_URL" && k != "INTEGRESQL_CLIENT_BASE_URL" && k != "PGFORK_TOKEN" {
			run.Env = append(run.Env, kv)
		}
	}
	run.Env = append(run.Env, "PGFORK_BIN="+bin)
	said, runErr := run.CombinedOutput()
	_ = fake.Process.Kill()
	var got []string
	for lines.Scan() {
		got = append(got, lines.Text())
	}
	_ = fake.Wait()
	if len(got) > 0 {
		t.Errorf("Main sent the fake at the default URL: %q", got)
	}
	if runErr == nil || !strings.Contains(string(said), "no pgfork serve in this test") {
		t.Errorf("Main did not start a serve of its own (%v):\n%s", runErr, said)
	}
}
