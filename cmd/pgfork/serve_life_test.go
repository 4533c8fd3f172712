package main

import (
	"bufio"
	"io"
	"net"
	"net/http"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/pgfork/pgfork/internal/testenv"
)

// stopBudget is how soon `pgfork serve` must be gone after SIGTERM
// (docs/server.md, "Stopping and crashes"): the test glue of every client
// stops the server it started when the run ends (issue 34).
const stopBudget = 2 * time.Second

// TestServeStopsPromptly (issue 34): a serve with full pools, a client
// holding an idle keep-alive connection, another connected that has sent
// nothing yet and a third waiting for a template still being initialized
// exits within stopBudget of SIGTERM, and starts again on the same state
// directory with its template kept. Before, the HTTP server waited for the
// waiting request (up to 30 s) and the test copies were dropped one by one
// (~0.1 s each).
func TestServeStopsPromptly(t *testing.T) {
	bin := pgforkBinary(t)
	home := testenv.Dir(t)
	pgBin := testenv.PGBinDirs(t)[0]
	const ready = 12
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
	if took > stopBudget {
		t.Errorf("pgfork serve took %s to exit after SIGTERM, want at most %s", took, stopBudget)
	}
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
