// Package compat runs IntegreSQL's official Go client
// (github.com/allaboutapps/integresql-client-go) against pgfork serve: the
// full flow a suite using it goes through, with the errors the client maps
// from IntegreSQL's status codes. The client's own test file is run too (by
// clients/compat/run.sh, `go test github.com/allaboutapps/integresql-client-go`).
//
// Environment: INTEGRESQL_CLIENT_BASE_URL (the server, as the client reads
// it); PGFORK_COMPAT_MODE (managed or external) and, for external,
// PGFORK_COMPAT_PGPORT (the port of the PostgreSQL server named by PGHOST…).
package compat

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	integresql "github.com/allaboutapps/integresql-client-go"
	_ "github.com/lib/pq"
)

func newClient(t *testing.T) *integresql.Client {
	t.Helper()
	if os.Getenv("INTEGRESQL_CLIENT_BASE_URL") == "" {
		t.Fatal("INTEGRESQL_CLIENT_BASE_URL is not set: run clients/compat/run.sh")
	}
	c, err := integresql.DefaultClientFromEnv()
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// uniqueHash is a hash no other test or run uses.
func uniqueHash(name string) string {
	return fmt.Sprintf("compat%s%d", name, time.Now().UnixNano())
}

func ping(t *testing.T, conn string) *sql.DB {
	t.Helper()
	db, err := sql.Open("postgres", conn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	if err := db.Ping(); err != nil {
		t.Fatalf("connecting to %s: %v", conn, err)
	}
	return db
}

// TestFlow: setup with SetupTemplateWithDBClient by several processes at
// once (one migrates), then per test a database of its own with the
// template's data, isolated from the others, returned and handed out again.
func TestFlow(t *testing.T) {
	ctx := context.Background()
	c := newClient(t)
	hash := uniqueHash("flow")

	var mu sync.Mutex
	migrations := 0
	var wg sync.WaitGroup
	errs := make(chan error, 4)
	for range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs <- c.SetupTemplateWithDBClient(ctx, hash, func(db *sql.DB) error {
				mu.Lock()
				migrations++
				mu.Unlock()
				_, err := db.ExecContext(ctx, `CREATE TABLE pilots (id serial PRIMARY KEY, name text NOT NULL);
					INSERT INTO pilots (name) VALUES ('Mario'), ('Nick');`)
				return err
			})
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatalf("SetupTemplateWithDBClient: %v", err)
		}
	}
	if migrations != 1 {
		t.Fatalf("template migrated %d times, want 1", migrations)
	}

	seen := map[int]bool{}
	var dbs []*sql.DB
	for i := range 3 {
		td, err := c.GetTestDatabase(ctx, hash)
		if err != nil {
			t.Fatalf("GetTestDatabase #%d: %v", i, err)
		}
		if td.TemplateHash != hash {
			t.Errorf("TemplateHash = %q, want %q", td.TemplateHash, hash)
		}
		if seen[td.ID] {
			t.Fatalf("id %d handed out twice", td.ID)
		}
		seen[td.ID] = true
		db := ping(t, td.Config.ConnectionString())
		var n int
		if err := db.QueryRow("SELECT count(*) FROM pilots").Scan(&n); err != nil || n != 2 {
			t.Fatalf("test database %d: pilots = %d (%v), want the template's 2", td.ID, n, err)
		}
		if _, err := db.Exec("INSERT INTO pilots (name) VALUES ($1)", "test"+strconv.Itoa(i)); err != nil {
			t.Fatal(err)
		}
		dbs = append(dbs, db)
	}
	for i, db := range dbs {
		var n int
		if err := db.QueryRow("SELECT count(*) FROM pilots").Scan(&n); err != nil || n != 3 {
			t.Fatalf("test database #%d sees %d pilots (%v), want 3: its own write only", i, n, err)
		}
	}
	for id := range seen {
		if err := c.ReturnTestDatabase(ctx, hash, id); err != nil {
			t.Fatalf("ReturnTestDatabase(%d): %v", id, err)
		}
	}
	td, err := c.GetTestDatabase(ctx, hash)
	if err != nil {
		t.Fatalf("GetTestDatabase after returning: %v", err)
	}
	ping(t, td.Config.ConnectionString())
}

