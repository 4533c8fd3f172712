package managed_test

import (
	"context"
	"net"
	"path/filepath"
	"strconv"
	"testing"

	"github.com/pgfork/pgfork/internal/testenv"
)

// TestRestartKeepsPort: the managed server comes back on the port of its
// last start when that is free (URLs printed for kept databases stay
// right), and on another one when a process took it meanwhile.
func TestRestartKeepsPort(t *testing.T) {
	dir := filepath.Join(testenv.Dir(t), "serve")
	m := startManaged(t, dir)
	port := m.Inst.Port
	if err := m.Stop(context.Background()); err != nil {
		t.Fatal(err)
	}
	m = startManaged(t, dir)
	if m.Inst.Port != port || m.Conn.Port != port {
		t.Errorf("restarted on port %d, want the previous %d", m.Inst.Port, port)
	}
	if err := m.Stop(context.Background()); err != nil {
		t.Fatal(err)
	}
	l, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(port)))
	if err != nil {
		t.Skipf("cannot take port %d for the test: %v", port, err)
	}
	defer l.Close()
	m = startManaged(t, dir)
	defer func() { _ = m.Stop(context.Background()) }()
	if m.Inst.Port == port {
		t.Fatalf("started on port %d, which another process holds", port)
	}
}
