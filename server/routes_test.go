package server_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"sort"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/pgfork/pgfork/internal/errs"
	"github.com/pgfork/pgfork/server"
)

// countedBranches serves the branch routes with nothing and counts the
// calls that reach it: a refused request must not.
type countedBranches struct{ calls atomic.Int64 }

func (b *countedBranches) hit() error {
	b.calls.Add(1)
	return errs.New(errs.NotFound, "no such branch")
}
func (b *countedBranches) List(string) any { b.calls.Add(1); return []any{} }
func (b *countedBranches) Get(string, string) (any, error) {
	return nil, b.hit()
}
func (b *countedBranches) Create(context.Context, string, server.BranchRequest) (any, error) {
	return nil, b.hit()
}
func (b *countedBranches) Reset(context.Context, string, string) (any, error) { return nil, b.hit() }
func (b *countedBranches) Start(context.Context, string, string) (any, error) { return nil, b.hit() }
func (b *countedBranches) Stop(context.Context, string, string) (any, error)  { return nil, b.hit() }
func (b *countedBranches) Protect(string, string, bool) (any, error)          { return nil, b.hit() }
func (b *countedBranches) Delete(context.Context, string, string) error       { return b.hit() }
func (b *countedBranches) Snapshot(context.Context, string, server.SnapshotRequest) (any, error) {
	return nil, b.hit()
}
func (b *countedBranches) DeleteSnapshot(string, string) error { return b.hit() }

// TestEveryRouteHasAccess (issue 57, G1, rule 1): with branches served and
// no admin token, the pool routes handed a superuser of the managed
// cluster (run by the branches' OS user) to anonymous clients. Every
// route of the server's route table now has an Access, the table is the
// OpenAPI document's, and with branches every pool route refuses an
// anonymous client, a made-up bearer and a branch token — 403 when the
// server has no admin token (nothing opens them), 401 when it has one —
// while the admin token passes; the branch routes refuse all but a
// token. Refused requests never reach a handler.
func TestEveryRouteHasAccess(t *testing.T) {
	e := newEnv(t, opts{init: 0, max: 1})
	const admin, alice, madeUp = "admin-0123456789abcdef", "alice-0123456789abcdef", "made-up-0123456789abcdef"
	_, n10, _ := net.ParseCIDR("10.0.0.0/8")
	var addrs atomic.Int64
	for _, c := range []struct {
		name   string
		cfg    server.Config
		remote string // the client's network: 127 (loopback) or 10
	}{
		{"branches, no admin token (G1)", server.Config{BranchTokens: []string{alice}}, "127"},
		{"branches, --allow-from, no admin token", server.Config{BranchTokens: []string{alice}, AllowFrom: []*net.IPNet{n10}}, "10"},
		{"branches and an admin token", server.Config{Token: admin, BranchTokens: []string{alice}}, "127"},
		{"branches without branch tokens", server.Config{}, "127"},
	} {
		t.Run(c.name, func(t *testing.T) {
			b := &countedBranches{}
			cfg := c.cfg
			cfg.Manager, cfg.Conn, cfg.Branches = e.mgr, e.managed.Conn, b
			s := server.New(cfg)
			checkRouteTable(t, s.Routes())
			send := func(method, path, bearer string) int {
				n := addrs.Add(1) // an address each: no 429 for many refusals
				req := httptest.NewRequest(method, path, strings.NewReader("{}"))
				req.RemoteAddr = fmt.Sprintf("%s.0.%d.%d:4000", c.remote, n/250, n%250+1)
				req.Host = "127.0.0.1:5000"
				if bearer != "" {
					req.Header.Set("Authorization", "Bearer "+bearer)
				}
				rec := httptest.NewRecorder()
				s.ServeHTTP(rec, req)
				return rec.Code
			}
			for _, r := range s.Routes() {
				method, pattern, _ := strings.Cut(r.Pattern, " ")
				path := strings.NewReplacer("{hash}", "h1", "{id}", "1", "{name}", "n1").Replace(pattern)
				refused := map[server.Access][]string{
					server.Pool:   {"", madeUp, alice},
					server.Branch: {"", madeUp},
				}[r.Access]
				if r.Access == server.Info && cfg.Token != "" {
					refused = []string{"", madeUp, alice}
				}
				before := b.calls.Load()
				for _, tok := range refused {
					want := http.StatusUnauthorized
					if r.Access == server.Pool && cfg.Token == "" {
						want = http.StatusForbidden // no token opens them
					}
					if got := send(method, path, tok); got != want {
						t.Errorf("%s (%s) with bearer %q: %d, want %d", r.Pattern, r.Access, tok, got, want)
					}
				}
				if n := b.calls.Load() - before; n != 0 {
					t.Errorf("%s: %d refused requests reached the branches", r.Pattern, n)
				}
				var admitted []string
				switch {
				case r.Access == server.Open || r.Access == server.Info && cfg.Token == "":
					admitted = []string{""}
				case r.Access == server.Branch && len(cfg.BranchTokens) > 0:
					admitted = []string{alice}
				}
				if cfg.Token != "" && r.Access != server.Open {
					admitted = append(admitted, admin)
				}
				for _, tok := range admitted {
					if got := send(method, path, tok); got == http.StatusUnauthorized || got == http.StatusForbidden {
						t.Errorf("%s (%s) with bearer %q: %d, want it admitted", r.Pattern, r.Access, tok, got)
					}
				}
			}
		})
	}
	t.Run("without branches", func(t *testing.T) {
		// A developer's loopback serve (no token, no branches) keeps its
		// anonymous pools, as IntegreSQL's; no branch route exists.
		s := server.New(server.Config{Manager: e.mgr, Conn: e.managed.Conn})
		for _, r := range s.Routes() {
			if r.Access == server.Branch || r.Pattern == "GET /ui" {
				t.Errorf("%s served without branches", r.Pattern)
			}
		}
		req := httptest.NewRequest("GET", "/api/v2/templates", nil)
		req.RemoteAddr, req.Host = "127.0.0.1:4000", "127.0.0.1:5000"
		rec := httptest.NewRecorder()
		s.ServeHTTP(rec, req)
		if rec.Code != 200 {
			t.Errorf("GET /api/v2/templates anonymously without branches: %d, want 200", rec.Code)
		}
	})
	for _, c := range []struct {
		token    string
		branches bool
		refused  bool
	}{{"", true, true}, {admin, true, false}, {"", false, false}} {
		err := server.RequireAdminToken(c.token, c.branches)
		if c.refused != (err != nil) || err != nil && (errs.KindOf(err) != errs.Usage || errs.CLIHintOf(err) == "" ||
			!strings.Contains(errs.CLIHintOf(err), "--token") || !strings.Contains(errs.CLIHintOf(err), "PGFORK_TOKEN")) {
			t.Errorf("RequireAdminToken(%q, %v) = %v (hint %q); want refused: %v, a usage error naming --token and PGFORK_TOKEN",
				c.token, c.branches, err, errs.CLIHintOf(err), c.refused)
		}
	}
}

