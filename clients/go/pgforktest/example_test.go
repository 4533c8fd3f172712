package pgforktest_test

// The code in this file is the code in ../README.md; TestReadmeInSync keeps
// the two the same.

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/pgfork/pgfork/clients/go/pgforktest"
)

func TestAccounts(t *testing.T) {
	t.Parallel()
	url := pgforktest.New(t, pgforktest.Options{
		MigrationsDir: "testdata/migrations", // hashed, and its *.sql run in name order
		ExtraKey:      "example-v1",          // bump to rebuild the template
	})
	conn, err := pgx.Connect(t.Context(), url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close(context.Background()) })

	if _, err := conn.Exec(t.Context(), "INSERT INTO accounts (owner, cents) VALUES ('carol', 1)"); err != nil {
		t.Fatal(err)
	}
	var n int
	if err := conn.QueryRow(t.Context(), "SELECT count(*) FROM accounts").Scan(&n); err != nil {
		t.Fatal(err)
	}
	if n != 3 { // alice and bob from the seed, carol from this test only
		t.Fatalf("accounts = %d, want 3", n)
	}
}

func TestWithOwnMigrations(t *testing.T) {
	t.Parallel()
	url := pgforktest.New(t, pgforktest.Options{
		MigrationsDir: "testdata/migrations",
		ExtraKey:      "own-migrate-v1",
		Migrate: func(ctx context.Context, connString string) error {
			// Call your migration tool here; this one runs the SQL files and seeds more.
			if err := pgforktest.RunSQLFiles(ctx, connString, "testdata/migrations"); err != nil {
				return err
			}
			conn, err := pgx.Connect(ctx, connString)
			if err != nil {
				return err
			}
			defer conn.Close(ctx)
			_, err = conn.Exec(ctx, "INSERT INTO accounts (owner, cents) VALUES ('dave', 7)")
			return err
		},
	})
	conn, err := pgx.Connect(t.Context(), url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close(context.Background()) })

	var cents int64
	if err := conn.QueryRow(t.Context(), "SELECT cents FROM accounts WHERE owner = 'dave'").Scan(&cents); err != nil {
		t.Fatal(err)
	}
	if cents != 7 {
		t.Fatalf("dave has %d cents, want 7", cents)
	}
}
