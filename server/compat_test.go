package server_test

import (
	"context"
	"fmt"
	"net/http"
	"net/url"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgfork/pgfork/internal/testenv"
	"github.com/pgfork/pgfork/pool"
)

// ready returns how many databases of template hash are ready.
func (e *env) ready(hash string) int {
	ts, _ := e.mgr.Stats()
	for _, s := range ts {
		if s.Hash == hash {
			return s.Pool.ByState[pool.Ready]
		}
	}
	return 0
}

// TestV1LikeIntegreSQL: the v1 API answers as IntegreSQL v1.1.0 does —
// 405 with Allow for a wrong method, 500 (with the reason) for an
// exhausted pool, small test ids reused with their database names, a
// form-encoded initialize (integresql-client-python) — and takes every
// printable hash, each under its own database.
func TestV1LikeIntegreSQL(t *testing.T) {
	e := newEnv(t, opts{init: 3, max: 3, getTimeout: 2 * time.Second})

	for _, c := range []struct{ method, path, allow string }{
		{"PATCH", "/api/v1/templates", "POST"},
		{"GET", "/api/v1/templates/abc", "DELETE, PUT"},
		{"PUT", "/api/v1/templates/abc/tests", "GET, HEAD"},
	} {
		req, _ := http.NewRequest(c.method, e.srv.URL+c.path, nil)
		res, err := e.srv.Client().Do(req)
		if err != nil {
			t.Fatal(err)
		}
		res.Body.Close()
		if res.StatusCode != 405 || res.Header.Get("Allow") != c.allow {
			t.Errorf("%s %s: %d Allow %q, want 405 Allow %q", c.method, c.path, res.StatusCode, res.Header.Get("Allow"), c.allow)
		}
	}

	// integresql-client-python posts the hash as a form.
	req, _ := http.NewRequest("POST", e.srv.URL+"/api/v1/templates", strings.NewReader("hash=formhash"))
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	res, err := e.srv.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	res.Body.Close()
	if res.StatusCode != 200 {
		t.Fatalf("form-encoded initialize: %d", res.StatusCode)
	}

	const h = "0123456789abcdef0123456789abcdef"
	e.migrate(t, h)
	waitFor(t, "3 ready databases", 2*time.Minute, func() bool { return e.ready(h) == 3 })
	var held []testDB
	for range 3 {
		var d testDB
		e.expect(t, "GET", "/api/v1/templates/"+h+"/tests", nil, 200).json(t, &d)
		held = append(held, d)
	}
	// All three held: the next request times out with IntegreSQL's 500.
	r := e.expect(t, "GET", "/api/v1/templates/"+h+"/tests", nil, 500)
	if !strings.Contains(string(r.body), "became ready") {
		t.Errorf("500 without the reason: %s", r.body)
	}
	e.expect(t, "GET", "/api/v2/templates/"+h+"/tests", nil, 503)
	for _, d := range held {
		e.expect(t, "POST", fmt.Sprintf("/api/v1/templates/%s/tests/%d/unlock", h, d.ID), nil, 204)
	}
	names := map[string]bool{}
	for range 20 {
		var d testDB
		e.expect(t, "GET", "/api/v1/templates/"+h+"/tests", nil, 200).json(t, &d)
		if want := fmt.Sprintf("pft_test_%s_%03d", h, d.ID); d.Database.Config.Database != want || d.ID < 0 || d.ID >= 3 {
			t.Fatalf("id %d database %s, want an id below 3 and the name %s", d.ID, d.Database.Config.Database, want)
		}
		names[d.Database.Config.Database] = true
		e.expect(t, "POST", fmt.Sprintf("/api/v1/templates/%s/tests/%d/unlock", h, d.ID), nil, 204)
	}
	if len(names) > 3 {
		t.Errorf("20 hand-outs used %d names, want at most the pool's 3", len(names))
	}

	// Hashes IntegreSQL takes: each its own template and test database.
	sha512 := strings.Repeat("0123456789abcdef", 8)
	dbs := map[string]string{}
	safe := regexp.MustCompile(`^[a-z0-9_]{1,63}$`)
	for _, hash := range []string{"v1.2.3", "abc:def", "q83vEjRWeJA=", sha512, sha512[:127] + "e", "h" + h[:24], "a b"} {
		e.migrate(t, hash)
		// The request waits only the env's 2 s (for the one above that
		// must time out): the first copy takes what the load gives it.
		waitFor(t, "a ready database of "+hash, testenv.WaitTimeout, func() bool { return e.ready(hash) > 0 })
		var d testDB
		e.expect(t, "GET", "/api/v1/templates/"+url.PathEscape(hash)+"/tests", nil, 200).json(t, &d)
		if d.TemplateHash != hash {
			t.Errorf("hash %q came back as %q", hash, d.TemplateHash)
		}
		if !safe.MatchString(d.Database.Config.Database) {
			t.Errorf("hash %q: database %q", hash, d.Database.Config.Database)
		}
		if o, dup := dbs[d.Database.Config.Database]; dup {
			t.Errorf("hashes %q and %q share database %s", o, hash, d.Database.Config.Database)
		}
		dbs[d.Database.Config.Database] = hash
		if err := execAs(t, d.Database.Config, "SELECT x FROM migrated"); err != nil {
			t.Errorf("hash %q: %v", hash, err)
		}
	}
}

