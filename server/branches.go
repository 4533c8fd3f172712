package server

import (
	"context"
	"crypto/subtle"
	_ "embed"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"time"

	"github.com/pgfork/pgfork/internal/errs"
)

// Branches is what the /api/v2/sources, /snapshots and /branches routes
// serve (serve hands over the branches package's Manager through an
// adapter). token is the caller's bearer token: it owns what it creates
// and sees only that, unless it is an admin token. Values returned are
// encoded as JSON as they are.
type Branches interface {
	List(token string) any
	Get(token, name string) (any, error)
	Create(ctx context.Context, token string, req BranchRequest) (any, error)
	Reset(ctx context.Context, token, name string) (any, error)
	Start(ctx context.Context, token, name string) (any, error)
	Stop(ctx context.Context, token, name string) (any, error)
	Protect(token, name string, on bool) (any, error)
	Delete(ctx context.Context, token, name string) error
	Snapshot(ctx context.Context, token string, req SnapshotRequest) (any, error)
	DeleteSnapshot(token, name string) error
}

//go:embed branches.html
var branchesPage []byte

// BranchRequest is the body of POST /api/v2/branches: a name and exactly
// one of source, snapshot and from (another branch).
type BranchRequest struct {
	Name       string `json:"name"`
	Source     string `json:"source,omitempty"`
	Snapshot   string `json:"snapshot,omitempty"`
	From       string `json:"from,omitempty"`
	TTLSeconds int64  `json:"ttl_seconds,omitempty"`
	Protected  bool   `json:"protected,omitempty"`
}

// TTL is the request's time to live (0: none).
func (r BranchRequest) TTL() time.Duration { return time.Duration(r.TTLSeconds) * time.Second }

// MaxTTLSeconds is the longest ttl_seconds a branch may be given: ten
// years. (Before, a value whose nanoseconds overflow wrapped around to a
// branch that never expires, as did a negative one: issue 32, F12.)
const MaxTTLSeconds = 10 * 365 * 24 * 3600

// validate refuses numbers out of range, naming the field and the range.
func (r BranchRequest) validate() error {
	if r.TTLSeconds < 0 || r.TTLSeconds > MaxTTLSeconds {
		return badField("ttl_seconds", r.TTLSeconds)
	}
	return nil
}

// SnapshotRequest is the body of POST /api/v2/snapshots (and of
// POST /api/v2/branches/{name}/snapshot, which sets Branch).
type SnapshotRequest struct {
	Name   string `json:"name"`
	Source string `json:"source,omitempty"`
	Branch string `json:"branch,omitempty"`
	Keep   int    `json:"keep,omitempty"`
}

// validate refuses numbers out of range, naming the field and the range.
func (r SnapshotRequest) validate() error {
	if r.Keep < 0 {
		return badField("keep", r.Keep)
	}
	return nil
}

// validator is a request body with range checks.
type validator interface{ validate() error }

// branchToken says whether r carries one of the branch tokens.
func (s *Server) branchToken(r *http.Request) bool {
	t := bearerOf(r)
	if t == "" {
		return false
	}
	ok := false
	for _, bt := range s.cfg.BranchTokens {
		if subtle.ConstantTimeCompare([]byte(t), []byte(bt)) == 1 {
			ok = true
		}
	}
	return ok
}

func bearerOf(r *http.Request) string {
	const prefix = "Bearer "
	h := r.Header.Get("Authorization")
	if len(h) <= len(prefix) || !strings.EqualFold(h[:len(prefix)], prefix) {
		return ""
	}
	return h[len(prefix):]
}

