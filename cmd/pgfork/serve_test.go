package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/pgfork/pgfork/instance"
	"github.com/pgfork/pgfork/internal/testenv"
	"github.com/pgfork/pgfork/server/managed"
)

// serveProc is a running `pgfork serve` started by a test.
type serveProc struct {
	cmd    *exec.Cmd
	base   string // http://host:port
	stderr *lockedBuffer
	done   chan struct{} // closed when the process has exited
}

// lockedBuffer is a bytes.Buffer that the process's output copier and the
// test may use at once.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// startServe runs `pgfork serve --json` with a state directory of home and
// waits until it prints where it listens.
func startServe(t *testing.T, bin, home, pgBin string, env []string, args ...string) *serveProc {
	t.Helper()
	cmd := exec.Command(bin, append([]string{"--state-dir", home, "--pg-bin", pgBin, "--json", "serve",
		"--listen", "127.0.0.1:0", "--pool-init", "1", "--pool-max", "4"}, args...)...)
	cmd.Env = append(os.Environ(), env...)
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	p := &serveProc{cmd: cmd, stderr: &lockedBuffer{}, done: make(chan struct{})}
	cmd.Stderr = p.stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	type listening struct {
		Listen string `json:"listen"`
	}
	outc := make(chan listening, 1)
	go func() {
		var out listening
		_ = json.NewDecoder(stdout).Decode(&out)
		outc <- out
		_, _ = io.Copy(io.Discard, stdout)
	}()
	go func() { _ = cmd.Wait(); close(p.done) }()
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-p.done:
		case <-time.After(time.Minute):
			_ = cmd.Process.Kill()
		}
	})
	select {
	case out := <-outc:
		if out.Listen == "" {
			t.Fatalf("pgfork serve ended before listening:\n%s", p.stderr)
		}
		p.base = "http://" + out.Listen
	case <-time.After(3 * time.Minute):
		t.Fatalf("pgfork serve did not listen within 3 minutes:\n%s", p.stderr)
	}
	return p
}

