package client_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgfork/pgfork/clients/go/client"
)

// serverClient returns a client for the real server at $PGFORK_URL (or the
// default URL). It skips when PGFORK_URL is unset and nothing answers, and
// fails when PGFORK_URL is set and nothing answers.
func serverClient(t *testing.T) *client.Client {
	t.Helper()
	u := os.Getenv("PGFORK_URL")
	c, err := client.New(u, client.WithToken(os.Getenv("PGFORK_TOKEN")))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second) // a loaded machine's server answers late; none answers at once
	defer cancel()
	err = c.Healthy(ctx)
	var unreachable *client.UnreachableError
	switch {
	case errors.As(err, &unreachable) && u == "":
		t.Skipf("no pgfork server at %s and PGFORK_URL unset; run clients/test.sh or start `pgfork serve`", c.BaseURL())
	case err != nil:
		t.Fatalf("server at %s is not healthy: %v", c.BaseURL(), err)
	}
	return c
}

func randomHash(t *testing.T) string {
	t.Helper()
	b := make([]byte, 16)
	if _, err := rand.Read(b); err != nil {
		t.Fatal(err)
	}
	return hex.EncodeToString(b)
}

func exec(t *testing.T, connString, sql string) {
	t.Helper()
	conn, err := pgx.Connect(t.Context(), connString)
	if err != nil {
		t.Fatalf("connect %s: %v", connString, err)
	}
	defer conn.Close(context.Background())
	if _, err := conn.Exec(t.Context(), sql); err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
}

func queryInt(t *testing.T, connString, sql string) int {
	t.Helper()
	conn, err := pgx.Connect(t.Context(), connString)
	if err != nil {
		t.Fatalf("connect %s: %v", connString, err)
	}
	defer conn.Close(context.Background())
	var n int
	if err := conn.QueryRow(t.Context(), sql).Scan(&n); err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
	return n
}

