package pgforktest

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/pgfork/pgfork/clients/go/client"
)

// ServeStartTimeout bounds how long Main waits for a `pgfork serve` it
// started to answer (the first start runs initdb).
var ServeStartTimeout = 3 * time.Minute

// Main runs the tests of a package, first starting `pgfork serve` for them
// when no server is configured and none answers at the default URL, as the
// Python plugin does:
//
//	func TestMain(m *testing.M) { os.Exit(pgforktest.Main(m)) }
//
// The server (found as $PGFORK_BIN, else `pgfork` on PATH) listens on a free
// loopback port with a state directory of its own, runs its own PostgreSQL,
// and is stopped, its state removed, when the tests end; PGFORK_URL names it
// meanwhile. Each test binary (package) starts its own. With PGFORK_URL or
// INTEGRESQL_CLIENT_BASE_URL set, or a server answering at the default URL,
// or no binary, Main just runs the tests (which then fail with a message if
// no server answers).
func Main(m *testing.M) int {
	if os.Getenv("PGFORK_URL") != "" || os.Getenv("INTEGRESQL_CLIENT_BASE_URL") != "" {
		return m.Run()
	}
	ctx := context.Background()
	if c, err := client.New(client.DefaultURL); err == nil && c.Healthy(ctx) == nil {
		return m.Run()
	}
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

// startServe starts bin serve on a free loopback port with a fresh state
// directory and waits until it answers /healthz.
func startServe(ctx context.Context, bin string) (*serve, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	addr := l.Addr().String()
	l.Close()
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
	cmd := exec.Command(bin, "serve", "--listen", addr, "--state-dir", filepath.Join(state, "state"))
	cmd.Stdout, cmd.Stderr = log, log
	if err := cmd.Start(); err != nil {
		os.RemoveAll(state)
		return nil, fmt.Errorf("starting %s serve: %w", bin, err)
	}
	s := &serve{url: "http://" + addr, cmd: cmd, state: state}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	c, err := client.New(s.url)
	if err != nil {
		s.stopWith(exited)
		return nil, err
	}
	deadline := time.Now().Add(ServeStartTimeout)
	for {
		hctx, cancel := context.WithTimeout(ctx, time.Second)
		herr := c.Healthy(hctx)
		cancel()
		if herr == nil {
			s.exited = exited
			return s, nil
		}
		select {
		case werr := <-exited:
			out, _ := os.ReadFile(log.Name())
			os.RemoveAll(state)
			return nil, fmt.Errorf("`%s serve` exited before it answered (%v): %s", bin, werr, strings.TrimSpace(string(out)))
		case <-time.After(100 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			out, _ := os.ReadFile(log.Name())
			s.stopWith(exited)
			return nil, fmt.Errorf("`%s serve` did not answer at %s within %v: %s", bin, s.url, ServeStartTimeout, strings.TrimSpace(string(out)))
		}
	}
}

// stop stops the server (SIGTERM, then SIGKILL after a minute) and removes
// its state directory.
func (s *serve) stop() { s.stopWith(s.exited) }

func (s *serve) stopWith(exited <-chan error) {
	_ = s.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-exited:
	case <-time.After(time.Minute):
		_ = s.cmd.Process.Kill()
		<-exited
	}
	if err := os.RemoveAll(s.state); err != nil && !errors.Is(err, os.ErrNotExist) {
		fmt.Fprintf(os.Stderr, "pgforktest: removing %s: %v\n", s.state, err)
	}
}
