// Package client talks to a pgfork serve server over its native /api/v2, or
// to IntegreSQL (or pgfork serve's IntegreSQL-compatible /api/v1) with
// WithAPIV1 or a base URL ending in /api/v1.
//
// On v2 the errors say more than IntegreSQL's: ErrTemplateDiscarded (410)
// for a discarded template, ErrServiceUnavailable (503) with the reason
// when no database was ready in time, ErrPoolFull (507) for a full disk,
// ErrTestNotFound (404) for a hand-out given back already; and each hand-out
// has an unguessable TestDatabase.Token that Unlock and Recreate use, so
// only its holder can give it back, once.
//
// The flow, once per test process: compute a hash of everything that shapes the
// database (see HashDir), InitializeTemplate; on success migrate the template
// database and FinalizeTemplate (DiscardTemplate if migrating fails); on
// ErrTemplateAlreadyInitialized another process is doing it. Then, per test,
// GetTestDatabase (it waits for the template to be finalized), use the
// database, and RecreateTestDatabase (or UnlockTestDatabase after a read-only
// test) when done.
package client

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"
)

// DefaultURL is where pgfork serve listens when started without --listen.
const DefaultURL = "http://127.0.0.1:5000"

// Client is a client for the v2 API (or v1, see WithAPIV1). It is safe for
// concurrent use.
type Client struct {
	base  *url.URL // scheme://host[/prefix], without /api/v1
	token string
	http  *http.Client
	api   string // "/api/v2" or "/api/v1"
}

// WithAPIV1 talks IntegreSQL's v1 API instead of pgfork's v2: for an
// IntegreSQL server, or to get IntegreSQL's answers from pgfork serve (404
// after a discard, 500 for a timeout or an unknown test id, integer ids).
func WithAPIV1() Option {
	return func(c *Client) { c.api = apiV1 }
}

const (
	apiV1 = "/api/v1"
	apiV2 = "/api/v2"
)

// Option configures a Client.
type Option func(*Client)

// WithToken sends token as a Bearer token on every request (the token pgfork serve runs with: PGFORK_TOKEN or --token-file).
func WithToken(token string) Option {
	return func(c *Client) { c.token = token }
}

// WithHTTPClient uses hc for requests instead of a default client.
// GetTestDatabase may legitimately wait for a while (the server waits for the
// template to be finalized), so do not set a short Timeout on hc; use contexts.
func WithHTTPClient(hc *http.Client) Option {
	return func(c *Client) { c.http = hc }
}

// New returns a client for the server at baseURL, such as "http://127.0.0.1:5000".
// A trailing "/api" (as in IntegreSQL's INTEGRESQL_CLIENT_BASE_URL) or
// "/api/v2" is accepted and ignored; a trailing "/api/v1" selects the v1 API
// (as WithAPIV1).
func New(baseURL string, opts ...Option) (*Client, error) {
	if baseURL == "" {
		baseURL = DefaultURL
	}
	u, err := url.Parse(baseURL)
	if err != nil {
		var ue *url.Error
		if errors.As(err, &ue) {
			err = ue.Err // it names the whole URL
		}
		return nil, fmt.Errorf("pgfork client: invalid base URL %q: %w", MaskBaseURL(baseURL), err)
	}
	if u.Scheme != "http" && u.Scheme != "https" {
		return nil, fmt.Errorf("pgfork client: base URL %q: scheme must be http or https", MaskBaseURL(baseURL))
	}
	if u.Host == "" {
		return nil, fmt.Errorf("pgfork client: base URL %q has no host", MaskBaseURL(baseURL))
	}
	p := strings.TrimRight(u.Path, "/")
	api := apiV2
	if strings.HasSuffix(p, apiV1) {
		api = apiV1
	}
	p = strings.TrimSuffix(p, "/v1")
	p = strings.TrimSuffix(p, "/v2")
	p = strings.TrimSuffix(p, "/api")
	u.Path, u.RawPath, u.RawQuery, u.Fragment = p, "", "", ""
	c := &Client{base: u, http: &http.Client{}, api: api}
	for _, o := range opts {
		o(c)
	}
	return c, nil
}

