// Package server serves pgfork's pools over HTTP, speaking IntegreSQL's v1
// API (so IntegreSQL's own clients work unchanged) plus health, Prometheus
// metrics and an OpenAPI document. It is HTTP only (routes, status codes,
// auth, metrics): it serves a pool.Manager its caller opened over a backend
// (package serve picks one per mode) and imports no storage code.
package server

import (
	"context"
	"crypto/subtle"
	_ "embed"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"mime"
	"net"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/pgfork/pgfork/internal/errs"
	"github.com/pgfork/pgfork/pool"
)

//go:embed openapi.json
var openAPI []byte

// OpenAPI returns the OpenAPI document of the API.
func OpenAPI() []byte { return openAPI }

// Config shapes a Server.
type Config struct {
	Manager *pool.Manager
	Conn    pool.ConnInfo // host/port/user/password handed to clients
	// Token, the admin token, when set, must come on every request except
	// the Open routes (/healthz, /ui), either as "Authorization: Bearer
	// <token>" or as the first segment of the path ("/<token>/api/v1/…",
	// which every IntegreSQL client can be given as its base URL). Who
	// may use which route is decided in access.go.
	Token string
	// AllowFrom, when set, admits only requests from these networks (and
	// from loopback and the Unix socket).
	AllowFrom []*net.IPNet
	Logger    *slog.Logger // nil: discard
	Registry  *prometheus.Registry
	Metrics   *Metrics // from NewMetrics; nil: a fresh one on Registry
	// Branches, when set, is served under /api/v2/{sources,snapshots,branches}
	// and as a web page on /ui/ (branches.go); BranchTokens are the tokens
	// that reach those routes (and only those) besides Token. With
	// Branches the pool routes take Token only, and none at all when it
	// is empty (RequireAdminToken refuses that before a server starts).
	Branches     Branches
	BranchTokens []string
	// AllowedHosts are the host names (no port) a request admitted without
	// a token may name in its Host header besides loopback names and IP
	// addresses ("*": any), and whose pages may send state-changing
	// requests (Origin): the names clients reach the server by, such as a
	// compose service name. Against DNS rebinding (origin.go).
	AllowedHosts []string
	// SocketDir is the managed server's private Unix socket directory,
	// given to clients that ask for it (SocketParam); empty: none.
	SocketDir string
}

// Server is the HTTP handler.
type Server struct {
	cfg      Config
	log      *slog.Logger
	mux      *http.ServeMux
	access   map[string]Access // by mux pattern: who may use each route (access.go)
	metrics  *Metrics
	handouts handouts
	failures authFailures
}

// api is a version of the HTTP API: v1 answers exactly as IntegreSQL
// v1.1.0, v2 is pgfork's native API with richer status codes.
type api int

const (
	v1 api = iota + 1
	v2
)

// New returns the server's handler.
func New(cfg Config) *Server {
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	if cfg.Registry == nil {
		cfg.Registry = prometheus.NewRegistry()
	}
	s := &Server{cfg: cfg, log: cfg.Logger, mux: http.NewServeMux(), access: map[string]Access{}}
	s.handouts.init()
	s.metrics = cfg.Metrics
	if s.metrics == nil {
		s.metrics = NewMetrics(cfg.Registry)
	}
	s.metrics.attach(cfg.Manager)
	for _, v := range []api{v1, v2} {
		p := "/api/v" + strconv.Itoa(int(v))
		s.handle(Pool, "POST "+p+"/templates", s.with(v, s.initialize))
		s.handle(Pool, "PUT "+p+"/templates/{hash}", s.with(v, s.finalize))
		s.handle(Pool, "DELETE "+p+"/templates/{hash}", s.with(v, s.discard))
		s.handle(Pool, "GET "+p+"/templates/{hash}/tests", s.with(v, s.getTest))
		s.handle(Pool, "POST "+p+"/templates/{hash}/tests/{id}/unlock", s.with(v, s.unlock))
		s.handle(Pool, "POST "+p+"/templates/{hash}/tests/{id}/recreate", s.with(v, s.recreate))
		s.handle(Pool, "POST "+p+"/templates/{hash}/tests/{id}/keep", s.with(v, s.keep))
		s.handle(Pool, "DELETE "+p+"/admin/templates", s.with(v, s.resetAll))
	}
	s.handle(Pool, "DELETE /api/v1/templates/{hash}/tests/{id}", s.with(v1, s.unlock)) // deprecated alias
	s.handle(Pool, "GET /api/v2/templates", s.listTemplates)
	s.handle(Info, "GET /api/openapi.json", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write(openAPI)
	})
	s.handle(Info, "GET /metrics", promhttp.HandlerFor(cfg.Registry, promhttp.HandlerOpts{}).ServeHTTP)
	s.handle(Open, "GET /healthz", s.healthz)
	if cfg.Branches != nil {
		s.branchRoutes()
	}
	return s
}

