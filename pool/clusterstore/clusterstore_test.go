package clusterstore_test

import (
	"context"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
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
