package pgforktest_test

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/pgfork/pgfork/clients/go/internal/sharedsuite"
	"github.com/pgfork/pgfork/clients/go/pgforktest"
)

// TestDBAndPool: DB and Pool hand out open, working handles on fresh
// databases cloned from the migrated template, closed before the database
// goes back.
func TestDBAndPool(t *testing.T) {
	opts := sharedsuite.Options()
	t.Run("sql.DB", func(t *testing.T) {
		t.Parallel()
		db := pgforktest.DB(t, opts)
		var n int
		if err := db.QueryRowContext(t.Context(), "SELECT count(*) FROM accounts").Scan(&n); err != nil {
			t.Fatal(err)
		}
		if n != 2 {
			t.Fatalf("accounts = %d, want the 2 seeded rows", n)
		}
	})
	t.Run("pgxpool", func(t *testing.T) {
		t.Parallel()
		pool := pgforktest.Pool(t, opts)
		var n int
		if err := pool.QueryRow(t.Context(), "SELECT count(*) FROM accounts").Scan(&n); err != nil {
			t.Fatal(err)
		}
		if n != 2 {
			t.Fatalf("accounts = %d, want the 2 seeded rows", n)
		}
	})
}

// TestSQLDirSymlinkedEditRebuilds: through a symlinked migrations directory,
// editing a migration file gives a new template with the edit applied (the
// hash used to ignore a symlinked root, so the old template was reused).
func TestSQLDirSymlinkedEditRebuilds(t *testing.T) {
	base := t.TempDir()
	real := filepath.Join(base, "real")
	if err := os.Mkdir(real, 0o755); err != nil {
		t.Fatal(err)
	}
	link := filepath.Join(base, "migrations")
	if err := os.Symlink(real, link); err != nil {
		t.Fatal(err)
	}
	write := func(sql string) {
		if err := os.WriteFile(filepath.Join(real, "001.sql"), []byte(sql), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	key := "symlinked/" + os.Getenv("PGFORK_TEST_RUN") + "/" + base
	write("CREATE TABLE v (n int); INSERT INTO v VALUES (1);")
	opts := pgforktest.Options{Migrator: pgforktest.SQLDir(link), ExtraKey: key}
	var n int
	if err := pgforktest.DB(t, opts).QueryRowContext(t.Context(), "SELECT n FROM v").Scan(&n); err != nil || n != 1 {
		t.Fatalf("first template: n=%d err=%v, want 1", n, err)
	}
	write("CREATE TABLE v (n int); INSERT INTO v VALUES (2);")
	if err := pgforktest.DB(t, opts).QueryRowContext(t.Context(), "SELECT n FROM v").Scan(&n); err != nil || n != 2 {
		t.Fatalf("after editing the migration: n=%d err=%v, want 2 (a new template)", n, err)
	}
	// MigrationsDir and SQLDir give the same template hash (and the Python client's).
	h1, err := pgforktest.Hash(opts)
	if err != nil {
		t.Fatal(err)
	}
	h2, _ := pgforktest.Hash(pgforktest.Options{MigrationsDir: link, ExtraKey: key})
	if h1 != h2 {
		t.Fatalf("SQLDir hash %s != MigrationsDir hash %s", h1, h2)
	}
}
