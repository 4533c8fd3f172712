package clone

import (
	"context"
	"os"
	"path/filepath"
	"testing"

	"github.com/pgfork/pgfork/internal/testenv"
)

// TestCrossesFS: a file on XFS copied into a directory of the same XFS
// clones (no crossing); into a tmpfs it cannot (a crossing, with both
// types); a file on a tmpfs never clones, so nothing is lost anywhere.
func TestCrossesFS(t *testing.T) {
	ctx := context.Background()
	xfs, tmp := testenv.XFSDir(t), testenv.TmpfsDir(t)
	onXFS := filepath.Join(xfs, "f")
	onTmp := filepath.Join(tmp, "f")
	for _, p := range []string{onXFS, onTmp} {
		if err := os.WriteFile(p, []byte("PG_VERSION-like\n"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	sub := filepath.Join(xfs, "sub")
	if err := os.Mkdir(sub, 0o755); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		src, dst string
		want     *Crossing
	}{
		{onXFS, sub, nil},
		{onXFS, tmp, &Crossing{SrcFS: "xfs", DstFS: "tmpfs"}},
		{onTmp, xfs, nil},
		{onTmp, tmp, nil},
	} {
		got, err := CrossesFS(ctx, c.src, c.dst)
		if err != nil {
			t.Fatal(err)
		}
		if (got == nil) != (c.want == nil) || got != nil && *got != *c.want {
			t.Errorf("CrossesFS(%s, %s) = %+v, want %+v", c.src, c.dst, got, c.want)
		}
	}
	if ents, _ := os.ReadDir(sub); len(ents) != 0 {
		t.Errorf("the trial left %v", ents)
	}
	if n := TreeBytes(xfs); n != int64(len("PG_VERSION-like\n")) {
		t.Errorf("TreeBytes = %d, want %d", n, len("PG_VERSION-like\n"))
	}
}
