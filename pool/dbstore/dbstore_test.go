package dbstore_test

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgfork/pgfork/internal/pgtest"
	"github.com/pgfork/pgfork/pool"
	"github.com/pgfork/pgfork/pool/dbstore"
	"github.com/pgfork/pgfork/pool/storetest"
)

// TestConformance runs database isolation's store through the suite every
// pool.Store passes, on a real PostgreSQL server: one admin pool per Open,
// as one per `pgfork serve` run.
func TestConformance(t *testing.T) {
	inst := pgtest.New(t, pgtest.Server{})
	ctx := context.Background()
	check, err := pgxpool.New(ctx, inst.ConnString("postgres", "postgres"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(check.Close)
	storetest.Run(t, storetest.Suite{
		Open: func(t *testing.T) pool.Store {
			admin, err := dbstore.OpenAdmin(ctx, inst.ConnString("postgres", "postgres"), 8)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(admin.Close)
			cr := &dbstore.SQLCreator{Admin: admin, Strategy: dbstore.StrategyAuto}
			if err := cr.Probe(ctx); err != nil {
				t.Fatal(err)
			}
			return dbstore.New(admin, cr)
		},
		Connect: func(t *testing.T, ep pool.Endpoint) (*pgx.Conn, error) {
			return pgx.Connect(ctx, inst.ConnString("postgres", ep.Database))
		},
		CopyExists: func(t *testing.T, name string) bool {
			var ex bool
			if err := check.QueryRow(ctx, "SELECT EXISTS (SELECT 1 FROM pg_database WHERE datname = $1)", name).Scan(&ex); err != nil {
				t.Fatal(err)
			}
			return ex
		},
		Owner: "postgres",
	})
}
