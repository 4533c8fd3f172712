package branches

import (
	"context"
	"testing"

	"github.com/pgfork/pgfork/internal/pgtest"
)

// TestBranchSettings: a branch runs with branchSettings (wal_init_zero
// off, wal_compression on: its WAL costs fewer blocks), after a reset too;
// on XFS (env's state directory) it syncs its data directory before
// recovery with one syncfs, not file by file (issue 60; "fsync" before).
func TestBranchSettings(t *testing.T) {
	t.Parallel() // see env
	ctx := context.Background()
	m := open(t, env(t))
	me := Caller{Token: "me"}
	b, err := m.Create(ctx, me, CreateOptions{Name: "b", Source: "prod"})
	if err != nil {
		t.Fatal(err)
	}
	check := func(what string) {
		t.Helper()
		if got := pgtest.Query(t, b.URL(), "SHOW wal_init_zero"); got != "off" {
			t.Errorf("%s has wal_init_zero = %s, want off", what, got)
		}
		// "on" is pglz, shown so from PostgreSQL 15.
		if got := pgtest.Query(t, b.URL(), "SHOW wal_compression"); got != "on" && got != "pglz" {
			t.Errorf("%s has wal_compression = %s, want on", what, got)
		}
		if got := pgtest.Query(t, b.URL(), "SHOW recovery_init_sync_method"); got != "syncfs" {
			t.Errorf("%s on XFS has recovery_init_sync_method = %s, want syncfs", what, got)
		}
	}
	check("a branch")
	if b, err = m.Reset(ctx, me, "b"); err != nil {
		t.Fatal(err)
	}
	check("a reset branch")
}