// TestProtocolFlow walks the flow end to end on the v2 API: initialize, 423
// for a second initializer, migrate, finalize, get test databases (each with
// its own hand-out token), recreate and unlock by token (once only), the
// v1 calls by small id, discard (410 after it).
func TestProtocolFlow(t *testing.T) {
	c := serverClient(t)
	ctx := t.Context()
	hash := randomHash(t)

	tpl, err := c.InitializeTemplate(ctx, hash)
	if err != nil {
		t.Fatalf("InitializeTemplate: %v", err)
	}
	t.Cleanup(func() { _ = c.DiscardTemplate(context.Background(), hash) })
	if tpl.TemplateHash != hash || tpl.Database.TemplateHash != hash {
		t.Errorf("template hash = %q / %q, want %q", tpl.TemplateHash, tpl.Database.TemplateHash, hash)
	}
	cfg := tpl.Config()
	if cfg.Host == "" || cfg.Port == 0 || cfg.Username == "" || cfg.Database == "" {
		t.Fatalf("incomplete template config: %+v", cfg)
	}

	if _, err := c.InitializeTemplate(ctx, hash); !errors.Is(err, client.ErrTemplateAlreadyInitialized) {
		t.Fatalf("second InitializeTemplate: err = %v, want ErrTemplateAlreadyInitialized", err)
	}

	// Both connection string forms reach the template database.
	exec(t, cfg.ConnectionString(), "CREATE TABLE marker (who text NOT NULL)")
	exec(t, cfg.URL(), "INSERT INTO marker VALUES ('template')")

	if err := c.FinalizeTemplate(ctx, hash); err != nil {
		t.Fatalf("FinalizeTemplate: %v", err)
	}
	if _, err := c.InitializeTemplate(ctx, hash); !errors.Is(err, client.ErrTemplateAlreadyInitialized) {
		t.Fatalf("InitializeTemplate after finalize: err = %v, want ErrTemplateAlreadyInitialized", err)
	}

	a, err := c.GetTestDatabase(ctx, hash)
	if err != nil {
		t.Fatalf("GetTestDatabase: %v", err)
	}
	b, err := c.GetTestDatabase(ctx, hash)
	if err != nil {
		t.Fatalf("GetTestDatabase: %v", err)
	}
	if a.TemplateHash != hash || b.TemplateHash != hash {
		t.Errorf("test database hashes %q, %q, want %q", a.TemplateHash, b.TemplateHash, hash)
	}
	if a.ID == b.ID || a.Config().Database == b.Config().Database {
		t.Fatalf("the same database was handed out twice: %+v and %+v", a, b)
	}
	if a.Token == "" || b.Token == "" || a.Token == b.Token {
		t.Fatalf("hand-out tokens %q and %q: want two different ones", a.Token, b.Token)
	}
	if a.Config().Database == cfg.Database {
		t.Fatalf("test database is the template itself: %s", cfg.Database)
	}
	for _, db := range []client.TestDatabase{a, b} {
		if n := queryInt(t, db.Config().URL(), "SELECT count(*) FROM marker WHERE who = 'template'"); n != 1 {
			t.Fatalf("test database %s: %d template rows, want 1", db.Config().Database, n)
		}
	}
	exec(t, a.Config().URL(), "INSERT INTO marker VALUES ('a')")
	if n := queryInt(t, b.Config().URL(), "SELECT count(*) FROM marker"); n != 1 {
		t.Fatalf("write to database a is visible in database b (%d rows)", n)
	}

	if err := c.Recreate(ctx, a); err != nil {
		t.Fatalf("Recreate: %v", err)
	}
	if err := c.Unlock(ctx, b); err != nil {
		t.Fatalf("Unlock: %v", err)
	}
	// A hand-out goes back once: its token is spent.
	if err := c.Unlock(ctx, b); !errors.Is(err, client.ErrTestNotFound) {
		t.Fatalf("second Unlock of one hand-out: err = %v, want ErrTestNotFound", err)
	}
	if err := c.Recreate(ctx, a); !errors.Is(err, client.ErrTestNotFound) {
		t.Fatalf("second Recreate of one hand-out: err = %v, want ErrTestNotFound", err)
	}

	// Whatever comes out next is clean: a's write was recreated away.
	for i := 0; i < 3; i++ {
		d, err := c.GetTestDatabase(ctx, hash)
		if err != nil {
			t.Fatalf("GetTestDatabase #%d: %v", i, err)
		}
		if n := queryInt(t, d.Config().URL(), "SELECT count(*) FROM marker WHERE who <> 'template'"); n != 0 {
			t.Fatalf("database %s handed out with %d rows of an earlier test", d.Config().Database, n)
		}
		// The calls by small id (v1 routes) give back a v2 hand-out too.
		switch i {
		case 0:
			err = c.UnlockTestDatabase(ctx, hash, d.ID)
		case 1:
			err = c.RecreateTestDatabase(ctx, hash, d.ID)
		default:
			err = c.ReturnTestDatabase(ctx, hash, d.ID)
		}
		if err != nil {
			t.Fatalf("giving back #%d by id %d: %v", i, d.ID, err)
		}
	}

	if err := c.DiscardTemplate(ctx, hash); err != nil {
		t.Fatalf("DiscardTemplate: %v", err)
	}
	_, err = c.GetTestDatabase(ctx, hash)
	var apiErr *client.APIError
	if !errors.Is(err, client.ErrTemplateDiscarded) || !errors.As(err, &apiErr) || apiErr.StatusCode != 410 {
		t.Fatalf("GetTestDatabase after discard: err = %v, want 410 ErrTemplateDiscarded", err)
	}
}

