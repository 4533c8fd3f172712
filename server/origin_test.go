package server_test

import (
	"context"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"testing"

	"github.com/pgfork/pgfork/server"
)

// call sends method path to base with the Host and headers given (name,
// value pairs) and returns the status, headers and body.
func call(t *testing.T, base, method, path, host, body string, hdr ...string) (int, http.Header, string) {
	t.Helper()
	req, err := http.NewRequest(method, base+path, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	if host != "" {
		req.Host = host
	}
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	b, _ := io.ReadAll(res.Body)
	return res.StatusCode, res.Header, string(b)
}

// TestDNSRebinding (issue 32, F13): serve on loopback without a token
// answered any Host and Origin, so a web page in the developer's browser
// (its name rebound to 127.0.0.1) read and changed everything. A request
// admitted without a token must now name the server by a loopback name,
// an IP address or an --allowed-host (else 421); a state-changing request
// whose Origin is another site's is refused (403), token or not.
func TestDNSRebinding(t *testing.T) {
	e := newEnv(t, opts{init: 0, max: 1})
	port := e.srv.URL[strings.LastIndex(e.srv.URL, ":")+1:]
	for host, want := range map[string]int{
		"":                        200, // the URL's own: 127.0.0.1:PORT
		"localhost:" + port:       200,
		"LocalHost.:" + port:      200,
		"app.localhost:" + port:   200,
		"[::1]:" + port:           200,
		"10.1.2.3:" + port:        200,
		"evil.example:" + port:    421,
		"evil.example":            421,
		"localhost.evil.example":  421,
		"127.0.0.1.evil.example:": 421,
	} {
		code, _, body := call(t, e.srv.URL, "GET", "/api/v2/templates", host, "")
		if code != want {
			t.Errorf("GET with Host %q: %d %s, want %d", host, code, body, want)
		}
		if code == 421 && !strings.Contains(body, "--allowed-host") {
			t.Errorf("421 without the way out: %s", body)
		}
	}
	// No browser reaches the Unix socket: its clients may name anything.
	sock := filepath.Join(t.TempDir(), "api.sock")
	ul, err := server.ListenUnix(sock)
	if err != nil {
		t.Fatal(err)
	}
	us := &http.Server{Handler: server.New(server.Config{Manager: e.mgr})}
	go func() { _ = us.Serve(ul) }()
	defer us.Close()
	uc := &http.Client{Transport: &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		return (&net.Dialer{}).DialContext(ctx, "unix", sock)
	}}}
	ureq, _ := http.NewRequest("GET", "http://x/api/v2/templates", nil)
	ureq.Host = "%2Frun%2Fpgfork%2Fapi.sock"
	if res, err := uc.Do(ureq); err != nil || res.StatusCode != 200 {
		t.Errorf("over the Unix socket with Host %q: %v %v, want 200", ureq.Host, res, err)
	} else {
		res.Body.Close()
	}
	if code, _, _ := call(t, e.srv.URL, "GET", "/healthz", "evil.example", ""); code != 200 {
		t.Errorf("/healthz with a foreign Host: %d, want 200 (health checks name any host)", code)
	}

	origin := e.srv.URL // http://127.0.0.1:PORT
	for _, c := range []struct {
		method, path, origin string
		want                 int
	}{
		{"POST", "/api/v1/templates", "http://evil.example", 403},
		{"POST", "/api/v1/templates", "http://evil.example:" + port, 403},
		{"POST", "/api/v1/templates", "null", 403},
		{"DELETE", "/api/v1/admin/templates", "https://evil.example", 403},
		{"PUT", "/api/v1/templates/rebind", "http://localhost:" + port, 403}, // another origin than the page's
		{"POST", "/api/v1/templates", origin, 200},
		{"POST", "/api/v1/templates", "", 200}, // curl, the CLI, IntegreSQL's clients
		{"GET", "/api/v2/templates", "http://evil.example", 200},
	} {
		code, _, body := call(t, e.srv.URL, c.method, c.path, "", `{"hash":"rebind"}`, "Origin", c.origin)
		if c.origin == "" {
			code, _, body = call(t, e.srv.URL, c.method, c.path, "", `{"hash":"rebind"}`)
		}
		if code != c.want && !(c.want == 200 && code == 423) { // 423: initialized by the other 200 case
			t.Errorf("%s %s with Origin %q: %d %s, want %d", c.method, c.path, c.origin, code, body, c.want)
		}
	}

	for _, c := range []struct {
		path, site string
		want       int
	}{
		{"/api/v1/templates/rebind/tests", "cross-site", 403}, // a GET hands out a database
		{"/api/v2/templates", "cross-site", 403},
		{"/healthz", "cross-site", 200},
		{"/api/openapi.json", "cross-site", 200},
		{"/api/v2/templates", "same-origin", 200},
		{"/api/v2/templates", "none", 200}, // typed into the address bar
	} {
		if code, _, body := call(t, e.srv.URL, "GET", c.path, "", "", "Sec-Fetch-Site", c.site); code != c.want {
			t.Errorf("GET %s with Sec-Fetch-Site %s: %d %s, want %d", c.path, c.site, code, body, c.want)
		}
	}

	// With a token, Host is not checked (a rebinding page does not know
	// the token), Origin still is; --allowed-host admits a service name.
	tok := httptest.NewServer(server.New(server.Config{Manager: e.mgr, Token: "0123456789abcdef0123", AllowedHosts: []string{"pgfork"}}))
	defer tok.Close()
	auth := []string{"Authorization", "Bearer 0123456789abcdef0123"}
	if code, _, _ := call(t, tok.URL, "GET", "/api/v2/templates", "ci.example:5000", "", auth...); code != 200 {
		t.Errorf("the token with a foreign Host: %d, want 200", code)
	}
	if code, _, _ := call(t, tok.URL, "GET", "/api/v2/templates", "ci.example:5000", ""); code != 401 {
		t.Errorf("no token with a foreign Host: %d, want 401", code)
	}
	if code, _, _ := call(t, tok.URL, "POST", "/api/v1/templates", "", `{"hash":"rebind2"}`, append(auth, "Origin", "http://evil.example")...); code != 403 {
		t.Errorf("the token from another site's page: %d, want 403", code)
	}
	if code, _, _ := call(t, tok.URL, "POST", "/api/v1/templates", "pgfork:5000", `{"hash":"rebind2"}`, append(auth, "Origin", "http://pgfork:5000")...); code != 200 {
		t.Errorf("the token from the server's own page: %d, want 200", code)
	}
	open := httptest.NewServer(server.New(server.Config{Manager: e.mgr, AllowedHosts: []string{"pgfork"}}))
	defer open.Close()
	for host, want := range map[string]int{"pgfork:5000": 200, "PGFORK": 200, "pgfork.evil.example": 421} {
		if code, _, _ := call(t, open.URL, "GET", "/api/v2/templates", host, ""); code != want {
			t.Errorf("--allowed-host pgfork, Host %q: %d, want %d", host, code, want)
		}
	}
}

// TestNoFraming (issue 32, F14): no other site's page may frame serve's
// answers (the page on /ui above all: a framed Delete is a click away), on
// every answer, refusals included.
func TestNoFraming(t *testing.T) {
	e := newEnv(t, opts{init: 0, max: 1, token: "0123456789abcdef0123"})
	for _, c := range []struct {
		path string
		hdr  []string
	}{
		{"/healthz", nil},
		{"/api/v2/templates", nil}, // 401
		{"/api/v2/templates", []string{"Authorization", "Bearer 0123456789abcdef0123"}},
		{"/nope", []string{"Authorization", "Bearer 0123456789abcdef0123"}},
	} {
		code, h, _ := call(t, e.srv.URL, "GET", c.path, "", "", c.hdr...)
		if h.Get("X-Frame-Options") != "DENY" || !strings.Contains(h.Get("Content-Security-Policy"), "frame-ancestors 'none'") {
			t.Errorf("GET %s (%d): X-Frame-Options %q, Content-Security-Policy %q; want DENY and frame-ancestors 'none'",
				c.path, code, h.Get("X-Frame-Options"), h.Get("Content-Security-Policy"))
		}
	}
}