// TestV2Native: the native API says 410 after a discard, lists pools, and
// hands out databases under unguessable ids that only the holder can give
// back, once.
func TestV2Native(t *testing.T) {
	e := newEnv(t, opts{init: 1, max: 2})
	tpl := e.migrate(t, "native")
	// A finalized template is the server's and takes no connections: no
	// client can change what later test databases are copied from.
	if c, err := pgx.Connect(context.Background(), tpl.url()); err == nil {
		c.Close(context.Background())
		t.Error("a client can still connect to the finalized template")
	}
	var owner string
	ac, err := pgx.Connect(context.Background(), e.managed.AdminURL)
	if err != nil {
		t.Fatal(err)
	}
	if err := ac.QueryRow(context.Background(), "SELECT pg_get_userbyid(datdba) FROM pg_database WHERE datname = $1", tpl.Database).Scan(&owner); err != nil || owner != "postgres" {
		t.Errorf("template owner %q (%v), want the server's role postgres", owner, err)
	}
	ac.Close(context.Background())
	var d testDB2
	e.expect(t, "GET", "/api/v2/templates/native/tests", nil, 200).json(t, &d)
	if ok, _ := regexp.MatchString(`^[0-9a-f]{32}$`, d.ID); !ok {
		t.Fatalf("hand-out id %q is not unguessable", d.ID)
	}
	var list struct {
		Templates []struct {
			Hash      string         `json:"templateHash"`
			State     string         `json:"state"`
			Databases map[string]int `json:"databases"`
		} `json:"templates"`
	}
	e.expect(t, "GET", "/api/v2/templates", nil, 200).json(t, &list)
	if len(list.Templates) != 1 || list.Templates[0].Hash != "native" || list.Templates[0].State != "finalized" || list.Templates[0].Databases["in_use"] != 1 {
		t.Fatalf("listing: %+v", list)
	}
	e.expect(t, "POST", "/api/v2/templates/native/tests/0/unlock", nil, 404) // the small id is not the hand-out id
	e.expect(t, "POST", "/api/v2/templates/other/tests/"+d.ID+"/unlock", nil, 404)
	e.expect(t, "POST", "/api/v2/templates/native/tests/"+d.ID+"/unlock", nil, 204)
	e.expect(t, "POST", "/api/v2/templates/native/tests/"+d.ID+"/unlock", nil, 404) // given back already
	e.expect(t, "DELETE", "/api/v2/templates/native", nil, 204)
	e.expect(t, "GET", "/api/v2/templates/native/tests", nil, 410)
	e.expect(t, "GET", "/api/v1/templates/native/tests", nil, 404)

	// A test database renamed by its client does not outlive an admin reset.
	e.migrate(t, "renamed")
	var r testDB
	e.expect(t, "GET", "/api/v1/templates/renamed/tests", nil, 200).json(t, &r)
	c := r.Database.Config
	c.Database = "postgres"
	if err := execAs(t, c, "ALTER DATABASE "+pgx.Identifier{r.Database.Config.Database}.Sanitize()+" RENAME TO hidden_from_pgfork"); err != nil {
		t.Fatal(err)
	}
	e.expect(t, "DELETE", "/api/v1/admin/templates", nil, 204)
	if n := e.dbsLike(t, "hidden_from_pgfork"); n != 0 {
		t.Fatal("the renamed test database outlived the admin reset")
	}
}