// BaseURL returns the server's base URL, without the /api/v… prefix.
func (c *Client) BaseURL() string { return c.base.String() }

// MaskedBaseURL is BaseURL as errors show it: a token or password in it
// replaced by *** (MaskBaseURL).
func (c *Client) MaskedBaseURL() string { return MaskBaseURL(c.base.String()) }

// String describes the client for logs and %v: the base URL masked, never
// the token.
func (c *Client) String() string {
	tok := ""
	if c.token != "" {
		tok = ", token ***"
	}
	return fmt.Sprintf("pgfork client for %s (API %s%s)", c.MaskedBaseURL(), c.api, tok)
}

// GoString is String for %#v.
func (c *Client) GoString() string { return c.String() }

// MaskBaseURL returns rawURL as errors and logs show a base URL: what can
// carry a secret replaced by *** (a userinfo; the path, as pgfork serve
// takes its token as the first path segment, http://host:5000/TOKEN; a
// query, a fragment). Scheme, host and port stay, to say where.
func MaskBaseURL(rawURL string) string {
	u, err := url.Parse(rawURL)
	if err != nil || u.Scheme == "" {
		if scheme, _, ok := strings.Cut(rawURL, "://"); ok && scheme != "" && !strings.ContainsAny(scheme, " /@:?#") {
			return scheme + "://***"
		}
		return "***"
	}
	m := u.Scheme + "://"
	if u.User != nil {
		m += "***@"
	}
	m += u.Host
	if strings.Trim(u.Path, "/") != "" || strings.Trim(u.Opaque, "/") != "" {
		m += "/***"
	}
	if u.RawQuery != "" || u.ForceQuery {
		m += "?***"
	}
	if u.Fragment != "" {
		m += "#***"
	}
	return m
}

// APIVersion is 2, or 1 for a client made WithAPIV1 or with a base URL
// ending in /api/v1.
func (c *Client) APIVersion() int {
	if c.api == apiV1 {
		return 1
	}
	return 2
}

// Healthy reports whether the server answers GET /healthz with 200.
func (c *Client) Healthy(ctx context.Context) error {
	resp, err := c.do(ctx, "Healthy", http.MethodGet, "/healthz", nil, nil)
	if err != nil {
		return err
	}
	return expect(resp, "Healthy", http.StatusOK)
}

// InitializeTemplate registers a new template for hash and returns the
// connection details of its (empty) template database, to be migrated and
// then finalized. It returns ErrTemplateAlreadyInitialized if another caller
// has already initialized (or finalized) a template with this hash.
func (c *Client) InitializeTemplate(ctx context.Context, hash string) (TemplateDatabase, error) {
	var tpl TemplateDatabase
	resp, err := c.do(ctx, "InitializeTemplate", http.MethodPost, c.api+"/templates", map[string]string{"hash": hash}, &tpl)
	if err != nil {
		return TemplateDatabase{}, err
	}
	if err := expect(resp, "InitializeTemplate", http.StatusOK); err != nil {
		return TemplateDatabase{}, err
	}
	tpl.fill(hash)
	return tpl, nil
}

// FinalizeTemplate marks the template for hash as ready: test databases are cloned from it.
func (c *Client) FinalizeTemplate(ctx context.Context, hash string) error {
	resp, err := c.do(ctx, "FinalizeTemplate", http.MethodPut, c.api+"/templates/"+url.PathEscape(hash), nil, nil)
	if err != nil {
		return err
	}
	return expect(resp, "FinalizeTemplate", http.StatusNoContent)
}

// DiscardTemplate drops the template for hash and its test databases; callers
// waiting in GetTestDatabase get ErrTemplateDiscarded (ErrTemplateNotFound on v1).
func (c *Client) DiscardTemplate(ctx context.Context, hash string) error {
	resp, err := c.do(ctx, "DiscardTemplate", http.MethodDelete, c.api+"/templates/"+url.PathEscape(hash), nil, nil)
	if err != nil {
		return err
	}
	return expect(resp, "DiscardTemplate", http.StatusNoContent)
}

