package dbstore_test

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/pgfork/pgfork/internal/errs"
	"github.com/pgfork/pgfork/internal/pgtest"
	"github.com/pgfork/pgfork/pool/dbstore"
)

// TestCreatorFastPath (issue 33): once the advisor chose for a template,
// creations are one CREATE DATABASE; what it cannot do still comes back
// typed: sessions on the template are Busy (the pool retries), a taken
// name is Exists, and a template gone is explained by the full path
// (NotFound naming it). Rename moves a database and says Busy while
// sessions remain.
func TestCreatorFastPath(t *testing.T) {
	inst := pgtest.New(t, pgtest.Server{})
	ctx := context.Background()
	admin, err := dbstore.OpenAdmin(ctx, inst.ConnString("postgres", "postgres"), 4)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(admin.Close)
	exec := func(sql string) {
		t.Helper()
		if _, err := admin.Exec(ctx, sql); err != nil {
			t.Fatalf("%s: %v", sql, err)
		}
	}
	exec("CREATE DATABASE tpl")
	cr := &dbstore.SQLCreator{Admin: admin, Strategy: dbstore.StrategyAuto}
	if err := cr.Probe(ctx); err != nil {
		t.Fatal(err)
	}
	first, err := cr.Create(ctx, "a1", "tpl", "")
	if err != nil {
		t.Fatal(err)
	}
	again, err := cr.Create(ctx, "a2", "tpl", "")
	if err != nil || again != first {
		t.Fatalf("second creation: %q, %v (first %q)", again, err, first)
	}
	if _, err := cr.Create(ctx, "a2", "tpl", ""); !errs.IsExists(err) {
		t.Fatalf("a taken name: %v, want Exists", err)
	}
	c, err := pgx.Connect(ctx, inst.ConnString("postgres", "tpl"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := cr.Create(ctx, "a3", "tpl", ""); !errs.IsBusy(err) {
		t.Fatalf("a session on the template: %v, want Busy", err)
	}
	c2, err := pgx.Connect(ctx, inst.ConnString("postgres", "a1"))
	if err != nil {
		t.Fatal(err)
	}
	if err := cr.Rename(ctx, "a1", "a1_old"); !errs.IsBusy(err) {
		t.Fatalf("renaming a database in use: %v, want Busy", err)
	}
	_ = c2.Close(ctx)
	_ = c.Close(ctx)
	exec("DROP DATABASE tpl WITH (FORCE)")
	if _, err := cr.Create(ctx, "a4", "tpl", ""); !errs.IsNotFound(err) {
		t.Fatalf("a template gone: %v, want NotFound", err)
	}
	var names []string
	rows, err := admin.Query(ctx, "SELECT datname FROM pg_database WHERE datname LIKE 'a%' ORDER BY 1")
	if err != nil {
		t.Fatal(err)
	}
	names, err = pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	if len(names) != 2 || names[0] != "a1" || names[1] != "a2" {
		t.Fatalf("databases: %v, want a1 a2", names)
	}
}
