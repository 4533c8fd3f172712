package main

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/pgfork/pgfork/instance"
	"github.com/pgfork/pgfork/internal/flock"
	"github.com/pgfork/pgfork/internal/testenv"
	"github.com/pgfork/pgfork/serve"
)

// stopBudget is how soon `pgfork serve` should be gone after SIGTERM
// (docs/server.md, "Stopping and crashes"): the test glue of every client
// stops the server it started when the run ends (issue 34). A pgfork built
// with the race detector (make check's) gets half as much again: its Go
// side runs several times slower (measured on 2 loaded cores: 2.7 s with
// -race, 1.6 s without, the same shutdown).
var stopBudget = map[bool]time.Duration{false: 2 * time.Second, true: 3 * time.Second}[raceEnabled]

// stopLimit is what the tests hold serve to besides PostgreSQL's own stop:
// what issue 34 fixed took 20-40 s (a waiting request held, test copies
// dropped one by one), while a loaded machine stretches a 2 s stop by
// several times (issue 61: a make check at load 5-6 made a 2 s test 64 s).
// Beyond stopBudget the tests only say so.
const stopLimit = 15 * time.Second

// checkStopTime fails the test when serve took longer than grace (a wait
// it is meant to make first) and stopLimit besides PostgreSQL's stop
// (pgStop) to go after what, and says so when it took over grace and
// stopBudget.
func checkStopTime(t *testing.T, what string, took, pgStop, grace time.Duration) {
	t.Helper()
	switch besides := took - pgStop; {
	case besides > grace+stopLimit:
		t.Errorf("serve took %s to exit after %s (PostgreSQL's stop %s of it), want at most %s besides PostgreSQL's stop", took, what, pgStop, grace+stopLimit)
	case besides > grace+stopBudget:
		t.Logf("serve took %s besides PostgreSQL's stop to exit after %s: over its budget of %s (a loaded machine?)", besides, what, grace+stopBudget)
	}
}

// TestServeStopsPromptly (issue 34): a serve with full pools, a client
// holding an idle keep-alive connection, another connected that has sent
// nothing yet and a third waiting for a template still being initialized
// exits promptly after SIGTERM (checkStopTime), and starts again on the same state
// directory with its template kept. Before, the HTTP server waited for the
// waiting request (up to 30 s) and the test copies were dropped one by one
// (~0.1 s each).
func TestServeStopsPromptly(t *testing.T) {
	bin := pgforkBinary(t)
	home := testenv.Dir(t)
	pgBin := testenv.PGBinDirs(t)[0]
	const ready = 6
	s := startServe(t, bin, home, pgBin, nil, "--pool-init", strconv.Itoa(ready), "--pool-max", "32")
	for _, c := range []struct{ method, path, body string }{
		{"POST", "/api/v1/templates", `{"hash":"stop1"}`},
		{"PUT", "/api/v1/templates/stop1", ""},
		{"POST", "/api/v1/templates", `{"hash":"stop2"}`}, // never finalized
	} {
		if code, body := s.call(t, c.method, c.path, c.body); code/100 != 2 {
			t.Fatalf("%s %s: %d %s", c.method, c.path, code, body)
		}
	}
	if code, body := s.call(t, "GET", "/api/v1/templates/stop1/tests", ""); code != 200 {
		t.Fatalf("get: %d %s", code, body)
	}
	s.waitReady(t, "stop1", ready)

	// An idle keep-alive connection, one that has sent nothing, and a
	// request waiting for stop2 to be finalized.
	idle := dialHTTP(t, s.base)
	if _, err := io.WriteString(idle, "GET /healthz HTTP/1.1\r\nHost: localhost\r\n\r\n"); err != nil {
		t.Fatal(err)
	}
	if resp, err := http.ReadResponse(bufio.NewReader(idle), nil); err != nil || resp.StatusCode != 200 {
		t.Fatalf("keep-alive request: %v %v", resp, err)
	}
	silent := dialHTTP(t, s.base)
	_ = silent
	waiting := make(chan int, 1)
	go func() {
		resp, err := http.Get(s.base + "/api/v1/templates/stop2/tests")
		if err != nil {
			waiting <- -1
			return
		}
		resp.Body.Close()
		waiting <- resp.StatusCode
	}()
	time.Sleep(300 * time.Millisecond) // the request is in its handler

	start := time.Now()
	if err := s.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case <-s.done:
	case <-time.After(time.Minute):
		t.Fatalf("pgfork serve still runs a minute after SIGTERM\n%s", s.stderr)
	}
	took := time.Since(start)
	t.Logf("stopped in %s\n%s", took, s.stderr)
	// PostgreSQL's own fast shutdown (its checkpoint) takes what the disk
	// allows: 0.3-0.8 s here mostly, seconds when other work floods the
	// disk. What serve adds on top of it is checked.
	checkStopTime(t, "SIGTERM", took, pgStopTime(t, s.stderr.String()), 0)
	if st := s.cmd.ProcessState; st == nil || !st.Success() {
		t.Errorf("exit status %v, want 0", st)
	}
	if code := <-waiting; code != http.StatusServiceUnavailable && code != -1 {
		t.Errorf("the waiting request got %d, want 503 (shutting down) or a closed connection", code)
	}

	s2 := startServe(t, bin, home, pgBin, nil)
	if code, body := s2.call(t, "POST", "/api/v1/templates", `{"hash":"stop1"}`); code != http.StatusLocked {
		t.Errorf("initialize after the restart: %d %s, want 423 (the template kept)", code, body)
	}
	if code, body := s2.call(t, "GET", "/api/v1/templates/stop1/tests", ""); code != 200 {
		t.Errorf("get after the restart: %d %s\n%s", code, body, s2.stderr)
	}
}

