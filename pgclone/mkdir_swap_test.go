package pgclone

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/pgfork/pgfork/internal/testenv"
)

// TestBuildMkdirSwappedForSymlink: the clone's pg_wal swapped for a
// symlink to a root-only directory before archive_status and backup_label
// are made (issue 19 F4b): nothing may be created there.
func TestBuildMkdirSwappedForSymlink(t *testing.T) {
	base := testenv.Dir(t)
	data, secret := filepath.Join(base, "data"), filepath.Join(base, "secret")
	for _, d := range []string{data, secret} {
		if err := os.Mkdir(d, 0o700); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Symlink(secret, filepath.Join(data, "pg_wal")); err != nil {
		t.Fatal(err)
	}
	b := &build{}
	b.data = &staged{path: data}
	if err := b.mkdir(filepath.Join(data, "pg_wal", "archive_status")); err == nil {
		t.Error("mkdir went through a symlink out of the data directory")
	}
	if err := b.writeFile("pg_wal/backup_label", "x"); err == nil {
		t.Error("writeFile went through a symlink out of the data directory")
	}
	if ents, _ := os.ReadDir(secret); len(ents) != 0 {
		t.Fatalf("%d entries were made outside the clone, in %s", len(ents), secret)
	}
}