// TestErrors: the errors the client maps from status codes, in the
// situations where IntegreSQL gives them.
func TestErrors(t *testing.T) {
	ctx := context.Background()
	c := newClient(t)
	hash := uniqueHash("errors")

	if _, err := c.GetTestDatabase(ctx, hash); !errors.Is(err, integresql.ErrTemplateNotFound) {
		t.Errorf("GetTestDatabase(unknown hash) = %v, want ErrTemplateNotFound (404)", err)
	}
	if err := c.FinalizeTemplate(ctx, hash); !errors.Is(err, integresql.ErrTemplateNotFound) {
		t.Errorf("FinalizeTemplate(unknown hash) = %v, want ErrTemplateNotFound (404)", err)
	}
	if _, err := c.InitializeTemplate(ctx, hash); err != nil {
		t.Fatal(err)
	}
	if _, err := c.InitializeTemplate(ctx, hash); !errors.Is(err, integresql.ErrTemplateAlreadyInitialized) {
		t.Errorf("second InitializeTemplate = %v, want ErrTemplateAlreadyInitialized (423)", err)
	}
	if err := c.DiscardTemplate(ctx, hash); err != nil {
		t.Fatalf("DiscardTemplate: %v", err)
	}
	// IntegreSQL v1.1.0 forgets a discarded template (manager.DiscardTemplateDatabase
	// pops it): 404 from then on, ErrTemplateNotFound in this client.
	if err := c.FinalizeTemplate(ctx, hash); !errors.Is(err, integresql.ErrTemplateNotFound) {
		t.Errorf("FinalizeTemplate after DiscardTemplate = %v, want ErrTemplateNotFound (404)", err)
	}
	if _, err := c.GetTestDatabase(ctx, hash); !errors.Is(err, integresql.ErrTemplateNotFound) {
		t.Errorf("GetTestDatabase after DiscardTemplate = %v, want ErrTemplateNotFound (404)", err)
	}
	// Forgotten, so it can be initialized again.
	if _, err := c.InitializeTemplate(ctx, hash); err != nil {
		t.Errorf("InitializeTemplate after DiscardTemplate = %v, want a new template", err)
	}
}

// TestUnusualHashes: IntegreSQL accepts any printable hash (the JavaScript
// client sends sha1 hex; users send versions and other keys).
func TestUnusualHashes(t *testing.T) {
	ctx := context.Background()
	c := newClient(t)
	suffix := strconv.FormatInt(time.Now().UnixNano(), 36)
	for _, h := range []string{"v1.2.3-" + suffix, "abc:def-" + suffix} {
		if err := c.SetupTemplate(ctx, h, func(string) error { return nil }); err != nil {
			t.Fatalf("SetupTemplate(%q): %v", h, err)
		}
		td, err := c.GetTestDatabase(ctx, h)
		if err != nil {
			t.Fatalf("GetTestDatabase(%q): %v", h, err)
		}
		ping(t, td.Config.ConnectionString())
	}
}

// TestServerMode: in external mode the databases are on the PostgreSQL
// server named by PGHOST/PGPORT/PGUSER/PGPASSWORD, as with IntegreSQL; in
// managed mode on pgfork's own.
func TestServerMode(t *testing.T) {
	ctx := context.Background()
	c := newClient(t)
	hash := uniqueHash("mode")
	if err := c.SetupTemplate(ctx, hash, func(string) error { return nil }); err != nil {
		t.Fatal(err)
	}
	td, err := c.GetTestDatabase(ctx, hash)
	if err != nil {
		t.Fatal(err)
	}
	switch mode := os.Getenv("PGFORK_COMPAT_MODE"); mode {
	case "external":
		want, _ := strconv.Atoi(os.Getenv("PGFORK_COMPAT_PGPORT"))
		if want == 0 {
			t.Fatalf("PGFORK_COMPAT_PGPORT=%q: want the external server's port", os.Getenv("PGFORK_COMPAT_PGPORT"))
		}
		if td.Config.Port != want {
			t.Errorf("the test database is on port %d, not on the port %d of the server PGHOST/PGPORT name", td.Config.Port, want)
		}
		if td.Config.Host != os.Getenv("PGHOST") {
			t.Errorf("test database host %q, want PGHOST %q", td.Config.Host, os.Getenv("PGHOST"))
		}
		if td.Config.Username != os.Getenv("PGUSER") {
			t.Errorf("test database user %q, want PGUSER %q (IntegreSQL hands out the configured role)", td.Config.Username, os.Getenv("PGUSER"))
		}
	case "managed":
	default:
		t.Fatalf("PGFORK_COMPAT_MODE=%q: want managed or external", mode)
	}
}

// TestTimeoutIs500: a test database request for a template that is never
// finalized fails after INTEGRESQL_TEMPLATE_FINALIZE_TIMEOUT_MS (run.sh sets
// 3000) with IntegreSQL's 500, which the client reports as an unexpected
// status; a 503 would read as ErrManagerNotReady.
func TestTimeoutIs500(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	c := newClient(t)
	hash := uniqueHash("timeout")
	if _, err := c.InitializeTemplate(ctx, hash); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.DiscardTemplate(context.Background(), hash) })
	start := time.Now()
	_, err := c.GetTestDatabase(ctx, hash)
	if err == nil || !strings.Contains(err.Error(), "HTTP status 500") {
		t.Fatalf("GetTestDatabase on a template never finalized = %v, want HTTP status 500", err)
	}
	// It waited for the finalize timeout first (3s, with slack for a slow clock).
	if waited := time.Since(start); waited < 2500*time.Millisecond {
		t.Errorf("GetTestDatabase failed after %v, before the 3s finalize timeout: %v", waited, err)
	}
}

// TestWrongMethodIs405: a wrong method on a known path gets 405 with an
// Allow header, as IntegreSQL's router answers.
func TestWrongMethodIs405(t *testing.T) {
	base := strings.TrimRight(os.Getenv("INTEGRESQL_CLIENT_BASE_URL"), "/")
	req, err := http.NewRequest(http.MethodPatch, base+"/v1/templates", nil)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusMethodNotAllowed || resp.Header.Get("Allow") == "" {
		t.Fatalf("PATCH /api/v1/templates: %d, Allow %q; want 405 with Allow", resp.StatusCode, resp.Header.Get("Allow"))
	}
}