// with binds a handler to an API version.
func (s *Server) with(v api, h func(api, http.ResponseWriter, *http.Request)) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) { h(v, w, r) }
}

// ServeHTTP checks access and routes the request.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	securityHeaders(w.Header())
	if !s.allowed(r) {
		// Close the connection: a rejected client must not hold one of
		// the server's connection slots with keep-alive (issue 19, F12).
		w.Header().Set("Connection", "close")
		writeError(w, http.StatusForbidden, "requests from this address are not allowed (see --allow-from)")
		return
	}
	tokenInPath := false
	if s.cfg.Token != "" {
		if rest, ok := s.stripPathToken(r.URL.Path); ok {
			r.URL.Path, r.URL.RawPath, tokenInPath = rest, "", true
			// The branch routes know their caller by its bearer: the admin
			// token in the path is that caller (it used to act as the
			// anonymous owner there).
			r.Header.Set("Authorization", "Bearer "+s.cfg.Token)
		}
	}
	// IntegreSQL's router adds trailing slashes; accept both forms.
	if len(r.URL.Path) > 1 && strings.HasSuffix(r.URL.Path, "/") {
		r.URL.Path = strings.TrimRight(r.URL.Path, "/")
		r.URL.RawPath = ""
	}
	// Who may use the route is its Access (access.go), the one place
	// that decides it.
	access, pattern := s.route(r)
	admin := s.cfg.Token != "" && (tokenInPath || s.bearer(r))
	branch := s.cfg.Branches != nil && s.branchToken(r)
	if !s.admits(access, admin, branch) {
		s.refuse(w, r, access)
		return
	}
	withToken := admin || branch
	// No browser reaches the Unix socket, and its clients name anything
	// in Host (requests-unixsocket: the socket's path, escaped).
	if !withToken && access != Open && !unixClient(r) && !s.hostAllowed(r.Host) {
		w.Header().Set("Connection", "close")
		writeError(w, http.StatusMisdirectedRequest, "this server does not answer to host "+strconv.Quote(hostOnly(r.Host))+
			" without a token (protection against DNS rebinding): use localhost or an IP address, allow the name with --allowed-host "+
			hostOnly(r.Host)+" (env PGFORK_ALLOWED_HOSTS), or send the token")
		return
	}
	if crossSite(r) && !(access == Open || pattern == "GET /api/openapi.json") {
		// A GET hands out a test database too: another site's page may
		// not send even that (browsers name it in Sec-Fetch-Site).
		w.Header().Set("Connection", "close")
		writeError(w, http.StatusForbidden, "cross-site request refused: a page of another site may not use this server")
		return
	}
	if stateChanging(r.Method) && !s.sameOrigin(r) {
		w.Header().Set("Connection", "close")
		writeError(w, http.StatusForbidden, "cross-origin request refused: Origin "+strconv.Quote(r.Header.Get("Origin"))+
			" is not this server's (a page of another site may not change it); allow a name the server is reached by with --allowed-host (env PGFORK_ALLOWED_HOSTS)")
		return
	}
	start := time.Now()
	rw := &statusWriter{ResponseWriter: w, status: http.StatusOK}
	if pattern == "" {
		s.noRoute(rw, r)
	} else {
		s.mux.ServeHTTP(rw, r)
	}
	s.log.Debug("request", "method", r.Method, "path", r.URL.Path, "status", rw.status, "elapsed", time.Since(start))
}

