package pgclone

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/pgfork/pgfork/internal/errs"
	"github.com/pgfork/pgfork/pgdata"
)

func TestPlanWAL(t *testing.T) {
	const seg = 16 << 20
	dir := t.TempDir()
	for _, n := range []string{"000000010000000000000004", "000000010000000000000005", "000000010000000000000006",
		"000000010000000000000007", "00000002.history", "000000010000000000000005.00000028.backup", "junk"} {
		if err := os.WriteFile(filepath.Join(dir, n), nil, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	start, _ := pgdata.ParseLSN("0/5000028")
	stop, _ := pgdata.ParseLSN("0/6000100")
	p, err := planWAL(dir, 1, start, stop, seg)
	if err != nil {
		t.Fatal(err)
	}
	if strings.Join(p.Segments, ",") != "000000010000000000000005,000000010000000000000006" || strings.Join(p.History, ",") != "00000002.history" {
		t.Errorf("plan %+v", p)
	}
	// A stop LSN exactly at a segment boundary needs nothing of the next segment.
	stop, _ = pgdata.ParseLSN("0/7000000")
	if p, err = planWAL(dir, 1, start, stop, seg); err != nil || len(p.Segments) != 3 {
		t.Errorf("boundary plan %+v %v", p, err)
	}
	// A recycled segment is a clear error.
	os.Remove(filepath.Join(dir, "000000010000000000000006"))
	_, err = planWAL(dir, 1, start, stop, seg)
	if err == nil || !strings.Contains(err.Error(), "000000010000000000000006") || !strings.Contains(errs.HintOf(err), "wal_keep_size") {
		t.Errorf("missing segment: %v (hint %q)", err, errs.HintOf(err))
	}
}

func TestRewriteTablespaceMap(t *testing.T) {
	got, err := rewriteTablespaceMap("16384 /old/ts\n16385 /old/two\n", map[string]string{"16384": "/new/a", "16385": "/new/we\\ird\nname"})
	if err != nil {
		t.Fatal(err)
	}
	if want := "16384 /new/a\n16385 /new/we\\\\ird\\\nname\n"; got != want {
		t.Errorf("got %q, want %q", got, want)
	}
	if _, err := rewriteTablespaceMap("99 /x\n", map[string]string{}); err == nil {
		t.Error("a tablespace that was not copied was accepted")
	}
}

func TestCleanStale(t *testing.T) {
	parent := t.TempDir()
	dst := filepath.Join(parent, "dst")
	live, err := newStaged(parent, "dst")
	if err != nil {
		t.Fatal(err)
	}
	defer live.release()
	dead, err := newStaged(parent, "dst")
	if err != nil {
		t.Fatal(err)
	}
	dead.release()
	deadTS, err := newStaged(parent, "dst.tblspc")
	if err != nil {
		t.Fatal(err)
	}
	deadTS.release()
	// DST.tblspc renamed into place by a clone killed before DST was.
	ts := TablespaceDir(dst)
	os.MkdirAll(filepath.Join(ts, "16384"), 0o700)
	os.WriteFile(filepath.Join(ts, incompleteMarker), nil, 0o600)
	other := filepath.Join(parent, ".other.pgfork-clone-1-x")
	os.Mkdir(other, 0o700)

	if err := CleanStale(dst); err != nil {
		t.Fatal(err)
	}
	for p, want := range map[string]bool{live.path: true, dead.path: false, deadTS.path: false, ts: false, other: true} {
		_, err := os.Stat(p)
		if (err == nil) != want {
			t.Errorf("%s: exists=%v, want %v", p, err == nil, want)
		}
	}
	// A finished DST.tblspc (no marker) is never touched.
	os.MkdirAll(filepath.Join(ts, "16384"), 0o700)
	if err := CleanStale(dst); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(ts); err != nil {
		t.Errorf("a complete tablespace dir was removed: %v", err)
	}
}
