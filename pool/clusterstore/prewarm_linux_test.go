package clusterstore_test

import (
	"context"
	"path/filepath"
	"testing"

	"github.com/pgfork/pgfork/internal/testenv"
	"github.com/pgfork/pgfork/pgdata"
)

// TestSlotsPrewarmed (issue 33): a test cluster is a reflink copy of its
// template's, so its files are new inodes with none of their pages
// cached; a test copy prewarmed (as the pool does those nobody waits for)
// has its catalogs read ahead, while a slot not handed out yet stays cold
// (what the store changes).
// Nothing warms it (pool.Warmer): a connection would read some catalog
// pages itself.
func TestSlotsPrewarmed(t *testing.T) {
	sc := newSlotCluster(t, testenv.XFSDir(t), "pw", true)
	sc.st.Prewarm(context.Background(), sc.name, "cluster") // as the pool calls it (pool.Prewarmer) for a copy nobody waits for
	copyOid, slotOid := sc.oid(t, sc.name), sc.oid(t, "pgfork_slot_2")
	cached := func(oid string) float64 {
		return testenv.Resident(t, filepath.Join(sc.data, "base", oid), pgdata.CatalogFile)
	}
	var got float64
	// Read-ahead is asynchronous: wait for it (a loaded disk decides how long).
	testenv.WaitFor(t, "the copy handed out to have its catalog pages read ahead", func() bool {
		got = cached(copyOid)
		return got > 0.9
	})
	cold := cached(slotOid)
	t.Logf("catalog pages cached: %.0f%% of the copy handed out, %.0f%% of a slot not handed out", got*100, cold*100)
	if got < 0.9 || cold > 0.5 {
		t.Fatalf("catalog pages cached: %.2f of the copy handed out (want ≥ 0.9), %.2f of a slot not handed out (want ≤ 0.5)", got, cold)
	}
}
