// Package server serves pgfork's pools over HTTP, speaking IntegreSQL's v1
// API (so IntegreSQL's own clients work unchanged) plus health, Prometheus
// metrics and an OpenAPI document.
package server

import (
	"context"
	"crypto/subtle"
	_ "embed"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net"
	"net/http"
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
	Conn    ConnInfo // host/port/user/password handed to clients
	// Token, when set, must come as "Authorization: Bearer <token>" on every
	// request except /healthz.
	Token    string
	Logger   *slog.Logger // nil: discard
	Registry *prometheus.Registry
	Metrics  *Metrics // from NewMetrics; nil: a fresh one on Registry
}

// Server is the HTTP handler.
type Server struct {
	cfg     Config
	log     *slog.Logger
	mux     *http.ServeMux
	metrics *Metrics
}

// New returns the server's handler.
func New(cfg Config) *Server {
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	if cfg.Registry == nil {
		cfg.Registry = prometheus.NewRegistry()
	}
	s := &Server{cfg: cfg, log: cfg.Logger, mux: http.NewServeMux()}
	s.metrics = cfg.Metrics
	if s.metrics == nil {
		s.metrics = NewMetrics(cfg.Registry)
	}
	s.metrics.attach(cfg.Manager)
	m := s.mux
	m.HandleFunc("POST /api/v1/templates", s.initialize)
	m.HandleFunc("PUT /api/v1/templates/{hash}", s.finalize)
	m.HandleFunc("DELETE /api/v1/templates/{hash}", s.discard)
	m.HandleFunc("GET /api/v1/templates/{hash}/tests", s.getTest)
	m.HandleFunc("POST /api/v1/templates/{hash}/tests/{id}/unlock", s.unlock)
	m.HandleFunc("DELETE /api/v1/templates/{hash}/tests/{id}", s.unlock) // deprecated alias
	m.HandleFunc("POST /api/v1/templates/{hash}/tests/{id}/recreate", s.recreate)
	m.HandleFunc("DELETE /api/v1/admin/templates", s.resetAll)
	m.HandleFunc("GET /api/openapi.json", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write(openAPI)
	})
	m.Handle("GET /metrics", promhttp.HandlerFor(cfg.Registry, promhttp.HandlerOpts{}))
	m.HandleFunc("GET /healthz", s.healthz)
	m.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		writeError(w, http.StatusNotFound, "not found")
	})
	return s
}

// ServeHTTP checks the token and routes the request.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	// IntegreSQL's router adds trailing slashes; accept both forms.
	if len(r.URL.Path) > 1 && strings.HasSuffix(r.URL.Path, "/") {
		r.URL.Path = strings.TrimRight(r.URL.Path, "/")
	}
	if s.cfg.Token != "" && r.URL.Path != "/healthz" && !s.authorized(r) {
		w.Header().Set("WWW-Authenticate", `Bearer realm="pgfork"`)
		writeError(w, http.StatusUnauthorized, "missing or wrong bearer token")
		return
	}
	start := time.Now()
	rw := &statusWriter{ResponseWriter: w, status: http.StatusOK}
	s.mux.ServeHTTP(rw, r)
	s.log.Debug("request", "method", r.Method, "path", r.URL.Path, "status", rw.status, "elapsed", time.Since(start))
}

func (s *Server) authorized(r *http.Request) bool {
	h := r.Header.Get("Authorization")
	const prefix = "Bearer "
	if len(h) <= len(prefix) || !strings.EqualFold(h[:len(prefix)], prefix) {
		return false
	}
	return subtle.ConstantTimeCompare([]byte(h[len(prefix):]), []byte(s.cfg.Token)) == 1
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
}