// TestAPIV1 checks that a client on the v1 API gets IntegreSQL's answers
// from the same server: integer ids without a token, 404 after a discard.
func TestAPIV1(t *testing.T) {
	v2 := serverClient(t)
	c, err := client.New(v2.BaseURL()+"/api/v1", client.WithToken(os.Getenv("PGFORK_TOKEN")))
	if err != nil {
		t.Fatal(err)
	}
	if c.APIVersion() != 1 {
		t.Fatalf("APIVersion() = %d for a /api/v1 base URL", c.APIVersion())
	}
	ctx := t.Context()
	hash := randomHash(t)
	if _, err := c.InitializeTemplate(ctx, hash); err != nil {
		t.Fatalf("InitializeTemplate: %v", err)
	}
	t.Cleanup(func() { _ = c.DiscardTemplate(context.Background(), hash) })
	if err := c.FinalizeTemplate(ctx, hash); err != nil {
		t.Fatalf("FinalizeTemplate: %v", err)
	}
	db, err := c.GetTestDatabase(ctx, hash)
	if err != nil {
		t.Fatalf("GetTestDatabase: %v", err)
	}
	if db.Token != "" {
		t.Errorf("v1 hand-out has a token %q", db.Token)
	}
	queryInt(t, db.Config().URL(), "SELECT 1")
	if err := c.Recreate(ctx, db); err != nil {
		t.Fatalf("Recreate by id on v1: %v", err)
	}
	if _, err := c.ListTemplates(ctx); err == nil {
		t.Error("ListTemplates on a v1 client: no error")
	}
	if err := c.DiscardTemplate(ctx, hash); err != nil {
		t.Fatalf("DiscardTemplate: %v", err)
	}
	var apiErr *client.APIError
	if _, err := c.GetTestDatabase(ctx, hash); !errors.Is(err, client.ErrTemplateNotFound) || !errors.As(err, &apiErr) || apiErr.StatusCode != 404 {
		t.Fatalf("GetTestDatabase after discard on v1: err = %v, want 404 ErrTemplateNotFound (IntegreSQL's answer)", err)
	}
}

// TestListTemplates: a finalized template shows up with its pool's counts,
// one database in use while it is handed out.
func TestListTemplates(t *testing.T) {
	c := serverClient(t)
	ctx := t.Context()
	hash := randomHash(t)
	if _, err := c.InitializeTemplate(ctx, hash); err != nil {
		t.Fatalf("InitializeTemplate: %v", err)
	}
	t.Cleanup(func() { _ = c.DiscardTemplate(context.Background(), hash) })
	if err := c.FinalizeTemplate(ctx, hash); err != nil {
		t.Fatalf("FinalizeTemplate: %v", err)
	}
	db, err := c.GetTestDatabase(ctx, hash)
	if err != nil {
		t.Fatalf("GetTestDatabase: %v", err)
	}
	l, err := c.ListTemplates(ctx)
	if err != nil {
		t.Fatalf("ListTemplates: %v", err)
	}
	var found *client.TemplateInfo
	for i := range l.Templates {
		if l.Templates[i].TemplateHash == hash {
			found = &l.Templates[i]
		}
	}
	if found == nil {
		t.Fatalf("template %s not listed in %+v", hash, l)
	}
	if found.State != "finalized" || found.Databases["in_use"] != 1 || found.Max < 1 || l.Databases < 1 {
		t.Errorf("listed as %+v (of %d databases), want finalized with 1 in use", *found, l.Databases)
	}
	if err := c.Recreate(ctx, db); err != nil {
		t.Fatalf("Recreate: %v", err)
	}
}

// TestTimeoutIsServiceUnavailable: on v2 a request for a template nobody
// finalizes fails after the server's finalize timeout (clients/test.sh
// starts it with 15s) with 503 and a message saying why.
func TestTimeoutIsServiceUnavailable(t *testing.T) {
	c := serverClient(t)
	ctx, cancel := context.WithTimeout(t.Context(), 3*time.Minute)
	defer cancel()
	hash := randomHash(t)
	if _, err := c.InitializeTemplate(ctx, hash); err != nil {
		t.Fatalf("InitializeTemplate: %v", err)
	}
	t.Cleanup(func() { _ = c.DiscardTemplate(context.Background(), hash) })
	_, err := c.GetTestDatabase(ctx, hash)
	var apiErr *client.APIError
	if !errors.Is(err, client.ErrServiceUnavailable) || !errors.As(err, &apiErr) || apiErr.StatusCode != 503 {
		t.Fatalf("GetTestDatabase on a template never finalized: err = %v, want 503 ErrServiceUnavailable", err)
	}
	if !strings.Contains(strings.ToLower(apiErr.Message), "final") {
		t.Errorf("503 message %q does not say the template was not finalized", apiErr.Message)
	}
}