// GetTestDatabase hands out a fresh test database cloned from the template for
// hash, waiting (server side) until the template is finalized and a database
// is ready. The database is locked to the caller until it is unlocked or
// recreated. On v2 it fails with ErrTemplateDiscarded when the template was
// discarded (its setup failed) and ErrServiceUnavailable, with the server's
// reason, when no database was ready in time.
func (c *Client) GetTestDatabase(ctx context.Context, hash string) (TestDatabase, error) {
	var td TestDatabase
	resp, err := c.do(ctx, "GetTestDatabase", http.MethodGet, c.api+"/templates/"+url.PathEscape(hash)+"/tests", nil, &td)
	if err != nil {
		return TestDatabase{}, err
	}
	if err := expect(resp, "GetTestDatabase", http.StatusOK); err != nil {
		return TestDatabase{}, err
	}
	td.fill(hash)
	return td, nil
}

// Unlock gives db back to the pool as it is, without recreating it. Use it
// only after a test that did not change the database. On v2 it names the
// hand-out by its Token: a database given back already, or reclaimed by the
// server and handed to someone else, is ErrTestNotFound. On v1 (or for a
// TestDatabase without a Token) it is UnlockTestDatabase(db.ID).
func (c *Client) Unlock(ctx context.Context, db TestDatabase) error {
	return c.handOutOp(ctx, "Unlock", db, "/unlock")
}

// Recreate gives db back to be recreated from the template (in the
// background) before it is handed out again. It names the hand-out as Unlock does.
func (c *Client) Recreate(ctx context.Context, db TestDatabase) error {
	return c.handOutOp(ctx, "Recreate", db, "/recreate")
}

// Keep keeps db as it is for inspection (its test failed): pgfork serve
// no longer counts it against the pool's maximum, keeps it across a
// restart, and drops the oldest kept beyond its --kept-max. Giving it back
// later (Recreate, Unlock) drops it. It names the hand-out as Unlock does;
// IntegreSQL has no such call (an error: the database stays handed out).
func (c *Client) Keep(ctx context.Context, db TestDatabase) error {
	return c.handOutOp(ctx, "Keep", db, "/keep")
}

func (c *Client) handOutOp(ctx context.Context, op string, db TestDatabase, suffix string) error {
	if c.api == apiV1 || db.Token == "" {
		return c.testOp(ctx, op, http.MethodPost, db.TemplateHash, db.ID, suffix)
	}
	p := apiV2 + "/templates/" + url.PathEscape(db.TemplateHash) + "/tests/" + url.PathEscape(db.Token) + suffix
	resp, err := c.do(ctx, op, http.MethodPost, p, nil, nil)
	if err != nil {
		return err
	}
	return expect(resp, op, http.StatusNoContent)
}

// UnlockTestDatabase returns test database id (TestDatabase.ID, the number in
// its name) to the pool as it is, without recreating it, with IntegreSQL's v1
// semantics whatever the client's API version: an id never handed out is a
// 500, and a late call after the server reclaimed the database gives back the
// next holder's. Prefer Unlock, which names the hand-out.
func (c *Client) UnlockTestDatabase(ctx context.Context, hash string, id int) error {
	return c.testOp(ctx, "UnlockTestDatabase", http.MethodPost, hash, id, "/unlock")
}

// RecreateTestDatabase returns test database id to the pool to be recreated
// from the template (in the background) before it is handed out again, by
// the v1 API as UnlockTestDatabase. Prefer Recreate, which names the hand-out.
func (c *Client) RecreateTestDatabase(ctx context.Context, hash string, id int) error {
	return c.testOp(ctx, "RecreateTestDatabase", http.MethodPost, hash, id, "/recreate")
}