func (p *serveProc) call(t *testing.T, method, path, body string) (int, string) {
	t.Helper()
	req, err := http.NewRequest(method, p.base+path, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	if body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, path, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// TestServeCrashRecovery: after kill -9 of `pgfork serve`, its managed
// PostgreSQL outlives it; the next start recognises that postmaster as its
// own, stops it and starts again with the finalized template kept.
func TestServeCrashRecovery(t *testing.T) {
	t.Parallel() // see TestMain
	bin := pgforkBinary(t)
	home := testenv.Dir(t)
	pgBin := testenv.PGBinDirs(t)[0]

	s := startServe(t, bin, home, pgBin, nil)
	if code, body := s.call(t, "POST", "/api/v1/templates", `{"hash":"crash1"}`); code != 200 {
		t.Fatalf("initialize: %d %s", code, body)
	}
	if code, body := s.call(t, "PUT", "/api/v1/templates/crash1", ""); code != 204 {
		t.Fatalf("finalize: %d %s", code, body)
	}
	if code, body := s.call(t, "GET", "/api/v1/templates/crash1/tests", ""); code != 200 {
		t.Fatalf("get: %d %s", code, body)
	}
	// pgfork ls lists the serve's pool (issue 35), which down refuses.
	var ls []struct{ Name, Kind, Source, URL string }
	if err := json.Unmarshal([]byte(runInProcess(t, "--state-dir", home, "ls", "--json").ok(t)), &ls); err != nil ||
		len(ls) != 1 || ls[0].Name != "pool.crash1" || ls[0].Kind != "pool" || ls[0].URL != s.base || !strings.Contains(ls[0].Source, "1 in use") {
		t.Errorf("ls --json beside a serve: %v, %+v; want pool.crash1 with 1 database in use at %s", err, ls, s.base)
	}
	if r := runInProcess(t, "--state-dir", home, "down", "pool.crash1"); r.code != 2 || !strings.Contains(r.stderr, "pool of pgfork serve") {
		t.Errorf("down pool.crash1: exit %d, want 2 saying it is serve's pool\n%s", r.code, r.stderr)
	}
	data := managedData(t, home)
	pf, err := instance.ReadPidFile(data)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	<-s.done
	if !running(pf.Pid) {
		t.Fatalf("the managed postmaster (pid %d) died with pgfork serve: the test shows nothing", pf.Pid)
	}

	start := time.Now()
	s2 := startServe(t, bin, home, pgBin, nil)
	t.Logf("restarted in %s", time.Since(start))
	if running(pf.Pid) {
		t.Errorf("the leftover postmaster (pid %d) still runs\n%s", pf.Pid, s2.stderr)
	}
	if code, body := s2.call(t, "GET", "/api/v1/templates/crash1/tests", ""); code != 200 {
		t.Fatalf("get after the crash: %d %s\n%s", code, body, s2.stderr)
	}
	if _, err := os.Stat(pf.SocketDir); err == nil {
		t.Errorf("the leftover's socket directory %s is still there", pf.SocketDir)
	}
}

// TestServeLeftoverStranger: a postmaster.pid naming a live process that is
// not the cluster's postmaster (a reused pid) is never signalled; the stale
// file is replaced and the server starts.
func TestServeLeftoverStranger(t *testing.T) {
	bin := pgforkBinary(t)
	home := testenv.Dir(t)
	pgBin := testenv.PGBinDirs(t)[0]
	s := startServe(t, bin, home, pgBin, nil)
	data := managedData(t, home)
	pf, err := instance.ReadPidFile(data)
	if err != nil {
		t.Fatal(err)
	}
	_ = s.cmd.Process.Signal(syscall.SIGTERM)
	<-s.done
	// A stranger (this test's own sleep) takes the place of the postmaster.
	sleeper := exec.Command("sleep", "300")
	if err := sleeper.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = sleeper.Process.Kill(); _ = sleeper.Wait() }()
	forged := fmt.Sprintf("%d\n%s\n%d\n%d\n%s\n127.0.0.1\n  1 2\nready   \n", sleeper.Process.Pid, data, pf.Started.Unix(), pf.Port, pf.SocketDir)
	if err := os.WriteFile(filepath.Join(data, "postmaster.pid"), []byte(forged), 0o600); err != nil {
		t.Fatal(err)
	}
	s2 := startServe(t, bin, home, pgBin, nil)
	if code, body := s2.call(t, "GET", "/healthz", ""); code != 200 {
		t.Fatalf("healthz: %d %s", code, body)
	}
	if err := sleeper.Process.Signal(syscall.Signal(0)); err != nil {
		t.Fatalf("the stranger process was signalled: %v", err)
	}
	// A pid beyond pid_max is refused, never signalled (kill(2) would
	// truncate it).
	_ = s2.cmd.Process.Signal(syscall.SIGTERM)
	<-s2.done
	forged = fmt.Sprintf("%d\n%s\n%d\n%d\n%s\n", int64(1)<<32+1, data, pf.Started.Unix(), pf.Port, pf.SocketDir)
	if err := os.WriteFile(filepath.Join(data, "postmaster.pid"), []byte(forged), 0o600); err != nil {
		t.Fatal(err)
	}
	r := runServeOnce(t, bin, home, pgBin)
	if r.code != 6 || !strings.Contains(r.stderr, "cannot be a process") {
		t.Fatalf("pid beyond pid_max: exit %d, want 6\n%s", r.code, r.stderr)
	}
}

func runServeOnce(t *testing.T, bin, home, pgBin string, args ...string) cliResult {
	t.Helper()
	p := &pgfk{t: t, bin: bin, home: home, pgBin: pgBin}
	return p.run(append([]string{"serve", "--listen", "127.0.0.1:0"}, args...)...)
}

// running reports whether process pid exists and is not a zombie (a
// postmaster orphaned by a killed parent is reaped by whoever adopts it).
func running(pid int) bool {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false
	}
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	return i >= 0 && i+2 < len(s) && s[i+2] != 'Z'
}

