package pgclone

import (
	"context"
	"os"
	"path/filepath"
	"testing"

	"github.com/pgfork/pgfork/internal/testenv"
	"github.com/pgfork/pgfork/pgdata"
)

// TestCopyWALSwappedForSymlink: right after copyWAL made the clone's
// pg_wal, it is swapped for a symlink to a root-only directory (as the
// run-as user could once it owns the staging tree, issue 19 F4b): no WAL
// may be written there.
func TestCopyWALSwappedForSymlink(t *testing.T) {
	base := testenv.Dir(t)
	src := filepath.Join(base, "src-wal")
	secret := filepath.Join(base, "secret")
	for _, d := range []string{src, secret} {
		if err := os.Mkdir(d, 0o700); err != nil {
			t.Fatal(err)
		}
	}
	p := &walPlan{}
	for i := 1; i <= 2; i++ {
		name := pgdata.SegmentName(1, uint64(i), 16<<20)
		if err := os.WriteFile(filepath.Join(src, name), []byte("wal"), 0o600); err != nil {
			t.Fatal(err)
		}
		p.Segments = append(p.Segments, name)
	}
	dst := filepath.Join(base, "clone", "pg_wal")
	afterWALDir = func(d string) {
		if err := os.Rename(d, d+".old"); err != nil {
			t.Error(err)
		}
		if err := os.Symlink(secret, d); err != nil {
			t.Error(err)
		}
	}
	defer func() { afterWALDir = nil }()
	_, err := copyWAL(context.Background(), src, dst, p, nil, false)
	if err == nil {
		t.Error("copyWAL wrote through a pg_wal swapped for a symlink")
	}
	if ents, _ := os.ReadDir(secret); len(ents) != 0 {
		t.Fatalf("%d WAL files were written outside the clone, into %s", len(ents), secret)
	}
}