// refuseToken answers a request without a token it needs: 401, or 429
// once an address has sent too many wrong ones.
func (s *Server) refuseToken(w http.ResponseWriter, r *http.Request, a Access) {
	w.Header().Set("Connection", "close")
	if wait := s.failures.fail(remoteIP(r)); wait > 0 {
		// Too many wrong tokens from this address: guessing is slowed
		// down to a handful a minute (issue 19, F13); the right token
		// is still let through.
		w.Header().Set("Retry-After", strconv.Itoa(int(wait.Seconds())+1))
		writeError(w, http.StatusTooManyRequests, "too many requests with a wrong token from this address; wait and send the right token")
		return
	}
	w.Header().Set("WWW-Authenticate", `Bearer realm="pgfork"`)
	switch {
	case a == Branch || s.cfg.Token == "":
		writeError(w, http.StatusUnauthorized, "missing or wrong token: the branch routes need 'Authorization: Bearer <token>' with a branch token or the admin token of this server")
	case s.cfg.Branches != nil:
		writeError(w, http.StatusUnauthorized, "missing or wrong token: send the admin token as 'Authorization: Bearer <token>' or use http://HOST:PORT/<token>/api as the base URL (a branch token reaches the branch routes only)")
	default:
		writeError(w, http.StatusUnauthorized, "missing or wrong token: send 'Authorization: Bearer <token>' or use http://HOST:PORT/<token>/api as the base URL")
	}
}

// noRoute answers a request no route takes: 405 with Allow when the path
// exists for other methods, else 404, in the JSON error shape.
func (s *Server) noRoute(w http.ResponseWriter, r *http.Request) {
	rec := &headerRecorder{h: http.Header{}}
	s.mux.ServeHTTP(rec, r) // the mux's own 404 or 405 with its Allow header
	if rec.code == http.StatusMethodNotAllowed {
		w.Header().Set("Allow", rec.h.Get("Allow"))
		writeError(w, http.StatusMethodNotAllowed, "method "+r.Method+" is not allowed here; allowed: "+rec.h.Get("Allow"))
		return
	}
	writeError(w, http.StatusNotFound, "not found")
}

// headerRecorder keeps the status and headers of the mux's fallback
// answers and drops their plain-text body.
type headerRecorder struct {
	h    http.Header
	code int
}

func (r *headerRecorder) Header() http.Header         { return r.h }
func (r *headerRecorder) Write(b []byte) (int, error) { return len(b), nil }
func (r *headerRecorder) WriteHeader(code int)        { r.code = code }

// stripPathToken removes a leading "/<token>" from path.
func (s *Server) stripPathToken(path string) (string, bool) {
	seg, rest, _ := strings.Cut(strings.TrimPrefix(path, "/"), "/")
	if subtle.ConstantTimeCompare([]byte(seg), []byte(s.cfg.Token)) != 1 {
		return path, false
	}
	return "/" + rest, true
}

func (s *Server) bearer(r *http.Request) bool {
	h := r.Header.Get("Authorization")
	const prefix = "Bearer "
	if len(h) <= len(prefix) || !strings.EqualFold(h[:len(prefix)], prefix) {
		return false
	}
	return subtle.ConstantTimeCompare([]byte(h[len(prefix):]), []byte(s.cfg.Token)) == 1
}

// allowed applies AllowFrom: loopback and Unix socket clients always pass.
func (s *Server) allowed(r *http.Request) bool {
	if len(s.cfg.AllowFrom) == 0 {
		return true
	}
	if unixClient(r) {
		return true
	}
	host, _, err := net.SplitHostPort(r.RemoteAddr)
	if err != nil {
		return false
	}
	return s.AllowsIP(net.ParseIP(host))
}

// unixClient reports whether r came over the Unix socket (--socket).
func unixClient(r *http.Request) bool { return r.RemoteAddr == "" || r.RemoteAddr == "@" }

