package server_test

import (
	"context"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

type testDBV2 struct {
	ID       string `json:"id"`
	Number   int    `json:"number"`
	Kept     int    `json:"kept"`
	Warning  string `json:"warning"`
	Database struct {
		Config config `json:"config"`
	} `json:"database"`
}

// TestKeptDatabases: databases kept for inspection (POST …/keep, as clients
// do when a test fails) do not block hand-outs at the pool's maximum; the
// hand-out counts them and warns once they pile up (more than half the
// cap: 10); a restart of serve keeps them, on the same port, so the URLs
// printed for them stay right; given back, a kept database is dropped.
func TestKeptDatabases(t *testing.T) {
	e := newEnv(t, opts{init: 1, max: 2})
	e.expect(t, "POST", "/api/v2/templates", map[string]string{"hash": "kept"}, 200)
	e.expect(t, "PUT", "/api/v2/templates/kept", nil, 204)
	var kept []testDBV2
	for i := range 6 {
		var d testDBV2
		e.expect(t, "GET", "/api/v2/templates/kept/tests", nil, 200).json(t, &d)
		if d.Kept != i {
			t.Fatalf("hand-out %d says %d kept", i, d.Kept)
		}
		if d.Warning != "" {
			t.Fatalf("hand-out with %d kept warns: %q", i, d.Warning)
		}
		if err := execAs(t, d.Database.Config, "CREATE TABLE failed_here()"); err != nil {
			t.Fatal(err)
		}
		e.expect(t, "POST", "/api/v2/templates/kept/tests/"+d.ID+"/keep", nil, 204)
		kept = append(kept, d)
	}
	var d testDBV2
	e.expect(t, "GET", "/api/v2/templates/kept/tests", nil, 200).json(t, &d)
	if d.Kept != 6 || !strings.Contains(d.Warning, "6 databases of failed tests are kept") {
		t.Fatalf("with 6 kept: kept %d, warning %q", d.Kept, d.Warning)
	}
	e.expect(t, "POST", "/api/v2/templates/kept/tests/"+d.ID+"/recreate", nil, 204)

	// A restart of serve: the kept databases stay, on the same port.
	e.srv.Close()
	if err := e.mgr.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	if err := e.managed.Stop(context.Background()); err != nil {
		t.Fatal(err)
	}
	e.managed = startManaged(t, e.dir)
	t.Cleanup(func() { _ = e.managed.Stop(context.Background()) })
	e.startServer(t, opts{init: 1, max: 2})
	for _, k := range kept {
		if err := execAs(t, k.Database.Config, "SELECT FROM failed_here"); err != nil {
			t.Fatalf("kept database %s after a restart: %v", k.Database.Config.Database, err)
		}
	}
	var d1 struct {
		ID   int `json:"id"`
		Kept int `json:"kept"`
	}
	e.expect(t, "GET", "/api/v1/templates/kept/tests", nil, 200).json(t, &d1)
	if d1.Kept != 6 {
		t.Fatalf("after a restart the hand-out says %d kept, want 6", d1.Kept)
	}
	for _, k := range kept {
		if k.Number == d1.ID {
			t.Fatalf("kept database %d handed out again", d1.ID)
		}
	}
	// v1: keep and give back by number.
	e.expect(t, "POST", "/api/v1/templates/kept/tests/"+strconv.Itoa(kept[0].Number)+"/recreate", nil, 204)
	waitFor(t, "the kept database given back to be dropped", 30*time.Second, func() bool {
		c, err := pgx.Connect(context.Background(), kept[0].Database.Config.url())
		if err == nil {
			_ = c.Close(context.Background())
		}
		return err != nil
	})
}
