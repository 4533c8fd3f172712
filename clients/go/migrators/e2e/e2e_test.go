// Package e2e runs the goose and golang-migrate adapters end to end.
package e2e

import (
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/pgfork/pgfork/clients/go/migrators/golangmigrator"
	"github.com/pgfork/pgfork/clients/go/migrators/goosemigrator"
	"github.com/pgfork/pgfork/clients/go/pgforktest"
)

// copyDir copies the migrations of testdata/src to a fresh directory, so a
// test can edit them.
func copyDir(t *testing.T, src string) string {
	t.Helper()
	dst := t.TempDir()
	err := filepath.WalkDir(src, func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		data, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		return os.WriteFile(filepath.Join(dst, filepath.Base(p)), data, 0o644)
	})
	if err != nil {
		t.Fatal(err)
	}
	return dst
}

func count(t *testing.T, opts pgforktest.Options) int {
	t.Helper()
	var n int
	if err := pgforktest.DB(t, opts).QueryRowContext(t.Context(), "SELECT count(*) FROM accounts").Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// TestAdapters: each adapter migrates the template with its tool, and adding
// a migration file builds a new template with it applied, with no key bump.
func TestAdapters(t *testing.T) {
	for _, tc := range []struct {
		name, src, added string
		sql              string
		migrator         func(dir string) pgforktest.Migrator
	}{
		{"goose", "testdata/goose", "00003_carol.sql",
			"-- +goose Up\nINSERT INTO accounts (owner) VALUES ('carol');\n",
			func(dir string) pgforktest.Migrator { return goosemigrator.New(os.DirFS(dir)) }},
		{"golang-migrate", "testdata/golangmigrate", "000003_carol.up.sql",
			"INSERT INTO accounts (owner) VALUES ('carol');\n",
			func(dir string) pgforktest.Migrator { return golangmigrator.New(os.DirFS(dir)) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			dir := copyDir(t, tc.src)
			// A per-run key: each run builds its templates afresh.
			key := "e2e/" + os.Getenv("PGFORK_TEST_RUN") + "/" + dir
			opts := pgforktest.Options{Migrator: tc.migrator(dir), ExtraKey: key}
			h1, err := pgforktest.Hash(opts)
			if err != nil {
				t.Fatal(err)
			}
			if n := count(t, opts); n != 2 {
				t.Fatalf("accounts = %d, want 2 (both migrations applied)", n)
			}
			if err := os.WriteFile(filepath.Join(dir, tc.added), []byte(tc.sql), 0o644); err != nil {
				t.Fatal(err)
			}
			h2, err := pgforktest.Hash(opts)
			if err != nil {
				t.Fatal(err)
			}
			if h1 == h2 {
				t.Fatal("adding a migration did not change the template hash")
			}
			if n := count(t, opts); n != 3 {
				t.Fatalf("after adding a migration: accounts = %d, want 3", n)
			}
		})
	}
}

// TestAdapterFailureNamesMigration: a broken migration fails with the tool's
// error, naming what broke.
func TestAdapterFailureNamesMigration(t *testing.T) {
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "00001_bad.sql"), []byte("-- +goose Up\nSELECT nope FROM nowhere_table;\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "000001_bad.up.sql"), []byte("SELECT nope FROM nowhere_table;\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	// An empty database of the server's to migrate.
	url := pgforktest.New(t, pgforktest.Options{ExtraKey: "e2e-empty/" + os.Getenv("PGFORK_TEST_RUN")})
	gooseDir, migrateDir := t.TempDir(), t.TempDir()
	_ = os.Rename(filepath.Join(dir, "00001_bad.sql"), filepath.Join(gooseDir, "00001_bad.sql"))
	_ = os.Rename(filepath.Join(dir, "000001_bad.up.sql"), filepath.Join(migrateDir, "000001_bad.up.sql"))
	for name, m := range map[string]pgforktest.Migrator{
		"goose":          goosemigrator.New(os.DirFS(gooseDir)),
		"golang-migrate": golangmigrator.New(os.DirFS(migrateDir)),
	} {
		err := m.Migrate(t.Context(), url)
		if err == nil || !strings.Contains(err.Error(), "nowhere_table") {
			t.Errorf("%s: err = %v, want the migration's error naming nowhere_table", name, err)
		}
	}
}