// ReturnTestDatabase calls the deprecated DELETE /api/v1/templates/{hash}/tests/{id},
// an alias of UnlockTestDatabase kept for IntegreSQL compatibility.
func (c *Client) ReturnTestDatabase(ctx context.Context, hash string, id int) error {
	return c.testOp(ctx, "ReturnTestDatabase", http.MethodDelete, hash, id, "")
}

// ResetAllTracking forgets all templates and test databases (DELETE /api/v…/admin/templates).
func (c *Client) ResetAllTracking(ctx context.Context) error {
	resp, err := c.do(ctx, "ResetAllTracking", http.MethodDelete, c.api+"/admin/templates", nil, nil)
	if err != nil {
		return err
	}
	return expect(resp, "ResetAllTracking", http.StatusNoContent)
}

// ListTemplates lists the server's templates with their state and pool
// counts (GET /api/v2/templates; pgfork serve only, not on v1).
func (c *Client) ListTemplates(ctx context.Context) (TemplateList, error) {
	var l TemplateList
	if c.api == apiV1 {
		return l, fmt.Errorf("pgfork client: ListTemplates: needs the v2 API (pgfork serve), this client talks v1")
	}
	resp, err := c.do(ctx, "ListTemplates", http.MethodGet, apiV2+"/templates", nil, &l)
	if err != nil {
		return TemplateList{}, err
	}
	if err := expect(resp, "ListTemplates", http.StatusOK); err != nil {
		return TemplateList{}, err
	}
	return l, nil
}

// testOp is a test database operation by the small id, on the v1 API: v2
// takes only hand-out tokens.
func (c *Client) testOp(ctx context.Context, op, method, hash string, id int, suffix string) error {
	p := apiV1 + "/templates/" + url.PathEscape(hash) + "/tests/" + strconv.Itoa(id) + suffix
	resp, err := c.do(ctx, op, method, p, nil, nil)
	if err != nil {
		return err
	}
	return expect(resp, op, http.StatusNoContent)
}

// response is what do keeps of an HTTP response.
type response struct {
	status int
	body   []byte
}

// do sends a request and reads the whole answer; it decodes a 2xx JSON body into out.
func (c *Client) do(ctx context.Context, op, method, path string, in, out any) (response, error) {
	var body io.Reader
	if in != nil {
		b, err := json.Marshal(in)
		if err != nil {
			return response{}, fmt.Errorf("pgfork client: %s: %w", op, err)
		}
		body = bytes.NewReader(b)
	}
	// path is already escaped; the base has no query or fragment.
	req, err := http.NewRequestWithContext(ctx, method, strings.TrimRight(c.base.String(), "/")+path, body)
	if err != nil {
		return response{}, fmt.Errorf("pgfork client: %s: %w", op, err)
	}
	req.Header.Set("Accept", "application/json")
	if in != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	if c.token != "" {
		req.Header.Set("Authorization", "Bearer "+c.token)
	}
	start := time.Now()
	resp, err := c.http.Do(req)
	if err != nil {
		var ue *url.Error
		if errors.As(err, &ue) { // it names the whole URL
			err = &url.Error{Op: ue.Op, URL: strings.TrimRight(c.MaskedBaseURL(), "/") + path, Err: ue.Err}
		}
		return response{}, &UnreachableError{URL: c.MaskedBaseURL(), Op: op, Err: err}
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if err != nil {
		return response{}, fmt.Errorf("pgfork client: %s: reading response after %s: %w", op, time.Since(start).Round(time.Millisecond), err)
	}
	r := response{status: resp.StatusCode, body: b}
	if out != nil && resp.StatusCode >= 200 && resp.StatusCode < 300 {
		if err := json.Unmarshal(b, out); err != nil {
			return response{}, fmt.Errorf("pgfork client: %s: decoding %d response: %w", op, resp.StatusCode, err)
		}
	}
	return r, nil
}

// expect returns nil if resp has status want, and an *APIError otherwise.
func expect(resp response, op string, want int) error {
	if resp.status == want {
		return nil
	}
	return newAPIError(op, resp.status, resp.body)
}
