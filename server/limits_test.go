package server_test

import (
	"context"
	"fmt"
	"net/http"
	"net/url"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgfork/pgfork/internal/testenv"
)

// migrate initializes template hash over HTTP, creates a table in it as the
// client role and finalizes it.
func (e *env) migrate(t *testing.T, hash string) config {
	t.Helper()
	var tpl struct {
		Database struct{ Config config } `json:"database"`
	}
	e.expect(t, "POST", "/api/v1/templates", map[string]string{"hash": hash}, 200).json(t, &tpl)
	if err := execAs(t, tpl.Database.Config, "CREATE TABLE migrated(x int)"); err != nil {
		t.Fatal(err)
	}
	e.expect(t, "PUT", "/api/v1/templates/"+url.PathEscape(hash), nil, 204)
	return tpl.Database.Config
}

// dbsLike counts the databases whose name starts with prefix.
func (e *env) dbsLike(t *testing.T, prefix string) int {
	t.Helper()
	c, err := pgx.Connect(context.Background(), e.managed.AdminURL)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close(context.Background())
	var n int
	if err := c.QueryRow(context.Background(), "SELECT count(*) FROM pg_database WHERE starts_with(datname, $1)", prefix).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

func waitFor(t *testing.T, what string, d time.Duration, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(d); !cond(); time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %s waiting for %s", d, what)
		}
	}
}

// getEvicting asks for a test database of template hash until it gets
// one: the env's GetTimeout is short (2 s, for a request that must time
// out), while evicting another pool and then making a database take what
// time the machine's load gives them (a request that times out leaves them
// going on).
func (e *env) getEvicting(t *testing.T, hash string) testDB {
	t.Helper()
	var d testDB
	testenv.WaitFor(t, "a test database of "+hash+" once another pool gave up its own", func() bool {
		r := e.do(t, "GET", "/api/v1/templates/"+hash+"/tests", nil)
		switch r.code {
		case 200:
			r.json(t, &d)
			return true
		case 500: // v1's timeout
			return false
		}
		t.Fatalf("GET a test database of %s: status %d (%s)", hash, r.code, r.body)
		return false
	})
	return d
}

// TestGlobalLimitEviction: with --max-databases 2 and two templates, the
// first template's pool fills the limit; a request for the second template
// makes the least recently used idle pool (the first) give up its
// databases and succeeds; while the second template's database is held,
// the first cannot evict it and times out with the reason; once it is
// given back, the first template's request evicts the second in turn.
func TestGlobalLimitEviction(t *testing.T) {
	e := newEnv(t, opts{init: 2, max: 2, maxDatabases: 2, getTimeout: 2 * time.Second})
	e.migrate(t, "lima")
	waitFor(t, "pool lima to fill the limit", 30*time.Second, func() bool { return e.dbsLike(t, "pft_test_lima_") == 2 })
	var a testDB
	e.expect(t, "GET", "/api/v1/templates/lima/tests", nil, 200).json(t, &a)
	e.expect(t, "POST", fmt.Sprintf("/api/v1/templates/lima/tests/%d/unlock", a.ID), nil, 204)

	e.migrate(t, "limb")
	b := e.getEvicting(t, "limb")
	if err := execAs(t, b.Database.Config, "SELECT x FROM migrated"); err != nil {
		t.Fatalf("database of limb: %v", err)
	}
	// limb's copy was made once lima gave up one: the other one's drop
	// may end after it.
	waitFor(t, "lima to give up all its databases (evicted)", testenv.WaitTimeout, func() bool { return e.dbsLike(t, "pft_test_lima_") == 0 })
	if n := e.dbsLike(t, "pft_test_"); n > 2 {
		t.Fatalf("%d test databases exist, limit is 2", n)
	}
	// limb holds one database, so it is not idle: lima must wait and time out.
	r := e.expect(t, "GET", "/api/v2/templates/lima/tests", nil, 503) // v1: 500, as IntegreSQL
	t.Logf("while limb is busy: %s", r.body)
	e.expect(t, "POST", fmt.Sprintf("/api/v1/templates/limb/tests/%d/unlock", b.ID), nil, 204)
	e.getEvicting(t, "lima")
	if n := e.dbsLike(t, "pft_test_"); n > 2 {
		t.Fatalf("%d test databases exist, limit is 2", n)
	}
}

// TestDiscardSurvivesDisconnect: a client that gives up during DELETE
// /api/v1/templates/{hash} must not leave the drop half done. The drop of
// the template database is held up by a lock (COMMENT ON DATABASE in an
// open transaction) while the client disconnects; once the lock goes, the
// drop finishes: no test database, no template database, no state row, and
// the hash can be initialized again.
func TestDiscardSurvivesDisconnect(t *testing.T) {
	e := newEnv(t, opts{init: 2, max: 2})
	e.migrate(t, "gone")
	waitFor(t, "pool to fill", 30*time.Second, func() bool { return e.dbsLike(t, "pft_test_gone_") == 2 })

	ctx := context.Background()
	blocker, err := pgx.Connect(ctx, e.managed.AdminURL)
	if err != nil {
		t.Fatal(err)
	}
	defer blocker.Close(ctx)
	tx, err := blocker.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(ctx, "COMMENT ON DATABASE pft_template_gone IS 'held'"); err != nil {
		t.Fatal(err)
	}
	rctx, cancel := context.WithCancel(ctx)
	req, _ := http.NewRequestWithContext(rctx, "DELETE", e.srv.URL+"/api/v1/templates/gone", nil)
	done := make(chan error, 1)
	go func() {
		res, err := http.DefaultClient.Do(req)
		if err == nil {
			res.Body.Close()
			err = fmt.Errorf("DELETE answered %d before the lock was released", res.StatusCode)
		}
		done <- err
	}()
	// The test databases go first; then the template's drop waits for the lock.
	waitFor(t, "test databases to be dropped", 30*time.Second, func() bool { return e.dbsLike(t, "pft_test_gone_") == 0 })
	time.Sleep(200 * time.Millisecond)
	cancel()
	if err := <-done; err == nil || rctx.Err() == nil {
		t.Fatalf("client was not disconnected: %v", err)
	}
	time.Sleep(300 * time.Millisecond) // the server notices the disconnect
	if err := tx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the template database to be dropped", 30*time.Second, func() bool { return e.dbsLike(t, "pft_template_gone") == 0 })
	var rows int
	waitFor(t, "the state row to go", 10*time.Second, func() bool {
		_ = blocker.QueryRow(ctx, "SELECT count(*) FROM pgfork_serve_templates WHERE hash = 'gone'").Scan(&rows)
		return rows == 0
	})
	e.expect(t, "POST", "/api/v1/templates", map[string]string{"hash": "gone"}, 200)
}