// AllowsIP reports whether requests from ip are allowed (loopback always;
// with --allow-from, the networks it names; without, every address). The
// HTTP server's listener asks it to keep connection slots for them
// (HTTPOptions.Allowed).
func (s *Server) AllowsIP(ip net.IP) bool {
	if len(s.cfg.AllowFrom) == 0 {
		return true
	}
	if ip == nil {
		return false
	}
	if ip.IsLoopback() {
		return true
	}
	for _, n := range s.cfg.AllowFrom {
		if n.Contains(ip) {
			return true
		}
	}
	return false
}

type statusWriter struct {
	http.ResponseWriter
	status int
}

func (w *statusWriter) WriteHeader(code int) {
	w.status = code
	w.ResponseWriter.WriteHeader(code)
}

// JSON shapes: exactly IntegreSQL's (pkg/db), plus a top-level templateHash.

type dbConfig struct {
	Host             string            `json:"host"`
	Port             int               `json:"port"`
	Username         string            `json:"username"`
	Password         string            `json:"password"`
	Database         string            `json:"database"`
	AdditionalParams map[string]string `json:"additionalParams,omitempty"`
	// SocketDir is the managed server's Unix socket directory, only for a
	// client that asked for it (withSocket).
	SocketDir string `json:"socketDir,omitempty"`
}

type database struct {
	TemplateHash string   `json:"templateHash"`
	Config       dbConfig `json:"config"`
}

type templateResponse struct {
	TemplateHash string   `json:"templateHash"`
	Database     database `json:"database"`
}

type testResponse struct {
	TemplateHash string   `json:"templateHash"`
	ID           int      `json:"id"`
	Database     database `json:"database"`
	keptInfo
}

// keptInfo is what a hand-out says of the template's kept databases
// (POST …/keep): how many, and a line for the test output once they pile
// up (more than half the cap), so that a client can print it.
type keptInfo struct {
	Kept    int    `json:"kept,omitempty"`
	Warning string `json:"warning,omitempty"`
}

// keptInfoOf describes db's template's kept databases.
func keptInfoOf(db pool.TestDatabase) keptInfo {
	k := keptInfo{Kept: db.Kept}
	if db.Kept > db.KeptMax/2 {
		k.Warning = fmt.Sprintf("pgfork: %d databases of failed tests are kept for inspection (template %s; at most %d, the oldest is dropped beyond that): "+
			"give them back when done (POST …/recreate), or restart serve with --kept-max", db.Kept, db.Hash, db.KeptMax)
	}
	return k
}

// testResponseV2 is the native API's hand-out: id is unguessable, number
// is the database's small id (as in its name).
type testResponseV2 struct {
	TemplateHash string   `json:"templateHash"`
	ID           string   `json:"id"`
	Number       int      `json:"number"`
	Database     database `json:"database"`
	keptInfo
}

// database is the config a client gets: the server's connection info,
// or, with a cluster per test, the host and port of the database's own
// cluster; and, when r asks for it (SocketParam), that server's socket
// directory.
func (s *Server) database(r *http.Request, hash string, ep pool.Endpoint) database {
	c := s.cfg.Conn
	host, port, sock := c.Host, c.Port, s.cfg.SocketDir
	if ep.Port != 0 {
		host, port, sock = ep.Host, ep.Port, ep.SocketDir
	}
	d := database{TemplateHash: hash, Config: dbConfig{Host: host, Port: port, Username: c.Username,
		Password: c.Password, Database: ep.Database, AdditionalParams: c.Params}}
	if r.URL.Query().Get(SocketParam) == "1" {
		d.Config.SocketDir = sock
	}
	return d
}

// DropTimeout bounds drops that run detached from their request (discard,
// admin reset).
const DropTimeout = 2 * time.Minute

// detached returns a context for work that must finish even when the
// client disconnects: it keeps the request's values, not its cancellation,
// and ends after DropTimeout.
func detached(r *http.Request) (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.WithoutCancel(r.Context()), DropTimeout)
}

// maxBody bounds request bodies (a hash is at most pool.MaxHashLen bytes,
// JSON-escaped up to six times that).
const maxBody = 8 << 10