// database is the config a client gets: the server's connection info,
// or, with cluster isolation, the host and port of the database's own
// cluster.
func (s *Server) database(hash string, ep pool.Endpoint) database {
	c := s.cfg.Conn
	host, port := c.Host, c.Port
	if ep.Port != 0 {
		host, port = ep.Host, ep.Port
	}
	return database{TemplateHash: hash, Config: dbConfig{Host: host, Port: port, Username: c.Username,
		Password: c.Password, Database: ep.Database, AdditionalParams: c.Params}}
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

// maxBody bounds request bodies (a hash is at most 64 bytes).
const maxBody = 4 << 10

func (s *Server) initialize(w http.ResponseWriter, r *http.Request) {
	var body struct {
		Hash *string `json:"hash"`
	}
	dec := json.NewDecoder(http.MaxBytesReader(w, r.Body, maxBody))
	if err := dec.Decode(&body); err != nil {
		writeError(w, http.StatusBadRequest, "request body must be JSON: {\"hash\": \"...\"}")
		return
	}
	if body.Hash == nil || *body.Hash == "" {
		writeError(w, http.StatusBadRequest, "hash is required")
		return
	}
	if !pool.ValidHash(*body.Hash) {
		writeError(w, http.StatusBadRequest, "invalid hash: use 1-64 characters A-Z a-z 0-9 _ -")
		return
	}
	t, err := s.cfg.Manager.InitializeTemplate(r.Context(), *body.Hash)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, templateResponse{TemplateHash: t.Hash, Database: s.database(t.Hash, t.Endpoint)})
}

// hashParam validates the {hash} path parameter, answering 400 itself.
func hashParam(w http.ResponseWriter, r *http.Request) (string, bool) {
	h := r.PathValue("hash")
	if !pool.ValidHash(h) {
		writeError(w, http.StatusBadRequest, "invalid hash: use 1-64 characters A-Z a-z 0-9 _ -")
		return "", false
	}
	return h, true
}

func idParam(w http.ResponseWriter, r *http.Request) (int, bool) {
	id, ok := pool.ParseID(r.PathValue("id"))
	if !ok {
		writeError(w, http.StatusBadRequest, "invalid test database ID")
		return 0, false
	}
	return id, true
}

func (s *Server) finalize(w http.ResponseWriter, r *http.Request) {
	h, ok := hashParam(w, r)
	if !ok {
		return
	}
	if err := s.cfg.Manager.FinalizeTemplate(r.Context(), h); err != nil {
		s.fail(w, r, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

func (s *Server) discard(w http.ResponseWriter, r *http.Request) {
	h, ok := hashParam(w, r)
	if !ok {
		return
	}
	// A client that goes away must not leave the drop half done (test
	// databases gone, template left): finish it detached from the request.
	ctx, cancel := detached(r)
	defer cancel()
	if err := s.cfg.Manager.DiscardTemplate(ctx, h); err != nil {
		s.fail(w, r, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

func (s *Server) getTest(w http.ResponseWriter, r *http.Request) {
	h, ok := hashParam(w, r)
	if !ok {
		return
	}
	db, err := s.cfg.Manager.GetTestDatabase(r.Context(), h)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, testResponse{TemplateHash: h, ID: db.ID, Database: s.database(h, db.Endpoint)})
}

func (s *Server) unlock(w http.ResponseWriter, r *http.Request) {
	s.giveBack(w, r, s.cfg.Manager.Unlock)
}

func (s *Server) recreate(w http.ResponseWriter, r *http.Request) {
	s.giveBack(w, r, s.cfg.Manager.Recreate)
}

// giveBack handles the routes that return a test database (unlock,
// recreate, the deprecated DELETE): validated hash and id, then 204.
func (s *Server) giveBack(w http.ResponseWriter, r *http.Request, do func(ctx context.Context, hash string, id int) error) {
	h, ok := hashParam(w, r)
	if !ok {
		return
	}
	id, ok := idParam(w, r)
	if !ok {
		return
	}
	if err := do(r.Context(), h, id); err != nil {
		s.fail(w, r, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

func (s *Server) resetAll(w http.ResponseWriter, r *http.Request) {
	ctx, cancel := detached(r)
	defer cancel()
	if err := s.cfg.Manager.ResetAll(ctx); err != nil {
		s.fail(w, r, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
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

// StatusOf maps a domain error to an HTTP status code: the one place where
// this happens. The codes are IntegreSQL's in the same situations.
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

func (s *Server) fail(w http.ResponseWriter, r *http.Request, err error) {
	code := StatusOf(err)
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
