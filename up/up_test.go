package up_test

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgfork/pgfork/cluster"
	"github.com/pgfork/pgfork/internal/errs"
	"github.com/pgfork/pgfork/internal/statedir"
	"github.com/pgfork/pgfork/internal/testenv"
	"github.com/pgfork/pgfork/pgbin"
	"github.com/pgfork/pgfork/up"
)

// TestUpLibrary: one Up call starts a cluster that answers at its URL
// with the template's setup applied and asks for a refill with the typed
// request; a second Up under the same name fails as Exists before any
// work and leaves the first one alone.
func TestUpLibrary(t *testing.T) {
	dir := testenv.Dir(t)
	lay := statedir.Layout{Root: filepath.Join(dir, "state")}
	setup := filepath.Join(dir, "schema.sql")
	if err := os.WriteFile(setup, []byte("CREATE TABLE lib (v int); INSERT INTO lib VALUES (42);"), 0o644); err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	var refills []up.Refill
	o := up.Options{
		Layout: lay,
		FindPG: func() (pgbin.Installation, error) {
			return pgbin.Find(pgbin.Options{Explicit: testenv.PGBinDirs(t)[0]}, 0)
		},
		Setup: []string{setup}, Name: "lib-a", Spares: 1,
		Refill: func(r up.Refill) error { refills = append(refills, r); return nil },
	}
	res, err := up.Up(ctx, o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cluster.Down(context.Background(), lay, res.Name, cluster.DownOptions{Timeout: 30 * time.Second})
	})
	if res.Name != "lib-a" || !res.Built || res.FromSpare || res.Timings["total"] <= 0 {
		t.Errorf("result = %+v, want lib-a, a built template, a copy and timings", res)
	}
	if len(refills) != 1 || refills[0].Key != res.TemplateKey || refills[0].Spares != 1 || refills[0].Layout != lay {
		t.Errorf("refill requests = %+v, want one for template %s with 1 spare", refills, res.TemplateKey)
	}
	c, err := pgx.Connect(ctx, res.URL)
	if err != nil {
		t.Fatal(err)
	}
	var v int
	err = c.QueryRow(ctx, "SELECT v FROM lib").Scan(&v)
	c.Close(ctx)
	if err != nil || v != 42 {
		t.Fatalf("the cluster's setup table: %d, %v; want 42", v, err)
	}

	called := false
	o.FindPG = func() (pgbin.Installation, error) {
		called = true
		return pgbin.Installation{}, errs.New(errs.Internal, "unreachable")
	}
	if _, err := up.Up(ctx, o); errs.KindOf(err) != errs.Exists {
		t.Fatalf("second Up as lib-a: %v, want an exists error", err)
	}
	if called {
		t.Error("Up looked for PostgreSQL before claiming the name")
	}
	if _, err := cluster.Get(lay, "lib-a"); err != nil {
		t.Errorf("the first cluster is gone after the failed second Up: %v", err)
	}
}