// initHash reads the hash of an initialize request: JSON {"hash": "…"} as
// IntegreSQL's clients send, or a form (hash=…) as integresql-client-python
// sends.
func initHash(w http.ResponseWriter, r *http.Request) (string, string) {
	r.Body = http.MaxBytesReader(w, r.Body, maxBody)
	ct, _, _ := mime.ParseMediaType(r.Header.Get("Content-Type"))
	if ct == "application/x-www-form-urlencoded" || ct == "multipart/form-data" {
		if err := r.ParseMultipartForm(maxBody); err != nil && !errors.Is(err, http.ErrNotMultipart) {
			return "", "request body is not a valid form"
		}
		return r.PostFormValue("hash"), ""
	}
	var body struct {
		Hash *string `json:"hash"`
	}
	if err := json.NewDecoder(r.Body).Decode(&body); err != nil {
		return "", "request body must be JSON: {\"hash\": \"...\"}"
	}
	if body.Hash == nil {
		return "", ""
	}
	return *body.Hash, ""
}

func (s *Server) initialize(v api, w http.ResponseWriter, r *http.Request) {
	h, bad := initHash(w, r)
	if bad != "" {
		writeError(w, http.StatusBadRequest, bad)
		return
	}
	if h == "" {
		writeError(w, http.StatusBadRequest, "hash is required")
		return
	}
	if !pool.ValidHash(h) {
		writeError(w, http.StatusBadRequest, badHash)
		return
	}
	t, err := s.cfg.Manager.InitializeTemplate(r.Context(), h)
	if err != nil {
		s.fail(v, w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, templateResponse{TemplateHash: t.Hash, Database: s.database(r, t.Hash, t.Endpoint)})
}

const badHash = "invalid hash: use 1-1024 bytes of printable UTF-8 (no control characters)"

// hashParam validates the {hash} path parameter, answering 400 itself.
func hashParam(w http.ResponseWriter, r *http.Request) (string, bool) {
	h := r.PathValue("hash")
	if !pool.ValidHash(h) {
		writeError(w, http.StatusBadRequest, badHash)
		return "", false
	}
	return h, true
}

func (s *Server) finalize(v api, w http.ResponseWriter, r *http.Request) {
	h, ok := hashParam(w, r)
	if !ok {
		return
	}
	if err := s.cfg.Manager.FinalizeTemplate(r.Context(), h); err != nil {
		s.fail(v, w, r, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

func (s *Server) discard(v api, w http.ResponseWriter, r *http.Request) {
	h, ok := hashParam(w, r)
	if !ok {
		return
	}
	// A client that goes away must not leave the drop half done (test
	// databases gone, template left): finish it detached from the request.
	ctx, cancel := detached(r)
	defer cancel()
	s.handouts.forgetHash(h)
	if err := s.cfg.Manager.DiscardTemplate(ctx, h); err != nil {
		s.fail(v, w, r, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

func (s *Server) getTest(v api, w http.ResponseWriter, r *http.Request) {
	h, ok := hashParam(w, r)
	if !ok {
		return
	}
	db, err := s.cfg.Manager.GetTestDatabase(r.Context(), h)
	if err != nil {
		s.fail(v, w, r, err)
		return
	}
	d := s.database(r, h, db.Endpoint)
	if v == v2 {
		// The native API hands out an unguessable id: only the holder can
		// give the database back, and an id from an earlier hand-out of
		// the same database (or an earlier run) is a 404.
		writeJSON(w, http.StatusOK, testResponseV2{TemplateHash: h, ID: s.handouts.add(h, db.ID), Number: db.ID, Database: d, keptInfo: keptInfoOf(db)})
		return
	}
	s.handouts.end(h, db.ID) // a v1 hand-out ends any v2 id of this database
	writeJSON(w, http.StatusOK, testResponse{TemplateHash: h, ID: db.ID, Database: d, keptInfo: keptInfoOf(db)})
}

func (s *Server) unlock(v api, w http.ResponseWriter, r *http.Request) {
	s.giveBack(v, w, r, s.cfg.Manager.Unlock)
}

func (s *Server) recreate(v api, w http.ResponseWriter, r *http.Request) {
	s.giveBack(v, w, r, s.cfg.Manager.Recreate)
}

// keep keeps a test database for inspection (its test failed): it no
// longer counts against the pool's maximum, has a cap of its own, and
// stays across a restart. Its hand-out id still gives it back (recreate
// or unlock then drop it).
func (s *Server) keep(v api, w http.ResponseWriter, r *http.Request) {
	h, id, ok := s.handOutID(v, w, r)
	if !ok {
		return
	}
	if err := s.cfg.Manager.Keep(r.Context(), h, id); err != nil {
		s.fail(v, w, r, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

// handOutID reads a hand-out route's template hash and test database: the
// v2 hand-out token, or v1's small id. On false it has written the error.
func (s *Server) handOutID(v api, w http.ResponseWriter, r *http.Request) (h string, id int, ok bool) {
	if h, ok = hashParam(w, r); !ok {
		return "", 0, false
	}
	if v == v2 {
		if id, ok = s.handouts.lookup(h, r.PathValue("id")); !ok {
			writeError(w, http.StatusNotFound, "no test database of template "+h+" is handed out under this id (given back already, or handed out before a restart)")
		}
		return h, id, ok
	}
	if id, ok = pool.ParseID(r.PathValue("id")); !ok {
		writeError(w, http.StatusBadRequest, "invalid test database ID")
	}
	return h, id, ok
}

// giveBack handles the routes that return a test database (unlock,
// recreate, the deprecated DELETE): validated hash and id, then 204.
func (s *Server) giveBack(v api, w http.ResponseWriter, r *http.Request, do func(ctx context.Context, hash string, id int) error) {
	h, id, ok := s.handOutID(v, w, r)
	if !ok {
		return
	}
	// Ended before the give-back, not after: once the pool has it back it
	// may hand it out again at once (an unlocked database goes to the next
	// waiter), and ending it afterwards ended that new hand-out instead,
	// whose holder then got 404 and whose database was never given back.
	s.handouts.end(h, id)
	if err := do(r.Context(), h, id); err != nil {
		s.fail(v, w, r, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

func (s *Server) resetAll(v api, w http.ResponseWriter, r *http.Request) {
	ctx, cancel := detached(r)
	defer cancel()
	s.handouts.init()
	if err := s.cfg.Manager.ResetAll(ctx); err != nil {
		s.fail(v, w, r, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

// listTemplates is the native API's listing of templates and their pools.
func (s *Server) listTemplates(w http.ResponseWriter, r *http.Request) {
	ts, total := s.cfg.Manager.Stats()
	type poolJSON struct {
		Hash    string         `json:"templateHash"`
		State   string         `json:"state"`
		ByState map[string]int `json:"databases"`
		Waiters int            `json:"waiters"`
		Total   int            `json:"total"`
		Max     int            `json:"max"`
		Kept    int            `json:"kept"`
		KeptMax int            `json:"keptMax"`
		Demand  int            `json:"demand"`
		Base    int            `json:"base"`
		Warming int            `json:"warming"`
		// Flushing: the pool writes the copies it made to disk (between runs).
		Flushing bool `json:"flushing"`
	}
	out := struct {
		Templates []poolJSON `json:"templates"`
		Databases int        `json:"databases"`
	}{Templates: []poolJSON{}, Databases: total}
	for _, t := range ts {
		pj := poolJSON{Hash: t.Hash, State: templateStateName(t.State), ByState: map[string]int{},
			Waiters: t.Pool.Waiters, Total: t.Pool.Total, Max: t.Pool.Max, Kept: t.Pool.Kept, KeptMax: t.Pool.KeptMax,
			Demand: t.Pool.Demand, Base: t.Pool.Base, Warming: t.Pool.Warming, Flushing: t.Pool.Flushing}
		for _, st := range pool.States {
			pj.ByState[st.String()] = t.Pool.ByState[st]
		}
		out.Templates = append(out.Templates, pj)
	}
	writeJSON(w, http.StatusOK, out)
}

func templateStateName(st pool.TemplateState) string {
	switch st {
	case pool.TemplateInitializing:
		return "initializing"
	case pool.TemplateFinalized:
		return "finalized"
	}
	return "discarded"
}

func (s *Server) healthz(w http.ResponseWriter, r *http.Request) {
	ctx, cancel := context.WithTimeout(r.Context(), 2*time.Second)
	defer cancel()
	ts, total := s.cfg.Manager.Stats()
	if err := s.cfg.Manager.Ping(ctx); err != nil {
		writeJSON(w, http.StatusServiceUnavailable, map[string]any{"status": "unavailable", "error": err.Error()})
		return
	}
	writeJSON(w, http.StatusOK, map[string]any{"status": "ok", "templates": len(ts), "databases": total})
}

// StatusOf maps a domain error to the native API's (v2) HTTP status code:
// 410 for a discarded template, 503 for timeouts and a full pool (the body
// says why), 507 for a full disk.
func StatusOf(err error) int {
	switch {
	case errors.Is(err, pool.ErrTemplateExists):
		return http.StatusLocked // 423
	case errors.Is(err, pool.ErrTemplateDiscarded):
		return http.StatusGone // 410
	case errors.Is(err, pool.ErrTemplateNotFound), errors.Is(err, pool.ErrTestNotFound):
		return http.StatusNotFound
	case errors.Is(err, pool.ErrTimeout), errors.Is(err, pool.ErrClosed):
		return http.StatusServiceUnavailable
	}
	switch errs.KindOf(err) {
	case errs.Usage:
		return http.StatusBadRequest
	case errs.NotFound:
		return http.StatusNotFound
	case errs.Exists:
		return http.StatusLocked
	case errs.Busy, errs.Interrupted:
		return http.StatusServiceUnavailable
	case errs.NoSpace:
		return http.StatusInsufficientStorage
	}
	return http.StatusInternalServerError
}

// StatusOfV1 maps a domain error to the status IntegreSQL v1.1.0 gives in
// the same situation: 404 for an unknown or discarded template, 423 for an
// initialized one, 503 while shutting down, 400 for bad input, and 500 for
// everything else (timeouts, a full pool, an unknown test database id, a
// template not finalized in time); the body still says why.
func StatusOfV1(err error) int {
	if errors.Is(err, pool.ErrClosed) {
		return http.StatusServiceUnavailable
	}
	switch code := StatusOf(err); code {
	case http.StatusGone:
		return http.StatusNotFound
	case http.StatusNotFound:
		if errors.Is(err, pool.ErrTestNotFound) {
			return http.StatusInternalServerError // IntegreSQL: "invalid database index"
		}
		return code
	case http.StatusBadRequest, http.StatusLocked:
		return code
	}
	return http.StatusInternalServerError
}

func (s *Server) fail(v api, w http.ResponseWriter, r *http.Request, err error) {
	code := StatusOf(err)
	if v == v1 {
		code = StatusOfV1(err)
	}
	s.metrics.errors.WithLabelValues(r.Pattern, http.StatusText(code)).Inc()
	if code >= 500 {
		s.log.Warn("request failed", "method", r.Method, "path", r.URL.Path, "status", code, "err", err)
	}
	msg := err.Error()
	if h := errs.HintOf(err); h != "" {
		msg += " (hint: " + h + ")"
	}
	writeError(w, code, msg)
}

// writeError answers {"message": …} as IntegreSQL (echo) does: its clients
// decode the body of error responses too.
func writeError(w http.ResponseWriter, code int, msg string) {
	writeJSON(w, code, map[string]string{"message": msg})
}

func writeJSON(w http.ResponseWriter, code int, v any) {
	w.Header().Set("Content-Type", "application/json; charset=UTF-8")
	w.WriteHeader(code)
	_ = json.NewEncoder(w).Encode(v)
}

// IsLoopback reports whether a listen address only accepts local
// connections (127.0.0.0/8, ::1, localhost).
func IsLoopback(addr string) bool {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		host = addr
	}
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}
