package clusterstore_test

import (
	"context"
	"net/url"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgfork/pgfork/internal/pgtest"
	"github.com/pgfork/pgfork/internal/statedir"
	"github.com/pgfork/pgfork/internal/testenv"
	"github.com/pgfork/pgfork/pgbin"
	"github.com/pgfork/pgfork/pgdata"
	"github.com/pgfork/pgfork/pool/clusterstore"
)

// TestSlotsPrewarmed (issue 33): a test cluster is a reflink copy of its
// template's, so its files are new inodes with none of their pages
// cached; a test copy prewarmed (as the pool does those nobody waits for)
// has its catalogs read ahead, while a slot not handed out yet stays cold
// (what the store changes).
// Warm is off: its connection would read some catalog pages itself.
func TestSlotsPrewarmed(t *testing.T) {
	dir := testenv.XFSDir(t)
	pg, err := pgbin.Find(pgbin.Options{Explicit: testenv.PGBinDirs(t)[0]}, 0)
	if err != nil {
		t.Fatal(err)
	}
	storeDir := filepath.Join(dir, "slots-prewarm")
	st, err := clusterstore.New(clusterstore.Options{Dir: storeDir, Layout: statedir.Layout{Root: filepath.Join(dir, "state")},
		PG: pg, User: pgtest.User(t), Lean: true, OwnName: true, Slots: 3, SharesBlocks: true})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = st.Close(context.Background()) }()
	ctx := context.Background()
	const tmpl = "pw_template_h"
	if _, _, err := st.Recover(ctx, "pw", "pw_test_", true); err != nil {
		t.Fatal(err)
	}
	if err := st.CreateTemplate(ctx, tmpl, "", "template0"); err != nil {
		t.Fatal(err)
	}
	if err := st.FinalizeTemplate(ctx, tmpl); err != nil {
		t.Fatal(err)
	}
	const name = "pw_test_h_0"
	strategy, err := st.Create(ctx, name, tmpl, "")
	if err != nil {
		t.Fatal(err)
	}
	st.Prewarm(ctx, name, strategy) // as the pool calls it (pool.Prewarmer) for a copy nobody waits for
	// The oids, asked in the cluster's postgres database (shared catalog):
	// nothing of the copies' own directories is read.
	ep := st.Endpoint(name)
	cn := st.Conn()
	q := url.Values{"host": {ep.Host}, "port": {strconv.Itoa(ep.Port)}, "user": {cn.Username}, "password": {cn.Password}, "dbname": {"postgres"}}
	c, err := pgx.Connect(ctx, "postgres:///?"+q.Encode())
	if err != nil {
		t.Fatal(err)
	}
	oid := func(db string) string {
		var o uint32
		if err := c.QueryRow(ctx, "SELECT oid FROM pg_database WHERE datname = $1", db).Scan(&o); err != nil {
			t.Fatalf("oid of %s: %v", db, err)
		}
		return strconv.FormatUint(uint64(o), 10)
	}
	copyOid, slotOid := oid(name), oid("pgfork_slot_2")
	_ = c.Close(ctx)
	datas, err := filepath.Glob(filepath.Join(storeDir, "tests", "*", "data"))
	if err != nil || len(datas) != 1 {
		t.Fatalf("test clusters' data directories: %v (%v), want one", datas, err)
	}
	cached := func(oid string) float64 {
		return testenv.Resident(t, filepath.Join(datas[0], "base", oid), pgdata.CatalogFile)
	}
	var got float64
	// Read-ahead is asynchronous: give it a moment.
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		if got = cached(copyOid); got > 0.9 {
			break
		}
	}
	cold := cached(slotOid)
	t.Logf("catalog pages cached: %.0f%% of the copy handed out, %.0f%% of a slot not handed out", got*100, cold*100)
	if got < 0.9 || cold > 0.5 {
		t.Fatalf("catalog pages cached: %.2f of the copy handed out (want ≥ 0.9), %.2f of a slot not handed out (want ≤ 0.5)", got, cold)
	}
}
