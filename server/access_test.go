package server_test

import (
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/pgfork/pgfork/server"
)

// TestNetworkAccess: IntegreSQL's clients cannot send a bearer token, so
// the token also works as the first path segment of the base URL
// (http://HOST:PORT/<token>/api); --allow-from admits listed networks
// (and loopback and the Unix socket) only.
func TestNetworkAccess(t *testing.T) {
	e := newEnv(t, opts{init: 0, max: 1, token: "s3cret"})
	get := func(path string) int {
		res, err := http.Get(e.srv.URL + path)
		if err != nil {
			t.Fatal(err)
		}
		res.Body.Close()
		return res.StatusCode
	}
	res, err := http.Post(e.srv.URL+"/s3cret/api/v1/templates", "application/json", strings.NewReader(`{"hash":"pathtok"}`))
	if err != nil {
		t.Fatal(err)
	}
	res.Body.Close()
	if res.StatusCode != 200 {
		t.Fatalf("initialize with the token in the path: %d", res.StatusCode)
	}
	for path, want := range map[string]int{
		"/s3cret/api/v2/templates":            200,
		"/s3cret/api/v1/templates/nope/tests": 404,
		"/s3cre/api/v2/templates":             401,
		"/s3cret2/api/v2/templates":           401,
		"/api/s3cret/v2/templates":            401,
		"/api/v2/templates":                   401,
		"/s3cret/healthz":                     200,
		"/s3cret/s3cret/api/v2/templates":     404, // the token is taken once
	} {
		if got := get(path); got != want {
			t.Errorf("GET %s: %d, want %d", path, got, want)
		}
	}

	_, n10, _ := net.ParseCIDR("10.0.0.0/8")
	// httptest.NewRequest names example.com in Host: allowed here, as a
	// compose service name would be (--allowed-host).
	s := server.New(server.Config{Manager: e.mgr, AllowFrom: []*net.IPNet{n10}, AllowedHosts: []string{"example.com"}})
	for addr, want := range map[string]int{
		"10.1.2.3:4000":    200,
		"127.0.0.1:4000":   200,
		"[::1]:4000":       200,
		"@":                200, // Unix socket
		"192.168.1.5:4000": 403,
		"[fd00::1]:4000":   403,
		"11.0.0.1:4000":    403,
	} {
		req := httptest.NewRequest("GET", "/api/v2/templates", nil)
		req.RemoteAddr = addr
		rec := httptest.NewRecorder()
		s.ServeHTTP(rec, req)
		if rec.Code != want {
			t.Errorf("from %s: %d, want %d", addr, rec.Code, want)
		}
	}
}