// TestErrors checks the typed errors for unknown templates and test databases.
func TestErrors(t *testing.T) {
	c := serverClient(t)
	ctx := t.Context()
	unknown := randomHash(t)

	var apiErr *client.APIError
	_, err := c.GetTestDatabase(ctx, unknown)
	if !errors.Is(err, client.ErrTemplateNotFound) || !errors.As(err, &apiErr) || apiErr.StatusCode != 404 {
		t.Errorf("GetTestDatabase(unknown): err = %v, want 404 ErrTemplateNotFound", err)
	}
	if err := c.FinalizeTemplate(ctx, unknown); !errors.Is(err, client.ErrTemplateNotFound) {
		t.Errorf("FinalizeTemplate(unknown): err = %v, want ErrTemplateNotFound", err)
	}
	if err := c.DiscardTemplate(ctx, unknown); !errors.Is(err, client.ErrTemplateNotFound) {
		t.Errorf("DiscardTemplate(unknown): err = %v, want ErrTemplateNotFound", err)
	}
	if err := c.RecreateTestDatabase(ctx, unknown, 0); !errors.Is(err, client.ErrTemplateNotFound) {
		t.Errorf("RecreateTestDatabase(unknown template): err = %v, want ErrTemplateNotFound", err)
	}

	// A known, finalized template with an id it never handed out.
	hash := randomHash(t)
	if _, err := c.InitializeTemplate(ctx, hash); err != nil {
		t.Fatalf("InitializeTemplate: %v", err)
	}
	t.Cleanup(func() { _ = c.DiscardTemplate(context.Background(), hash) })
	if err := c.FinalizeTemplate(ctx, hash); err != nil {
		t.Fatalf("FinalizeTemplate: %v", err)
	}
	// v2: a token it never handed out is a 404.
	err = c.Unlock(ctx, client.TestDatabase{TemplateHash: hash, ID: 1, Token: "0123456789abcdef0123456789abcdef"})
	if !errors.Is(err, client.ErrTestNotFound) || !errors.As(err, &apiErr) || apiErr.StatusCode != 404 {
		t.Errorf("Unlock(unknown token): err = %v, want 404 ErrTestNotFound", err)
	}
	// By small id (v1 route): IntegreSQL's 500 "invalid database index".
	err = c.UnlockTestDatabase(ctx, hash, 987654)
	if !errors.As(err, &apiErr) || apiErr.StatusCode != 500 {
		t.Errorf("UnlockTestDatabase(unknown id): err = %v, want IntegreSQL's 500", err)
	}

	// A hostile hash is refused (400) or not found (404), never a 5xx.
	_, err = c.GetTestDatabase(ctx, "x'; DROP DATABASE postgres; --")
	if !errors.As(err, &apiErr) || (apiErr.StatusCode != 400 && apiErr.StatusCode != 404) {
		t.Errorf("GetTestDatabase(hostile hash): err = %v, want 400 or 404", err)
	}
	_, err = c.InitializeTemplate(ctx, "")
	if !errors.Is(err, client.ErrBadRequest) {
		t.Errorf("InitializeTemplate(\"\"): err = %v, want ErrBadRequest", err)
	}
}

// TestWaitsForFinalize checks that GetTestDatabase blocks until another
// caller finalizes the template.
func TestWaitsForFinalize(t *testing.T) {
	c := serverClient(t)
	ctx := t.Context()
	hash := randomHash(t)
	if _, err := c.InitializeTemplate(ctx, hash); err != nil {
		t.Fatalf("InitializeTemplate: %v", err)
	}
	t.Cleanup(func() { _ = c.DiscardTemplate(context.Background(), hash) })

	const delay = 700 * time.Millisecond
	done := make(chan error, 1)
	go func() {
		time.Sleep(delay)
		done <- c.FinalizeTemplate(ctx, hash)
	}()
	start := time.Now()
	db, err := c.GetTestDatabase(ctx, hash)
	if err != nil {
		t.Fatalf("GetTestDatabase while finalizing: %v", err)
	}
	if waited := time.Since(start); waited < delay/2 {
		t.Errorf("GetTestDatabase returned after %v, before the template was finalized", waited)
	}
	if err := <-done; err != nil {
		t.Fatalf("FinalizeTemplate: %v", err)
	}
	if err := c.Recreate(ctx, db); err != nil {
		t.Fatalf("Recreate: %v", err)
	}
}