// pgStopTime is how long the managed PostgreSQL took to stop, from serve's
// log ("PostgreSQL stopped in 0.48 s").
func pgStopTime(t *testing.T, log string) time.Duration {
	t.Helper()
	m := regexp.MustCompile(`PostgreSQL stopped in ([0-9.]+) s`).FindStringSubmatch(log)
	if m == nil {
		t.Fatalf("serve did not say how long PostgreSQL took to stop:\n%s", log)
	}
	f, _ := strconv.ParseFloat(m[1], 64)
	return time.Duration(f * float64(time.Second))
}

// dialHTTP opens a TCP connection to the server at base (http://HOST:PORT),
// closed at the test's end.
func dialHTTP(t *testing.T, base string) net.Conn {
	t.Helper()
	c, err := net.Dial("tcp", strings.TrimPrefix(base, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// waitReady waits until the pool of template hash has n databases ready
// (the pgfork_pool_databases metric).
func (p *serveProc) waitReady(t *testing.T, hash string, n int) {
	t.Helper()
	re := regexp.MustCompile(`pgfork_pool_databases\{state="ready",template="` + regexp.QuoteMeta(hash) + `"\} (\d+)`)
	deadline := time.Now().Add(2 * time.Minute)
	for {
		_, body := p.call(t, "GET", "/metrics", "")
		if m := re.FindStringSubmatch(body); m != nil {
			if got, _ := strconv.Atoi(m[1]); got >= n {
				return
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("pool %s: fewer than %d ready after 2 minutes\n%s", hash, n, p.stderr)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// TestServeLifetime (issue 34): a serve started for a test run goes when
// the run does, cleanly (its PostgreSQL stopped), also when the runner is
// killed: --exit-with-parent when the process that started it exits,
// --lease when no process has held a shared lock on the lease file for
// 1 s, also when the starter let serve inherit its locked descriptor.
func TestServeLifetime(t *testing.T) {
	bin := pgforkBinary(t)
	home := testenv.Dir(t)
	pgBin := testenv.PGBinDirs(t)[0]

	t.Run("exit-with-parent", func(t *testing.T) {
		// sh starts serve in the background and is then killed: serve is
		// orphaned, as when a test runner is killed.
		sh := exec.Command("sh", "-c", `"$0" "$@" & echo "$!"; wait`, bin, "--state-dir", home, "--pg-bin", pgBin,
			"--json", "serve", "--listen", "127.0.0.1:0", "--pool-init", "1", "--exit-with-parent")
		out, err := sh.StdoutPipe()
		if err != nil {
			t.Fatal(err)
		}
		var stderr lockedBuffer
		sh.Stderr = &stderr
		if err := sh.Start(); err != nil {
			t.Fatal(err)
		}
		defer func() { _ = sh.Process.Kill(); _, _ = sh.Process.Wait() }()
		r := bufio.NewReader(out)
		pidLine, _ := r.ReadString('\n')
		pid, err := strconv.Atoi(strings.TrimSpace(pidLine))
		if err != nil {
			t.Fatalf("serve's pid: %q", pidLine)
		}
		defer func() { _ = syscall.Kill(pid, syscall.SIGKILL) }()
		listen := readListenLine(t, r, &stderr)
		postmaster := managedPostmaster(t, home)
		if err := sh.Process.Kill(); err != nil {
			t.Fatal(err)
		}
		_, _ = sh.Process.Wait() // not sh.Wait: it waits for serve's output to end
		start := time.Now()
		waitExited(t, pid, testenv.WaitTimeout, &stderr)
		t.Logf("serve (%s) exited %s after its parent\n%s", listen, time.Since(start), &stderr)
		checkStopTime(t, "its parent", time.Since(start), pgStopTime(t, stderr.String()), 0)
		if running(postmaster) {
			t.Errorf("its PostgreSQL (pid %d) still runs\n%s", postmaster, &stderr)
		}
	})

	t.Run("lease", func(t *testing.T) {
		lease := filepath.Join(testenv.Dir(t), "lease")
		starter, err := flock.TryShared(lease)
		if err != nil {
			t.Fatal(err)
		}
		// The starter lets serve inherit its locked descriptor (as a shell's
		// `exec 9>FILE; flock -s 9` does): serve must not hold the lease itself.
		inherited, err := os.Open(lease)
		if err != nil {
			t.Fatal(err)
		}
		if err := unix.Flock(int(inherited.Fd()), unix.LOCK_SH); err != nil {
			t.Fatal(err)
		}
		cmd := exec.Command(bin, "--state-dir", home, "--pg-bin", pgBin, "--json", "serve",
			"--listen", "127.0.0.1:0", "--pool-init", "1", "--lease", lease)
		cmd.ExtraFiles = []*os.File{inherited}
		out, err := cmd.StdoutPipe()
		if err != nil {
			t.Fatal(err)
		}
		var stderr lockedBuffer
		cmd.Stderr = &stderr
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		done := make(chan struct{})
		go func() { _ = cmd.Wait(); close(done) }()
		defer func() { _ = cmd.Process.Kill(); <-done }()
		readListenLine(t, bufio.NewReader(out), &stderr)
		postmaster := managedPostmaster(t, home)
		inherited.Close()

		// A test process takes the lease, the starter lets go: serve stays.
		worker, err := flock.TryShared(lease)
		if err != nil {
			t.Fatal(err)
		}
		starter.Unlock()
		select {
		case <-done:
			t.Fatalf("serve exited while a process held the lease\n%s", &stderr)
		case <-time.After(serve.LeaseGrace + time.Second):
		}
		worker.Unlock()
		start := time.Now()
		select {
		case <-done:
		case <-time.After(testenv.WaitTimeout):
			t.Fatalf("serve still runs %s after the lease was let go\n%s", testenv.WaitTimeout, &stderr)
		}
		took := time.Since(start)
		t.Logf("serve exited %s after the lease was let go\n%s", took, &stderr)
		checkStopTime(t, "the lease ended", took, pgStopTime(t, stderr.String()), serve.LeaseGrace)
		if !cmd.ProcessState.Success() {
			t.Errorf("exit %v, want 0", cmd.ProcessState)
		}
		if running(postmaster) {
			t.Errorf("its PostgreSQL (pid %d) still runs", postmaster)
		}
	})

	t.Run("missing lease", func(t *testing.T) {
		r := runServeOnce(t, bin, home, pgBin, "--lease", filepath.Join(home, "no-such-lease"))
		if r.code != exitNotFound || !strings.Contains(r.stderr, "no-such-lease") {
			t.Errorf("a missing lease file: exit %d, want %d naming it\n%s", r.code, exitNotFound, r.stderr)
		}
	})
}

// readListenLine reads serve's first stdout line, which must be one JSON
// object naming where it listens, and returns that address.
func readListenLine(t *testing.T, r *bufio.Reader, stderr fmt.Stringer) string {
	t.Helper()
	type result struct {
		line string
		err  error
	}
	c := make(chan result, 1)
	go func() { l, err := r.ReadString('\n'); c <- result{l, err} }()
	select {
	case res := <-c:
		var ready struct {
			Listen string `json:"listen"`
		}
		if err := json.Unmarshal([]byte(res.line), &ready); err != nil || ready.Listen == "" {
			t.Fatalf("serve's first line %q is not one JSON object with listen (%v, %v)\n%s", res.line, res.err, err, stderr)
		}
		if code := httpGet(t, "http://"+ready.Listen+"/healthz"); code != 200 {
			t.Fatalf("healthz on the printed address: %d", code)
		}
		return ready.Listen
	case <-time.After(3 * time.Minute):
		t.Fatalf("serve printed no line within 3 minutes\n%s", stderr)
	}
	return ""
}

func httpGet(t *testing.T, url string) int {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	return resp.StatusCode
}

// managedPostmaster is the pid of the managed PostgreSQL running in home.
func managedPostmaster(t *testing.T, home string) int {
	t.Helper()
	pf, err := instance.ReadPidFile(managedData(t, home))
	if err != nil {
		t.Fatal(err)
	}
	return pf.Pid
}

// waitExited waits until process pid (not a child of this one) has
// exited (a zombie no one reaps counts as exited).
func waitExited(t *testing.T, pid int, limit time.Duration, stderr fmt.Stringer) {
	t.Helper()
	deadline := time.Now().Add(limit)
	for running(pid) {
		if time.Now().After(deadline) {
			t.Fatalf("process %d still runs after %s\n%s", pid, limit, stderr)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