// checkRouteTable checks that the route table is the OpenAPI document's,
// both ways, and that each route has the Access its path calls for.
func checkRouteTable(t *testing.T, routes []server.Route) {
	t.Helper()
	var doc struct {
		Paths map[string]map[string]json.RawMessage `json:"paths"`
	}
	if err := json.Unmarshal(server.OpenAPI(), &doc); err != nil {
		t.Fatal(err)
	}
	var documented, served []string
	for p, ops := range doc.Paths {
		for m := range ops {
			if m == "get" || m == "post" || m == "put" || m == "delete" || m == "patch" {
				documented = append(documented, strings.ToUpper(m)+" "+p)
			}
		}
	}
	for _, r := range routes {
		served = append(served, r.Pattern)
		path := r.Pattern[strings.Index(r.Pattern, " ")+1:]
		want := server.Pool
		switch {
		case path == "/healthz" || path == "/ui":
			want = server.Open
		case path == "/metrics" || path == "/api/openapi.json":
			want = server.Info
		case strings.HasPrefix(path, "/api/v2/sources") || strings.HasPrefix(path, "/api/v2/snapshots") || strings.HasPrefix(path, "/api/v2/branches"):
			want = server.Branch
		}
		if r.Access != want {
			t.Errorf("route %s has access %s, want %s", r.Pattern, r.Access, want)
		}
	}
	sort.Strings(documented)
	sort.Strings(served)
	if strings.Join(documented, "\n") != strings.Join(served, "\n") {
		t.Errorf("the routes served are not the OpenAPI document's:\nserved:\n%s\ndocumented:\n%s", strings.Join(served, "\n"), strings.Join(documented, "\n"))
	}
}