// TestServeRefusesBadInput: bad flags and variables exit 2 before any
// PostgreSQL starts (nothing is created under the state directory's serve/).
func TestServeRefusesBadInput(t *testing.T) {
	bin := pgforkBinary(t)
	pgBin := testenv.PGBinDirs(t)[0]
	for _, c := range []struct {
		env  []string
		args []string
		want string
	}{
		{[]string{"INTEGRESQL_PORT=abc"}, nil, "INTEGRESQL_PORT"},
		{[]string{"INTEGRESQL_PORT=70000"}, nil, "INTEGRESQL_PORT"},
		{[]string{"INTEGRESQL_TEST_INITIAL_POOL_SIZE=many"}, nil, "INTEGRESQL_TEST_INITIAL_POOL_SIZE"},
		{[]string{"INTEGRESQL_TEST_DB_GET_TIMEOUT_MS=-5"}, nil, "INTEGRESQL_TEST_DB_GET_TIMEOUT_MS"},
		{nil, []string{"--pool-init", "5", "--pool-max", "2"}, "--pool-init"},
		// cluster isolation keeps the per-core defaults: an initial size
		// above them is refused there (database isolation raises the
		// default maximum to it, issue 33)
		{nil, []string{"--isolation", "cluster", "--pool-init", "500"}, "--pool-init"},
		{nil, []string{"--pool-max", "0"}, "--pool-max"},
		{nil, []string{"--pool-max", "100000000"}, "--pool-max"},
		{nil, []string{"--parallel", "0"}, "--parallel"},
		{nil, []string{"--get-timeout", "-1s"}, "--get-timeout"},
		{nil, []string{"--finalize-timeout", "-1ms"}, "--finalize-timeout"},
		{nil, []string{"--max-conns", "0"}, "--max-conns"},
		{nil, []string{"--db-prefix", "Bad-Prefix"}, "--db-prefix"},
		{[]string{"INTEGRESQL_DB_PREFIX=1x"}, nil, "--db-prefix"},
		{nil, []string{"--listen", "nope"}, "--listen"},
		{nil, []string{"--listen", "127.0.0.1:99999"}, "--listen"},
		{nil, []string{"--listen", "0.0.0.0:0"}, "not loopback"},
		{[]string{"INTEGRESQL_PORT=5999"}, []string{"--listen", ":0"}, "not loopback"},
		{nil, []string{"--listen", "0.0.0.0:0", "--allow-from", "10.0.0.0/33"}, "--allow-from"},
		// issue 19, F13: a token that guessing could find, or that cannot
		// stand in the base URL.
		{[]string{"PGFORK_TOKEN=x"}, []string{"--listen", "0.0.0.0:0"}, "at least 16"},
		{[]string{"PGFORK_TOKEN= "}, nil, "at least 16"},
		{[]string{"PGFORK_TOKEN=abcdefghijklmn/op"}, nil, "base URL"},
		// issue 32, F13: host names only, no scheme or port.
		{nil, []string{"--allowed-host", "http://pgfork:5000"}, "--allowed-host"},
		{[]string{"PGFORK_ALLOWED_HOSTS=pgfork:5000"}, nil, "--allowed-host"},
	} {
		home := testenv.Dir(t)
		p := &pgfk{t: t, bin: bin, home: home, pgBin: pgBin, extraEnv: c.env}
		args := append([]string{"serve"}, c.args...)
		if len(c.args) == 0 || c.args[0] != "--listen" {
			args = append(args, "--listen", "127.0.0.1:0")
		}
		if len(c.env) > 0 && strings.HasPrefix(c.env[0], "INTEGRESQL_PORT=") && len(c.args) == 0 {
			args = args[:1] // the port comes from the variable
		}
		r := p.run(args...)
		if r.code != 2 || !strings.Contains(r.stderr, c.want) {
			t.Errorf("%v %v: exit %d, want 2 naming %s\n%s", c.env, c.args, r.code, c.want, r.stderr)
		}
		if hasManaged(home) {
			t.Errorf("%v %v: a cluster was created before the input was checked", c.env, c.args)
		}
	}
}

