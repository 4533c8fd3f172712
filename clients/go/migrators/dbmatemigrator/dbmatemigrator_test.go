package dbmatemigrator_test

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/pgfork/pgfork/clients/go/internal/clitest"
	"github.com/pgfork/pgfork/clients/go/migrators/dbmatemigrator"
	"github.com/pgfork/pgfork/clients/go/pgforktest"
)

// dbmateVersion is the dbmate CLI the test runs when dbmate is not on PATH.
const dbmateVersion = "v2.28.0"

// TestDbmate: the template is migrated by `dbmate up`, adding a migration
// builds a new template with it, and a failing migration's error does not
// show the database password.
func TestDbmate(t *testing.T) {
	cmd := clitest.Command(t, "dbmate", "github.com/amacneil/dbmate/v2", dbmateVersion, "--version")
	dir := t.TempDir()
	data, err := os.ReadFile("testdata/migrations/20240101000000_accounts.sql")
	if err != nil {
		t.Fatal(err)
	}
	write := func(name, sql string) {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(sql), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write("20240101000000_accounts.sql", string(data))
	m := dbmatemigrator.New(dir)
	m.Command = cmd
	opts := pgforktest.Options{Migrator: m, ExtraKey: "dbmate/" + os.Getenv("PGFORK_TEST_RUN") + dir}
	var n int
	if err := pgforktest.DB(t, opts).QueryRowContext(t.Context(), "SELECT count(*) FROM accounts").Scan(&n); err != nil || n != 2 {
		t.Fatalf("accounts = %d (%v), want 2", n, err)
	}
	write("20240102000000_carol.sql", "-- migrate:up\nINSERT INTO accounts (owner) VALUES ('carol');\n\n-- migrate:down\n")
	if err := pgforktest.DB(t, opts).QueryRowContext(t.Context(), "SELECT count(*) FROM accounts").Scan(&n); err != nil || n != 3 {
		t.Fatalf("after adding a migration: accounts = %d (%v), want 3", n, err)
	}

	url := pgforktest.New(t, pgforktest.Options{ExtraKey: "dbmate-empty/" + os.Getenv("PGFORK_TEST_RUN")})
	bad := t.TempDir()
	if err := os.WriteFile(filepath.Join(bad, "20240101000000_bad.sql"), []byte("-- migrate:up\nSELECT nope FROM nowhere_table;\n\n-- migrate:down\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	mb := dbmatemigrator.New(bad)
	mb.Command = cmd
	err = mb.Migrate(t.Context(), url)
	if err == nil || !strings.Contains(err.Error(), "nowhere_table") {
		t.Fatalf("broken migration: err = %v, want dbmate's error naming nowhere_table", err)
	}
	if pw := strings.SplitN(strings.SplitN(strings.TrimPrefix(url, "postgres://"), "@", 2)[0], ":", 2); len(pw) == 2 && pw[1] != "" && strings.Contains(err.Error(), pw[1]) {
		t.Fatalf("error shows the password: %v", err)
	}
}