// TestDiscardWakesWaiters checks that a caller waiting for a template that is
// then discarded gets an error instead of waiting for its timeout.
func TestDiscardWakesWaiters(t *testing.T) {
	c := serverClient(t)
	ctx := t.Context()
	hash := randomHash(t)
	if _, err := c.InitializeTemplate(ctx, hash); err != nil {
		t.Fatalf("InitializeTemplate: %v", err)
	}
	discarded := make(chan error, 1)
	go func() {
		time.Sleep(500 * time.Millisecond)
		discarded <- c.DiscardTemplate(context.Background(), hash)
	}()
	start := time.Now()
	_, err := c.GetTestDatabase(ctx, hash)
	if derr := <-discarded; derr != nil {
		t.Errorf("DiscardTemplate: %v", derr)
	}
	if !errors.Is(err, client.ErrTemplateDiscarded) {
		t.Fatalf("GetTestDatabase on a template discarded while it waited: err = %v, want ErrTemplateDiscarded (410)", err)
	}
	// ErrTemplateDiscarded, not a timeout's 503: the discard woke the waiter.
	// How long that took is logged, no verdict: a loaded machine stretches it.
	t.Logf("the waiter woke %v after it began waiting (the discard came after 500 ms)", time.Since(start))
}

// TestToken checks that the server refuses requests without the token it
// was started with. It runs only when PGFORK_TOKEN is set (clients/test.sh).
func TestToken(t *testing.T) {
	c := serverClient(t)
	token := os.Getenv("PGFORK_TOKEN")
	if token == "" {
		t.Skip("PGFORK_TOKEN unset: the server was started without --token")
	}
	for name, opts := range map[string][]client.Option{
		"none":  nil,
		"wrong": {client.WithToken(token + "x")},
	} {
		anon, err := client.New(c.BaseURL(), opts...)
		if err != nil {
			t.Fatal(err)
		}
		var apiErr *client.APIError
		_, err = anon.GetTestDatabase(t.Context(), randomHash(t))
		if !errors.Is(err, client.ErrUnauthorized) || !errors.As(err, &apiErr) || apiErr.StatusCode != 401 {
			t.Errorf("token %s: err = %v, want 401 ErrUnauthorized", name, err)
		}
	}
}

// TestResetAllTracking forgets every template on the server, so it runs only
// when PGFORK_TEST_RESET=1 (clients/test.sh runs it alone, last).
func TestResetAllTracking(t *testing.T) {
	c := serverClient(t)
	if os.Getenv("PGFORK_TEST_RESET") != "1" {
		t.Skip("PGFORK_TEST_RESET != 1: resetting would break other suites using the server")
	}
	ctx := t.Context()
	hash := randomHash(t)
	if _, err := c.InitializeTemplate(ctx, hash); err != nil {
		t.Fatalf("InitializeTemplate: %v", err)
	}
	if err := c.FinalizeTemplate(ctx, hash); err != nil {
		t.Fatalf("FinalizeTemplate: %v", err)
	}
	if _, err := c.GetTestDatabase(ctx, hash); err != nil {
		t.Fatalf("GetTestDatabase: %v", err)
	}
	if err := c.ResetAllTracking(ctx); err != nil {
		t.Fatalf("ResetAllTracking: %v", err)
	}
	if _, err := c.GetTestDatabase(ctx, hash); !errors.Is(err, client.ErrTemplateNotFound) {
		t.Fatalf("GetTestDatabase after reset: err = %v, want ErrTemplateNotFound", err)
	}
	if _, err := c.InitializeTemplate(ctx, hash); err != nil {
		t.Fatalf("InitializeTemplate after reset: %v (want a fresh template)", err)
	}
	if err := c.DiscardTemplate(ctx, hash); err != nil {
		t.Fatalf("DiscardTemplate: %v", err)
	}
}