// TestServeExternalFromPGEnv: PGHOST/PGPORT/PGUSER/PGPASSWORD alone (as
// IntegreSQL's README configures it) select that server; no managed
// cluster is started, and the log says why. INTEGRESQL_PGUSER without a
// host means 127.0.0.1:5432 as for IntegreSQL, never a managed cluster.
func TestServeExternalFromPGEnv(t *testing.T) {
	bin := pgforkBinary(t)
	pgBin := testenv.PGBinDirs(t)[0]
	u, err := instance.ResolveUser("")
	if err != nil {
		t.Fatal(err)
	}
	ext, err := managed.Start(context.Background(), managed.Options{BinDir: pgBin, Dir: filepath.Join(testenv.Dir(t), "ext"), User: u})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = ext.Stop(context.Background()) }()
	home := testenv.Dir(t)
	env := []string{"PGHOST=127.0.0.1", fmt.Sprintf("PGPORT=%d", ext.Conn.Port), "PGUSER=" + ext.Conn.Username, "PGPASSWORD=" + ext.Conn.Password}
	s := startServe(t, bin, home, pgBin, env)
	if code, body := s.call(t, "POST", "/api/v1/templates", `{"hash":"ext"}`); code != 200 || !strings.Contains(body, fmt.Sprintf(`"port":%d`, ext.Conn.Port)) {
		t.Fatalf("initialize: %d %s", code, body)
	}
	if hasManaged(home) {
		t.Error("a managed cluster was created although PGHOST… name a server")
	}
	if !strings.Contains(s.stderr.String(), "PGHOST, PGPORT, PGUSER, PGPASSWORD set") {
		t.Errorf("the log does not say why the external server was chosen:\n%s", s.stderr)
	}

	home2 := testenv.Dir(t)
	p := &pgfk{t: t, bin: bin, home: home2, pgBin: pgBin, extraEnv: []string{"INTEGRESQL_PGUSER=nobody", "INTEGRESQL_PGPORT=1"}}
	r := p.run("serve", "--listen", "127.0.0.1:0")
	if r.code == 0 || !strings.Contains(r.stderr, "external PostgreSQL") {
		t.Errorf("INTEGRESQL_PGUSER without a reachable server: exit %d\n%s", r.code, r.stderr)
	}
	if hasManaged(home2) {
		t.Error("a managed cluster was started although INTEGRESQL_PGUSER was set")
	}
}

// TestServeOneStateDir (issue 19, F19): a second pgfork serve on the state
// directory of a running one exits 6 naming the first (its pid and
// address), and the first keeps serving. Before, the second started, stopped
// the first one's PostgreSQL and left it answering 503.
func TestServeOneStateDir(t *testing.T) {
	bin := pgforkBinary(t)
	home := testenv.Dir(t)
	pgBin := testenv.PGBinDirs(t)[0]
	s := startServe(t, bin, home, pgBin, nil)
	r := runServeOnce(t, bin, home, pgBin)
	if r.code != 6 || !strings.Contains(r.stderr, "already uses the state directory") ||
		!strings.Contains(r.stderr, fmt.Sprintf("pid %d", s.cmd.Process.Pid)) {
		t.Errorf("second serve: exit %d, want 6 naming the first (pid %d)\n%s", r.code, s.cmd.Process.Pid, r.stderr)
	}
	if code, body := s.call(t, "GET", "/healthz", ""); code != 200 {
		t.Fatalf("the first serve after the second tried: healthz %d %s", code, body)
	}
}

// hasManaged says whether serve made a managed cluster in the state
// directory home (one per major: serve/<major>/pgdata).
func hasManaged(home string) bool {
	m, _ := filepath.Glob(filepath.Join(home, "serve", "*", "pgdata"))
	return len(m) > 0
}

// managedData is the data directory of the one managed cluster in home.
func managedData(t *testing.T, home string) string {
	t.Helper()
	m, _ := filepath.Glob(filepath.Join(home, "serve", "*", "pgdata"))
	if len(m) != 1 {
		t.Fatalf("managed clusters in %s: %v, want one", home, m)
	}
	return m[0]
}
