package clusterstore_test

import (
	"context"
	"errors"
	"io/fs"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/pgfork/pgfork/internal/errs"
	"github.com/pgfork/pgfork/internal/pgtest"
	"github.com/pgfork/pgfork/internal/statedir"
	"github.com/pgfork/pgfork/internal/testenv"
	"github.com/pgfork/pgfork/pgbin"
	"github.com/pgfork/pgfork/pool"
	"github.com/pgfork/pgfork/pool/clusterstore"
)

// TestWarmWritesCacheFile (issue 33): a test copy is handed out without a
// connection of the store's (a test that waits for it takes it at once);
// the pool's warmer (pool.Warmer) connects to it once, which writes its
// catalog cache file, and a copy the store does not hold is an error.
func TestWarmWritesCacheFile(t *testing.T) {
	sc := newSlotCluster(t, testenv.Dir(t), "wm", false)
	var _ pool.CacheFiler = sc.st
	if sc.st.CarriesCacheFile("cluster") {
		t.Fatal("a test cluster's copies carry no catalog cache file: its server removed them when it started")
	}
	ctx := context.Background()
	file := filepath.Join(sc.data, "base", sc.oid(t, sc.name), "pg_internal.init")
	if _, err := os.Stat(file); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("before Warm: %s: %v, want it absent (nothing connected to the copy yet)", file, err)
	}
	if err := sc.st.Warm(ctx, sc.name, true); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(file); err != nil {
		t.Fatalf("after Warm: %v, want its catalog cache file", err)
	}
	if err := sc.st.Warm(ctx, prefixTest("wm")+"9", false); !errs.IsNotFound(err) {
		t.Fatalf("Warm of a copy the store does not hold: %v, want NotFound", err)
	}
}

// slotCluster is a store under dir whose test clusters hold 3 databases,
// with a finalized template and one test copy made, nothing connected to
// it yet.
type slotCluster struct {
	st   *clusterstore.Store
	name string // the test copy
	data string // its test cluster's data directory
}

func prefixTest(prefix string) string { return prefix + "_test_h_" }

// newSlotCluster makes it (its names start with prefix; shares: dir
// reflinks) and closes its store when the test ends.
func newSlotCluster(t *testing.T, dir, prefix string, shares bool) slotCluster {
	t.Helper()
	pg, err := pgbin.Find(pgbin.Options{Explicit: testenv.PGBinDirs(t)[0]}, 0)
	if err != nil {
		t.Fatal(err)
	}
	storeDir := filepath.Join(dir, prefix+"-slots")
	st, err := clusterstore.New(clusterstore.Options{Dir: storeDir, Layout: statedir.Layout{Root: filepath.Join(dir, "state")},
		PG: pg, User: pgtest.User(t), Lean: true, OwnName: true, Slots: 3, SharesBlocks: shares})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = st.Close(context.Background()) })
	ctx := context.Background()
	tmpl := prefix + "_template_h"
	if _, _, err := st.Recover(ctx, prefix, prefix+"_test_", true); err != nil {
		t.Fatal(err)
	}
	if err := st.CreateTemplate(ctx, tmpl, "", "template0"); err != nil {
		t.Fatal(err)
	}
	if err := st.FinalizeTemplate(ctx, tmpl); err != nil {
		t.Fatal(err)
	}
	name := prefixTest(prefix) + "0"
	if _, err := st.Create(ctx, name, tmpl, ""); err != nil {
		t.Fatal(err)
	}
	datas, err := filepath.Glob(filepath.Join(storeDir, "tests", "*", "data"))
	if err != nil || len(datas) != 1 {
		t.Fatalf("test clusters' data directories: %v (%v), want one", datas, err)
	}
	return slotCluster{st: st, name: name, data: datas[0]}
}

// oid is database db's in the copy's test cluster, asked in its postgres
// database (a shared catalog: nothing of the copies' own directories is
// read).
func (sc slotCluster) oid(t *testing.T, db string) string {
	t.Helper()
	ctx := context.Background()
	ep, cn := sc.st.Endpoint(sc.name), sc.st.Conn()
	q := url.Values{"host": {ep.Host}, "port": {strconv.Itoa(ep.Port)}, "user": {cn.Username}, "password": {cn.Password}, "dbname": {"postgres"}}
	c, err := pgx.Connect(ctx, "postgres:///?"+q.Encode())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close(ctx)
	var o uint32
	if err := c.QueryRow(ctx, "SELECT oid FROM pg_database WHERE datname = $1", db).Scan(&o); err != nil {
		t.Fatalf("oid of %s: %v", db, err)
	}
	return strconv.FormatUint(uint64(o), 10)
}
