package pgforktest

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/google/shlex"
)

// ServeStartTimeout bounds how long Main waits for a `pgfork serve` it
// started to answer (the first start runs initdb).
var ServeStartTimeout = 3 * time.Minute

// Main runs the tests of a package, first starting `pgfork serve` for them
// when no server is configured, as the Python plugin does:
//
//	func TestMain(m *testing.M) { os.Exit(pgforktest.Main(m)) }
//
// The server (found as $PGFORK_BIN, else `pgfork` on PATH) listens on a free
// loopback port with a state directory of its own, runs its own PostgreSQL,
// and is stopped, its state removed, when the tests end (it stops by itself
// if the test binary is killed: --exit-with-parent); PGFORK_URL names it
// meanwhile; $PGFORK_SERVE_ARGS adds arguments to its command line (split
// as a POSIX shell splits words; no secrets: `pgfork serve --help` lists
// them). Each test binary (package) starts its own. With PGFORK_URL or
// INTEGRESQL_CLIENT_BASE_URL set, or no binary, Main just runs the tests
// (which then fail with a message if no server answers). Whatever answers at
// the default URL is not used: any local user can listen there
// (docs/SECURITY.md, rule 3).
func Main(m *testing.M) int {
	if os.Getenv("PGFORK_URL") != "" || os.Getenv("INTEGRESQL_CLIENT_BASE_URL") != "" {
		return m.Run()
	}
	ctx := context.Background()
	bin := os.Getenv("PGFORK_BIN")
	if bin == "" {
		var err error
		if bin, err = exec.LookPath("pgfork"); err != nil {
			return m.Run()
		}
	}
	srv, err := startServe(ctx, bin)
	if err != nil {
		fmt.Fprintf(os.Stderr, "pgforktest: %v\n", err)
		return 1
	}
	defer srv.stop()
	if err := os.Setenv("PGFORK_URL", srv.url); err != nil {
		fmt.Fprintf(os.Stderr, "pgforktest: %v\n", err)
		return 1
	}
	return m.Run()
}

// serve is a `pgfork serve` started by Main.
type serve struct {
	url    string
	cmd    *exec.Cmd
	state  string
	exited <-chan error // cmd's exit
}

// startServe starts bin serve on a free loopback port (--listen
// 127.0.0.1:0: serve picks it, no race for it) with a fresh state
// directory, tied to this process (--exit-with-parent: it goes when the
// tests do, also when they are killed), and waits for the line serve
// prints on stdout once it answers (--json: {"listen": "127.0.0.1:PORT"}).
func startServe(ctx context.Context, bin string) (*serve, error) {
	state, err := os.MkdirTemp("", "pgforktest-serve-")
	if err != nil {
		return nil, err
	}
	// The managed PostgreSQL runs as an unprivileged user when we are root.
	if err := os.Chmod(state, 0o755); err != nil {
		os.RemoveAll(state)
		return nil, err
	}
	log, err := os.Create(filepath.Join(state, "serve.log"))
	if err != nil {
		os.RemoveAll(state)
		return nil, err
	}
	defer log.Close()
	extra, err := serveArgs()
	if err != nil {
		os.RemoveAll(state)
		return nil, err
	}
	cmd := exec.Command(bin, append([]string{"--json", "serve", "--listen", "127.0.0.1:0", "--exit-with-parent",
		"--state-dir", filepath.Join(state, "state")}, extra...)...)
	cmd.Stderr = log
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		os.RemoveAll(state)
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		os.RemoveAll(state)
		return nil, fmt.Errorf("starting %s serve: %w", bin, err)
	}
	s := &serve{cmd: cmd, state: state}
	lines := make(chan string, 1)
	go func() {
		r := bufio.NewReader(stdout)
		line, _ := r.ReadString('\n')
		lines <- line
		_, _ = io.Copy(io.Discard, r)
	}()
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	failed := func(format string, args ...any) (*serve, error) {
		out, _ := os.ReadFile(log.Name())
		s.stopWith(exited)
		return nil, fmt.Errorf(format+": %s", append(args, strings.TrimSpace(string(out)))...)
	}
	var line string
	select {
	case line = <-lines:
	case <-time.After(ServeStartTimeout):
		return failed("`%s serve` did not answer within %v", bin, ServeStartTimeout)
	case <-ctx.Done():
		return failed("waiting for `%s serve`: %v", bin, ctx.Err())
	}
	var ready struct {
		Listen string `json:"listen"`
	}
	if err := json.Unmarshal([]byte(line), &ready); err != nil || ready.Listen == "" {
		return failed("`%s serve` exited before it answered (it printed %q)", bin, strings.TrimSpace(line))
	}
	s.url = "http://" + ready.Listen
	s.exited = exited
	return s, nil
}

// serveArgs returns the extra arguments for the server Main starts:
// $PGFORK_SERVE_ARGS split into words as a POSIX shell splits them (quotes
// and backslashes, no expansions), as the Python and JS glue read it. No
// secrets there: every local user reads a command line; a password or token
// goes in the environment, which serve inherits (PGFORK_PG_URL, …). The
// error does not show the value.
func serveArgs() ([]string, error) {
	words, err := shlex.Split(os.Getenv("PGFORK_SERVE_ARGS"))
	if err != nil {
		return nil, fmt.Errorf("PGFORK_SERVE_ARGS cannot be split into words (%v): quote it as for a POSIX shell", err)
	}
	return words, nil
}

// stop stops the server (SIGTERM: it exits within about 2 s; SIGKILL after
// 30 s) and removes its state directory.
func (s *serve) stop() { s.stopWith(s.exited) }

func (s *serve) stopWith(exited <-chan error) {
	_ = s.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-exited:
	case <-time.After(30 * time.Second):
		_ = s.cmd.Process.Kill()
		<-exited
	}
	if err := os.RemoveAll(s.state); err != nil && !errors.Is(err, os.ErrNotExist) {
		fmt.Fprintf(os.Stderr, "pgforktest: removing %s: %v\n", s.state, err)
	}
}
