package server

import (
	"net/http"
	"sort"

	"github.com/pgfork/pgfork/internal/errs"
)

// Who may use which route is decided here, once, for every route (issue
// 57, rule 1: nothing hands out a superuser, or any database, without a
// secret when anything else on the server needs one). A pool database is
// a superuser of a cluster that runs as the same OS user as the branches
// and their source, so once a server serves branches its pools are as
// secret as the branches: they take the admin token only. Every route is
// registered with its Access (handle); ServeHTTP admits a request by the
// Access of the route the mux picks for it, so a route added later cannot
// be anonymous by omission: one registered without an Access counts as
// Pool.

// Access is who may use a route.
type Access int

const (
	// Open routes never need a token: /healthz and the branch page /ui
	// (static; its script asks the API with the token the user types).
	Open Access = iota + 1
	// Info routes hand out and change nothing (Prometheus metrics, the
	// OpenAPI document): they need the admin token when one is set.
	Info
	// Pool routes hand out or change test databases and templates (the
	// IntegreSQL v1 and native v2 routes, admin reset included): the
	// admin token only, whenever the server has a secret to keep — an
	// admin token, or branches. Only a server with neither (a developer's
	// loopback serve) answers them anonymously. A branch token never
	// reaches them.
	Pool
	// Branch routes (/api/v2/sources, /snapshots, /branches) need the
	// admin token or a branch token; never none.
	Branch
)

// unrouted is the Access of a request no route takes (a 404 or 405 and
// nothing else): any token the server knows, or none on a server with
// no secret.
const unrouted Access = 0

// String names an Access as docs/server.md does.
func (a Access) String() string {
	switch a {
	case Open:
		return "open"
	case Info:
		return "info"
	case Pool:
		return "pool"
	case Branch:
		return "branch"
	}
	return "unrouted"
}

// Route is one route of the server and who may use it.
type Route struct {
	Pattern string // the mux pattern: "METHOD /path/{wildcard}"
	Access  Access
}

// Routes lists every route the server serves, sorted by pattern.
func (s *Server) Routes() []Route {
	rs := make([]Route, 0, len(s.access))
	for p, a := range s.access {
		rs = append(rs, Route{Pattern: p, Access: a})
	}
	sort.Slice(rs, func(i, j int) bool { return rs[i].Pattern < rs[j].Pattern })
	return rs
}

// handle registers a route with who may use it; every route goes
// through here.
func (s *Server) handle(a Access, pattern string, h http.HandlerFunc) {
	s.mux.Handle(pattern, h)
	s.access[pattern] = a
}

// route is the Access and mux pattern of the route r goes to.
func (s *Server) route(r *http.Request) (Access, string) {
	_, pattern := s.mux.Handler(r)
	if pattern == "" {
		return unrouted, ""
	}
	if a, ok := s.access[pattern]; ok {
		return a, pattern
	}
	return Pool, pattern // registered around handle: as strict as the pools
}

// secret says whether the server has anything to keep from anonymous
// clients: an admin token, or branches.
func (s *Server) secret() bool { return s.cfg.Token != "" || s.cfg.Branches != nil }

// admits says whether a request to a route of Access a is let in, given
// whether it carries the admin token and whether it carries a branch
// token.
func (s *Server) admits(a Access, admin, branch bool) bool {
	switch a {
	case Open:
		return true
	case Info:
		return admin || s.cfg.Token == ""
	case Branch:
		return admin || branch
	case unrouted:
		return admin || branch || !s.secret()
	}
	return admin || !s.secret() // Pool
}

// refuse answers a request admits turned away: 403 when no token could
// let it in (the pools of a server with branches and no admin token),
// else 401 (refuseToken).
func (s *Server) refuse(w http.ResponseWriter, r *http.Request, a Access) {
	if a == Pool && s.cfg.Token == "" {
		w.Header().Set("Connection", "close")
		writeError(w, http.StatusForbidden, "this server serves branches and has no admin token: its test-database pools are closed (a pool database is a superuser of a cluster run by the branches' OS user); start it with an admin token")
		return
	}
	s.refuseToken(w, r, a)
}

// RequireAdminToken refuses to serve branches without an admin token
// (rule 1 above): the pools would then be closed to every client (their
// databases are superusers of a cluster run by the same OS user as the
// branches, so no branch token and no anonymous client gets one). Callers
// check it before anything starts.
func RequireAdminToken(token string, branches bool) error {
	if !branches || token != "" {
		return nil
	}
	return errs.New(errs.Usage, "serving branches needs an admin token").
		WithHint("with branches the test-database pools take the admin token only (a pool database is a superuser of a cluster run by the branches' OS user): give the server an admin token of 16 or more characters (openssl rand -hex 16)").
		WithCLI("set PGFORK_TOKEN, or give --token-file FILE (mode 0600); pool clients then use http://HOST:PORT/TOKEN/api")
}
