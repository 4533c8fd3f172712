package client_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"os"
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
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
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

// TestProtocolFlow walks IntegreSQL's flow end to end: initialize, 423 for a
// second initializer, migrate, finalize, get test databases, recreate,
// unlock, the deprecated return, discard.
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

	if err := c.RecreateTestDatabase(ctx, hash, a.ID); err != nil {
		t.Fatalf("RecreateTestDatabase: %v", err)
	}
	if err := c.UnlockTestDatabase(ctx, hash, b.ID); err != nil {
		t.Fatalf("UnlockTestDatabase: %v", err)
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
		if err := c.ReturnTestDatabase(ctx, hash, d.ID); err != nil {
			t.Fatalf("ReturnTestDatabase (deprecated DELETE): %v", err)
		}
	}

	if err := c.DiscardTemplate(ctx, hash); err != nil {
		t.Fatalf("DiscardTemplate: %v", err)
	}
	_, err = c.GetTestDatabase(ctx, hash)
	if !errors.Is(err, client.ErrTemplateDiscarded) && !errors.Is(err, client.ErrTemplateNotFound) {
		t.Fatalf("GetTestDatabase after discard: err = %v, want ErrTemplateDiscarded or ErrTemplateNotFound", err)
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
	err = c.UnlockTestDatabase(ctx, hash, 987654)
	if !errors.Is(err, client.ErrTestNotFound) && !errors.Is(err, client.ErrTemplateNotFound) {
		t.Errorf("UnlockTestDatabase(unknown id): err = %v, want a 404 error", err)
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
	if err := c.RecreateTestDatabase(ctx, hash, db.ID); err != nil {
		t.Fatalf("RecreateTestDatabase: %v", err)
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
	if !errors.Is(err, client.ErrTemplateDiscarded) && !errors.Is(err, client.ErrTemplateNotFound) {
		t.Fatalf("GetTestDatabase on a discarded template: err = %v, want ErrTemplateDiscarded or ErrTemplateNotFound", err)
	}
	if waited := time.Since(start); waited > 20*time.Second {
		t.Errorf("waiter woke %v after the discard", waited)
	}
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
