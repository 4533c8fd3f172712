package atlasmigrator_test

import (
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/pgfork/pgfork/clients/go/internal/clitest"
	"github.com/pgfork/pgfork/clients/go/migrators/atlasmigrator"
	"github.com/pgfork/pgfork/clients/go/pgforktest"
)

// atlasVersion is the Atlas CLI the test runs when atlas is not on PATH.
const atlasVersion = "v0.36.0"

// TestAtlas: the template is migrated by `atlas migrate apply`, and adding a
// migration (and re-hashing atlas.sum) builds a new template with it.
func TestAtlas(t *testing.T) {
	cmd := clitest.Command(t, "atlas", "ariga.io/atlas/cmd/atlas", atlasVersion, "version")
	dir := t.TempDir()
	data, err := os.ReadFile("testdata/migrations/20240101000000_accounts.sql")
	if err != nil {
		t.Fatal(err)
	}
	write := func(name, sql string) {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(sql), 0o644); err != nil {
			t.Fatal(err)
		}
		hash := exec.Command(cmd[0], append(cmd[1:], "migrate", "hash", "--dir", "file://"+dir)...)
		if out, err := hash.CombinedOutput(); err != nil {
			t.Fatalf("atlas migrate hash: %v\n%s", err, out)
		}
	}
	write("20240101000000_accounts.sql", string(data))
	m := atlasmigrator.New(dir)
	m.Command = cmd
	opts := pgforktest.Options{Migrator: m, ExtraKey: "atlas/" + os.Getenv("PGFORK_TEST_RUN") + dir}
	var n int
	if err := pgforktest.DB(t, opts).QueryRowContext(t.Context(), "SELECT count(*) FROM accounts").Scan(&n); err != nil || n != 2 {
		t.Fatalf("accounts = %d (%v), want 2", n, err)
	}
	write("20240102000000_carol.sql", "INSERT INTO accounts (owner) VALUES ('carol');\n")
	if err := pgforktest.DB(t, opts).QueryRowContext(t.Context(), "SELECT count(*) FROM accounts").Scan(&n); err != nil || n != 3 {
		t.Fatalf("after adding a migration: accounts = %d (%v), want 3", n, err)
	}
}