func (s *Server) branchRoutes() {
	b := s.cfg.Branches
	s.handle(Branch, "GET /api/v2/sources", func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, http.StatusOK, b.List(bearerOf(r)))
	})
	s.handle(Branch, "GET /api/v2/branches", func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, http.StatusOK, b.List(bearerOf(r)))
	})
	s.handle(Branch, "GET /api/v2/snapshots", func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, http.StatusOK, b.List(bearerOf(r)))
	})
	s.handle(Branch, "POST /api/v2/branches", func(w http.ResponseWriter, r *http.Request) {
		var req BranchRequest
		if !s.decode(w, r, &req) {
			return
		}
		s.answer(w, r, http.StatusCreated)(b.Create(r.Context(), bearerOf(r), req))
	})
	s.handle(Branch, "GET /api/v2/branches/{name}", func(w http.ResponseWriter, r *http.Request) {
		s.answer(w, r, http.StatusOK)(b.Get(bearerOf(r), r.PathValue("name")))
	})
	s.handle(Branch, "POST /api/v2/branches/{name}/reset", func(w http.ResponseWriter, r *http.Request) {
		s.answer(w, r, http.StatusOK)(b.Reset(r.Context(), bearerOf(r), r.PathValue("name")))
	})
	s.handle(Branch, "POST /api/v2/branches/{name}/start", func(w http.ResponseWriter, r *http.Request) {
		s.answer(w, r, http.StatusOK)(b.Start(r.Context(), bearerOf(r), r.PathValue("name")))
	})
	s.handle(Branch, "POST /api/v2/branches/{name}/stop", func(w http.ResponseWriter, r *http.Request) {
		s.answer(w, r, http.StatusOK)(b.Stop(r.Context(), bearerOf(r), r.PathValue("name")))
	})
	s.handle(Branch, "POST /api/v2/branches/{name}/protect", func(w http.ResponseWriter, r *http.Request) {
		s.answer(w, r, http.StatusOK)(b.Protect(bearerOf(r), r.PathValue("name"), true))
	})
	s.handle(Branch, "DELETE /api/v2/branches/{name}/protect", func(w http.ResponseWriter, r *http.Request) {
		s.answer(w, r, http.StatusOK)(b.Protect(bearerOf(r), r.PathValue("name"), false))
	})
	s.handle(Branch, "POST /api/v2/branches/{name}/snapshot", func(w http.ResponseWriter, r *http.Request) {
		var req SnapshotRequest
		if !s.decode(w, r, &req) {
			return
		}
		req.Source, req.Branch = "", r.PathValue("name")
		s.answer(w, r, http.StatusCreated)(b.Snapshot(r.Context(), bearerOf(r), req))
	})
	s.handle(Branch, "DELETE /api/v2/branches/{name}", func(w http.ResponseWriter, r *http.Request) {
		if err := b.Delete(r.Context(), bearerOf(r), r.PathValue("name")); err != nil {
			s.failBranch(w, r, err)
			return
		}
		w.WriteHeader(http.StatusNoContent)
	})
	s.handle(Branch, "POST /api/v2/snapshots", func(w http.ResponseWriter, r *http.Request) {
		var req SnapshotRequest
		if !s.decode(w, r, &req) {
			return
		}
		s.answer(w, r, http.StatusCreated)(b.Snapshot(r.Context(), bearerOf(r), req))
	})
	s.handle(Branch, "DELETE /api/v2/snapshots/{name}", func(w http.ResponseWriter, r *http.Request) {
		if err := b.DeleteSnapshot(bearerOf(r), r.PathValue("name")); err != nil {
			s.failBranch(w, r, err)
			return
		}
		w.WriteHeader(http.StatusNoContent)
	})
	s.handle(Open, "GET /ui", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/html; charset=utf-8")
		// frame-ancestors: no other site's page may frame this one and
		// trick a click on Delete (issue 32, F14; X-Frame-Options: DENY
		// comes with every answer).
		w.Header().Set("Content-Security-Policy", "default-src 'self'; script-src 'self' 'unsafe-inline'; style-src 'unsafe-inline'; frame-ancestors 'none'")
		_, _ = w.Write(branchesPage)
	})
}

// decode reads a JSON body of at most 64 KiB into v, answering 400 when
// it is not one.
func (s *Server) decode(w http.ResponseWriter, r *http.Request, v any) bool {
	dec := json.NewDecoder(http.MaxBytesReader(w, r.Body, 64<<10))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		var te *json.UnmarshalTypeError
		if errors.As(err, &te) && fieldRanges[te.Field] != "" {
			err = badField(te.Field, strings.TrimPrefix(te.Value, "number "))
		} else {
			err = errs.Wrap(errs.Usage, err, "bad request body")
		}
		s.failBranch(w, r, err)
		return false
	}
	if vv, ok := v.(validator); ok {
		if err := vv.validate(); err != nil {
			s.failBranch(w, r, err)
			return false
		}
	}
	return true
}

// fieldRanges are the numbers of the branch API's bodies and what they take.
var fieldRanges = map[string]string{
	"ttl_seconds": fmt.Sprintf("0 (never expires) to %d (ten years)", MaxTTLSeconds),
	"keep":        "0 (keep every snapshot) or more",
}

// badField is the 400 of a body field out of range.
func badField(field string, v any) error {
	return errs.New(errs.Usage, "%s %v is out of range", field, v).WithHint("give a whole number of %s", fieldRanges[field])
}

// failBranch answers a branch route's error: StatusOf, except that a
// refusal of the caller (a quota, errs.Permission) is 403, not a fault of
// the server's, and a name taken is 409 Conflict (IntegreSQL's 423 stays
// on the template routes). Names are shared by every token: the answer is
// the same whether the caller or another token holds the name, and says
// nothing of its owner (issue 32, F12).
func (s *Server) failBranch(w http.ResponseWriter, r *http.Request, err error) {
	switch errs.KindOf(err) {
	case errs.Permission:
		writeError(w, http.StatusForbidden, err.Error()+" (hint: "+errs.HintOf(err)+")")
		return
	case errs.Exists:
		s.metrics.errors.WithLabelValues(r.Pattern, http.StatusText(http.StatusConflict)).Inc()
		writeError(w, http.StatusConflict, err.Error()+" (hint: names are shared by every token; choose another name)")
		return
	}
	s.fail(v2, w, r, err)
}

// answer writes a result or the error.
func (s *Server) answer(w http.ResponseWriter, r *http.Request, code int) func(any, error) {
	return func(v any, err error) {
		if err != nil {
			s.failBranch(w, r, err)
			return
		}
		writeJSON(w, code, v)
	}
}
