package server

import (
	"bufio"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"
)

// TestWrongTokensSlowedDown (issue 19, F12, F13): a 401 or 403 closes the
// connection (no keep-alive slot held by a rejected client); after
// authFailuresAllowed wrong tokens from one address within a minute, that
// address gets 429 with Retry-After; the right token still passes.
func TestWrongTokensSlowedDown(t *testing.T) {
	ok := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(http.StatusOK) })
	s := &Server{cfg: Config{Token: "0123456789abcdef0123"}, mux: http.NewServeMux(), log: slog.New(slog.NewTextHandler(io.Discard, nil))}
	s.mux.Handle("GET /api/v2/templates", ok)
	ts := httptest.NewServer(s)
	defer ts.Close()
	get := func(tok string) *http.Response {
		req, _ := http.NewRequest("GET", ts.URL+"/api/v2/templates", nil)
		if tok != "" {
			req.Header.Set("Authorization", "Bearer "+tok)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		return resp
	}
	for i := 0; i < authFailuresAllowed; i++ {
		r := get("wrong-token-wrong-token")
		if r.StatusCode != http.StatusUnauthorized || !r.Close {
			t.Fatalf("wrong token %d: %d (close %v), want 401 closing the connection", i+1, r.StatusCode, r.Close)
		}
	}
	r := get("wrong-token-wrong-token")
	if r.StatusCode != http.StatusTooManyRequests || r.Header.Get("Retry-After") == "" {
		t.Fatalf("after %d wrong tokens: %d, Retry-After %q; want 429 with Retry-After", authFailuresAllowed, r.StatusCode, r.Header.Get("Retry-After"))
	}
	if r := get("0123456789abcdef0123"); r.StatusCode != http.StatusOK {
		t.Fatalf("the right token after the guesses: %d, want 200", r.StatusCode)
	}
}

// TestConnectionsPerAddress (issue 19, F12): one remote address (loopback
// is exempt; the test lifts that) holds at most PerAddr(n) of the n
// connection slots, and addresses the server
// refuses hold at most a quarter between them; further connections are
// closed at once instead of waiting for a slot.
func TestConnectionsPerAddress(t *testing.T) {
	for _, c := range []struct {
		name    string
		allowed func(net.IP) bool
		n, want int
	}{
		{"one address", nil, 64, PerAddr(64)},
		{"refused addresses", func(net.IP) bool { return false }, 16, 4},
	} {
		t.Run(c.name, func(t *testing.T) {
			raw, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				t.Fatal(err)
			}
			l := HTTPOptions{MaxConns: c.n, Allowed: c.allowed}.Listen(raw)
			l.(*limitListener).exempt = func(net.IP) bool { return false } // loopback stands for a remote address here
			defer l.Close()
			go func() {
				for {
					conn, err := l.Accept()
					if err != nil {
						return
					}
					go func() { _, _ = io.Copy(io.Discard, conn) }() // hold it open
				}
			}()
			var conns []net.Conn
			defer func() {
				for _, x := range conns {
					x.Close()
				}
			}()
			open := 0
			for i := 0; i < c.want+3; i++ {
				x, err := net.Dial("tcp", raw.Addr().String())
				if err != nil {
					t.Fatal(err)
				}
				conns = append(conns, x)
				_ = x.SetReadDeadline(time.Now().Add(300 * time.Millisecond))
				if _, err := bufio.NewReader(x).ReadByte(); err != nil && err != io.EOF {
					open++ // timed out: the server kept it open
				}
			}
			if open != c.want {
				t.Errorf("%d connections stayed open, want %d", open, c.want)
			}
		})
	}
}
