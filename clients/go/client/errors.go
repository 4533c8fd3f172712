package client

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"
)

// Errors the API answers with, to test with errors.Is. Every error from a
// request the server answered is an *APIError, which matches one of these.
var (
	// ErrBadRequest: 400, the server refused the hash, id or body.
	ErrBadRequest = errors.New("bad request")
	// ErrUnauthorized: 401 or 403, a missing or wrong Bearer token (see WithToken).
	ErrUnauthorized = errors.New("unauthorized: missing or wrong token")
	// ErrTemplateNotFound: 404, no template with this hash (initialize it first).
	ErrTemplateNotFound = errors.New("template not found")
	// ErrTestNotFound: 404 from a test database operation, no test database
	// with this id (v2: the hand-out was given back already, or is from before
	// a restart). v1 answers 500 for an unknown id, as IntegreSQL.
	ErrTestNotFound = errors.New("test database not found")
	// ErrTemplateDiscarded: 410 (v2), the template was discarded (its setup
	// failed). v1 answers 404 (ErrTemplateNotFound) instead, as IntegreSQL.
	ErrTemplateDiscarded = errors.New("template was discarded")
	// ErrTemplateAlreadyInitialized: 423 from InitializeTemplate; another caller
	// initialized this template (or is migrating it): just get test databases.
	ErrTemplateAlreadyInitialized = errors.New("template is already initialized")
	// ErrTestDatabaseInUse: 423 from a test database operation.
	ErrTestDatabaseInUse = errors.New("test database is in use")
	// ErrServiceUnavailable: 503, the server is shutting down or cannot reach
	// PostgreSQL, or (v2) a wait for finalize or a ready database timed out or
	// the pool is full; the message says which. v1 answers 500 for the
	// timeouts and the full pool, as IntegreSQL.
	ErrServiceUnavailable = errors.New("service unavailable")
	// ErrManagerNotReady is IntegreSQL's client's name for ErrServiceUnavailable.
	ErrManagerNotReady = ErrServiceUnavailable
	// ErrPoolFull: 507 (v2), insufficient storage: the server's disk is full
	// (a full pool is ErrServiceUnavailable with the counts in the message).
	ErrPoolFull = errors.New("insufficient storage on the server")
)

// APIError is an answer from the server with an unexpected status code.
type APIError struct {
	Op         string // client method, such as "GetTestDatabase"
	StatusCode int
	Message    string // the server's message, if it sent one
}

// Error describes the failure with the server's own message.
func (e *APIError) Error() string {
	msg := e.Message
	if msg == "" {
		msg = http.StatusText(e.StatusCode)
	}
	s := fmt.Sprintf("pgfork client: %s: %d %s", e.Op, e.StatusCode, msg)
	if e.StatusCode == http.StatusServiceUnavailable && e.Op == "GetTestDatabase" {
		s += " (hint: the template may never have been finalized, e.g. its setup crashed; DiscardTemplate resets it)"
	}
	return s
}

// Is matches the sentinel error for the status code and operation.
func (e *APIError) Is(target error) bool {
	return target != nil && e.sentinel() == target
}

func (e *APIError) sentinel() error {
	testOp := false
	switch e.Op {
	case "Unlock", "Recreate", "UnlockTestDatabase", "RecreateTestDatabase", "ReturnTestDatabase":
		testOp = true
	}
	switch e.StatusCode {
	case http.StatusBadRequest:
		return ErrBadRequest
	case http.StatusUnauthorized, http.StatusForbidden:
		return ErrUnauthorized
	case http.StatusNotFound:
		// "template not found" (pgfork and IntegreSQL) names the template;
		// anything else from a test operation is about the test database.
		if testOp && !strings.Contains(strings.ToLower(e.Message), "template not found") {
			return ErrTestNotFound
		}
		return ErrTemplateNotFound
	case http.StatusGone:
		return ErrTemplateDiscarded
	case http.StatusLocked:
		if testOp {
			return ErrTestDatabaseInUse
		}
		return ErrTemplateAlreadyInitialized
	case http.StatusServiceUnavailable:
		return ErrServiceUnavailable
	case http.StatusInsufficientStorage:
		return ErrPoolFull
	}
	return nil
}

func newAPIError(op string, status int, body []byte) *APIError {
	e := &APIError{Op: op, StatusCode: status}
	var m struct {
		Message string `json:"message"`
		Error   string `json:"error"`
	}
	if json.Unmarshal(body, &m) == nil {
		e.Message = firstNonEmpty(m.Message, m.Error)
	}
	if e.Message == "" {
		e.Message = strings.TrimSpace(string(body))
		if len(e.Message) > 300 {
			e.Message = e.Message[:300] + "…"
		}
	}
	return e
}

// UnreachableError means the request got no HTTP answer at all: no server
// listens at the URL, or the connection broke.
type UnreachableError struct {
	URL string
	Op  string
	Err error
}

// Error says which server could not be reached.
func (e *UnreachableError) Error() string {
	return fmt.Sprintf("pgfork client: %s: no answer from %s (is `pgfork serve` running?): %v", e.Op, e.URL, e.Err)
}

// Unwrap returns the transport error.
func (e *UnreachableError) Unwrap() error { return e.Err }
