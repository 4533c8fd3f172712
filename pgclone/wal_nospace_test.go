package pgclone

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/pgfork/pgfork/internal/errs"
	"github.com/pgfork/pgfork/internal/testenv"
	"github.com/pgfork/pgfork/pgdata"
)

// TestCopyWALNoSpace: a full destination while WAL is copied is a NoSpace
// error (exit 7) naming the clone's pg_wal, not the source's, and the
// partial segment is removed.
func TestCopyWALNoSpace(t *testing.T) {
	src := filepath.Join(testenv.Dir(t), "pg_wal")
	if err := os.Mkdir(src, 0o700); err != nil {
		t.Fatal(err)
	}
	seg := make([]byte, 16<<20)
	p := &walPlan{}
	// 5 segments of 16 MiB do not fit in 64 MiB.
	for i := 1; i <= 5; i++ {
		name := pgdata.SegmentName(1, uint64(i), 16<<20)
		if err := os.WriteFile(filepath.Join(src, name), seg, 0o600); err != nil {
			t.Fatal(err)
		}
		p.Segments = append(p.Segments, name)
	}
	dst := filepath.Join(testenv.SmallFSDir(t), "clone", "pg_wal")
	t.Cleanup(func() { _ = os.RemoveAll(filepath.Dir(dst)) })
	_, err := copyWAL(context.Background(), src, dst, p, nil, false)
	if errs.KindOf(err) != errs.NoSpace {
		t.Fatalf("copyWAL to a full filesystem: %v, want a NoSpace error", err)
	}
	var e *errs.Error
	if !errors.As(err, &e) || e.Path != dst || strings.Contains(err.Error(), src) {
		t.Errorf("error should name the clone's pg_wal %s, not the source's: %v", dst, err)
	}
	ents, _ := os.ReadDir(dst)
	for _, en := range ents {
		if fi, err := en.Info(); err == nil && fi.Size() != 16<<20 {
			t.Errorf("partial WAL segment left: %s (%d bytes)", en.Name(), fi.Size())
		}
	}
}
