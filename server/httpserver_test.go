package server_test

import (
	"bufio"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/pgfork/pgfork/internal/testenv"
	"github.com/pgfork/pgfork/server"
)

// serveHTTP runs NewHTTPServer with o on a limited loopback listener.
func serveHTTP(t *testing.T, o server.HTTPOptions) string {
	t.Helper()
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { _, _ = io.WriteString(w, "ok") })
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	hs := server.NewHTTPServer(h, o)
	go func() { _ = hs.Serve(o.Listen(ln)) }()
	t.Cleanup(func() { _ = hs.Close() })
	return ln.Addr().String()
}

// get sends one keep-alive request on c and reads the response.
func get(t *testing.T, c net.Conn, rd *bufio.Reader) error {
	t.Helper()
	if _, err := io.WriteString(c, "GET / HTTP/1.1\r\nHost: x\r\n\r\n"); err != nil {
		return err
	}
	resp, err := http.ReadResponse(rd, nil)
	if err != nil {
		return err
	}
	_, _ = io.ReadAll(resp.Body)
	resp.Body.Close()
	return nil
}

// TestHTTPIdleAndSlowConnsClosed: idle keep-alive connections and clients
// that never finish their headers are closed (before, both were held
// forever).
func TestHTTPIdleAndSlowConnsClosed(t *testing.T) {
	addr := serveHTTP(t, server.HTTPOptions{IdleTimeout: 300 * time.Millisecond, ReadHeaderTimeout: 300 * time.Millisecond})
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	rd := bufio.NewReader(c)
	if err := get(t, c, rd); err != nil {
		t.Fatal(err)
	}
	// Closed, not held: EOF, where a held connection reads nothing until the
	// deadline (a wait's, so that a loaded machine's slow timer is no verdict).
	_ = c.SetReadDeadline(time.Now().Add(testenv.WaitTimeout))
	start := time.Now()
	if _, err := rd.ReadByte(); err != io.EOF {
		t.Fatalf("idle keep-alive connection: read %v, want EOF (closed by the server)", err)
	}
	t.Logf("idle connection closed after %s (IdleTimeout 300 ms)", time.Since(start))

	slow, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer slow.Close()
	_, _ = io.WriteString(slow, "GET / HTTP/1.1\r\nHost: x\r\n") // never ends the headers
	_ = slow.SetReadDeadline(time.Now().Add(testenv.WaitTimeout))
	b, err := io.ReadAll(slow)
	if err != nil {
		t.Fatalf("slow header connection: %v, want closed by the server", err)
	}
	if len(b) > 0 && !strings.Contains(string(b), "408") && !strings.Contains(string(b), "400") {
		t.Fatalf("slow header connection got %q", b)
	}
}

// TestHTTPConnectionCap: with a cap of 2, a third connection is not served
// until one of the first two closes.
func TestHTTPConnectionCap(t *testing.T) {
	addr := serveHTTP(t, server.HTTPOptions{MaxConns: 2})
	var held []net.Conn
	for range 2 {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		if err := get(t, c, bufio.NewReader(c)); err != nil {
			t.Fatal(err)
		}
		held = append(held, c)
	}
	third, err := net.Dial("tcp", addr) // the kernel's backlog takes it
	if err != nil {
		t.Fatal(err)
	}
	defer third.Close()
	rd := bufio.NewReader(third)
	_ = third.SetReadDeadline(time.Now().Add(500 * time.Millisecond))
	if err := get(t, third, rd); err == nil {
		t.Fatal("a third connection was served over a cap of 2")
	}
	held[0].Close()
	_ = third.SetReadDeadline(time.Now().Add(testenv.WaitTimeout))
	resp, err := http.ReadResponse(rd, nil)
	if err != nil {
		t.Fatalf("the waiting connection was not served after one closed: %v", err)
	}
	resp.Body.Close()
}
