package clusterstore_test

import (
	"context"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/pgfork/pgfork/internal/pgtest"
	"github.com/pgfork/pgfork/internal/statedir"
	"github.com/pgfork/pgfork/internal/testenv"
	"github.com/pgfork/pgfork/pgbin"
	"github.com/pgfork/pgfork/pool"
	"github.com/pgfork/pgfork/pool/clusterstore"
	"github.com/pgfork/pgfork/pool/storetest"
)

// TestConformance runs cluster isolation's store through the suite every
// pool.Store passes, with real clusters on the XFS reflink image: a
// template cluster per template, a copy started per test.
func TestConformance(t *testing.T) {
	dir := testenv.Dir(t)
	pg, err := pgbin.Find(pgbin.Options{Explicit: testenv.PGBinDirs(t)[0]}, 0)
	if err != nil {
		t.Fatal(err)
	}
	u := pgtest.User(t)
	storeDir := filepath.Join(dir, "serve-clusters")
	var conn pool.ConnInfo
	storetest.Run(t, storetest.Suite{
		Open: func(t *testing.T) pool.Store {
			st, err := clusterstore.New(clusterstore.Options{Dir: storeDir,
				Layout: statedir.Layout{Root: filepath.Join(dir, "state")}, PG: pg, User: u})
			if err != nil {
				t.Fatal(err)
			}
			conn = st.Conn()
			return st
		},
		Connect: func(t *testing.T, ep pool.Endpoint) (*pgx.Conn, error) {
			q := url.Values{"host": {ep.Host}, "port": {strconv.Itoa(ep.Port)}, "user": {conn.Username},
				"password": {conn.Password}, "dbname": {ep.Database}}
			return pgx.Connect(context.Background(), "postgres:///?"+q.Encode())
		},
		CopyExists: func(t *testing.T, name string) bool {
			for _, d := range []string{"tests", "templates"} {
				if _, err := os.Stat(filepath.Join(storeDir, d, name)); err == nil {
					return true
				}
			}
			return false
		},
	})
}

// TestDamagedStateRefused: a state.json that is not valid JSON is refused
// with its path named (it used to be read as empty, forgetting every
// template, and then overwritten), and it is left as it was.
func TestDamagedStateRefused(t *testing.T) {
	dir := testenv.Dir(t)
	pg, err := pgbin.Find(pgbin.Options{Explicit: testenv.PGBinDirs(t)[0]}, 0)
	if err != nil {
		t.Fatal(err)
	}
	storeDir := filepath.Join(dir, "damaged-state")
	if err := os.MkdirAll(storeDir, 0o755); err != nil {
		t.Fatal(err)
	}
	state := filepath.Join(storeDir, "state.json")
	damaged := []byte(`{"Epochs": {"pfx": 3}, "Templates": {"pfx": {"h": {"Hash": "h"`)
	if err := os.WriteFile(state, damaged, 0o644); err != nil {
		t.Fatal(err)
	}
	st, err := clusterstore.New(clusterstore.Options{Dir: storeDir,
		Layout: statedir.Layout{Root: filepath.Join(dir, "damaged-state-home")}, PG: pg, User: pgtest.User(t)})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close(context.Background())
	ctx := context.Background()
	if _, _, err := st.Recover(ctx, "pfx", "pfx_test_", true); err == nil || !strings.Contains(err.Error(), state) {
		t.Fatalf("Recover over a damaged state.json = %v, want an error naming %s", err, state)
	}
	if err := st.Save(ctx, "pfx", pool.Record{Hash: "h2", Name: "n", State: "finalized"}); err == nil {
		t.Fatal("Save over a damaged state.json succeeded (it would overwrite what it could not read)")
	}
	if b, _ := os.ReadFile(state); string(b) != string(damaged) {
		t.Fatalf("the damaged state.json was changed: %q", b)
	}
}
