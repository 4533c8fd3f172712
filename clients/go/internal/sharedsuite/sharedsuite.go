// Package sharedsuite holds what the pgforktest suites in two packages share,
// so that `go test ./...` builds one template from two processes at once.
package sharedsuite

import (
	"context"
	"os"
	"path/filepath"
	"runtime"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/pgfork/pgfork/clients/go/pgforktest"
)

// MigrationsDir is pgforktest's testdata/migrations, found from this file.
func MigrationsDir() string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Join(filepath.Dir(file), "..", "..", "pgforktest", "testdata", "migrations")
}

// Options are the suites' pgforktest options. The extra key includes
// $PGFORK_TEST_RUN (set per run by clients/test.sh), so that each run builds
// a fresh template and the processes really race to initialize it. The
// migration records each build in template_builds.
func Options() pgforktest.Options {
	dir := MigrationsDir()
	return pgforktest.Options{
		MigrationsDir: dir,
		ExtraKey:      "sharedsuite/" + os.Getenv("PGFORK_TEST_RUN"),
		Migrate: func(ctx context.Context, connString string) error {
			if err := pgforktest.RunSQLFiles(ctx, connString, dir); err != nil {
				return err
			}
			conn, err := pgx.Connect(ctx, connString)
			if err != nil {
				return err
			}
			defer conn.Close(ctx)
			_, err = conn.Exec(ctx, `CREATE TABLE template_builds (pid int NOT NULL);
				INSERT INTO template_builds VALUES (pg_backend_pid())`)
			return err
		},
	}
}

// CheckIsolated asserts that conn's database is fresh from the template
// (built once, seed rows only), then writes a note as name and checks that
// only that note is there.
func CheckIsolated(t testing.TB, conn *pgx.Conn, name string) {
	t.Helper()
	ctx := context.Background()
	var builds, accounts, notes int
	err := conn.QueryRow(ctx, `SELECT (SELECT count(*) FROM template_builds),
		(SELECT count(*) FROM accounts), (SELECT count(*) FROM notes)`).Scan(&builds, &accounts, &notes)
	if err != nil {
		t.Fatal(err)
	}
	if builds != 1 {
		t.Fatalf("template was migrated %d times, want once", builds)
	}
	if accounts != 2 || notes != 0 {
		t.Fatalf("database not fresh: %d accounts (want 2), %d notes (want 0)", accounts, notes)
	}
	if _, err := conn.Exec(ctx, "INSERT INTO notes VALUES ($1, 'hello')", name); err != nil {
		t.Fatal(err)
	}
	if _, err := conn.Exec(ctx, "UPDATE accounts SET cents = cents - 100 WHERE owner = 'alice'"); err != nil {
		t.Fatal(err)
	}
	var owners []string
	rows, err := conn.Query(ctx, "SELECT owner FROM notes")
	if err != nil {
		t.Fatal(err)
	}
	for rows.Next() {
		var o string
		if err := rows.Scan(&o); err != nil {
			t.Fatal(err)
		}
		owners = append(owners, o)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	if len(owners) != 1 || owners[0] != name {
		t.Fatalf("notes = %v, want only [%s]", owners, name)
	}
	var cents int64
	if err := conn.QueryRow(ctx, "SELECT cents FROM accounts WHERE owner = 'alice'").Scan(&cents); err != nil {
		t.Fatal(err)
	}
	if cents != 900 {
		t.Fatalf("alice has %d cents, want 900 (another test's update leaked in?)", cents)
	}
}
