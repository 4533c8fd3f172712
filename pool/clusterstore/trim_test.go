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
)

// catalogMaps lists the system catalogs' free space map and visibility
// map files (relfilenode below 16384) of the cluster at data, and the
// other maps (the user's relations').
func catalogMaps(t *testing.T, data string) (catalog, user []string) {
	t.Helper()
	dirs, _ := filepath.Glob(filepath.Join(data, "base", "*"))
	dirs = append(dirs, filepath.Join(data, "global"))
	for _, d := range dirs {
		ents, err := os.ReadDir(d)
		if err != nil {
			t.Fatal(err)
		}
		for _, e := range ents {
			num, fork, ok := strings.Cut(e.Name(), "_")
			if !ok || (fork != "fsm" && fork != "vm") {
				continue
			}
			n, err := strconv.Atoi(num)
			if err != nil {
				continue
			}
			if n < 16384 {
				catalog = append(catalog, filepath.Join(d, e.Name()))
			} else {
				user = append(user, filepath.Join(d, e.Name()))
			}
		}
	}
	return catalog, user
}

// TestLeanTrimsCatalogMaps: a Lean store's finalized template cluster has
// no free space map or visibility map of a system catalog (a quarter of
// its files, copied and removed with every test cluster), keeps those of
// the template's own table, and its test clusters work as any cluster:
// catalog writes, VACUUM (which makes the maps again), the template's
// table read by an index-only scan.
// Every PostgreSQL build of the test environment (15, 17 and 18).
func TestLeanTrimsCatalogMaps(t *testing.T) {
	for _, bin := range testenv.PGBinDirs(t) {
		pg, err := pgbin.Find(pgbin.Options{Explicit: bin}, 0)
		if err != nil {
			t.Fatal(err)
		}
		t.Run(strconv.Itoa(pg.Major), func(t *testing.T) { leanTrimsCatalogMaps(t, pg) })
	}
}

func leanTrimsCatalogMaps(t *testing.T, pg pgbin.Installation) {
	dir := testenv.Dir(t)
	storeDir := filepath.Join(dir, "lean")
	st, err := clusterstore.New(clusterstore.Options{Dir: storeDir, Layout: statedir.Layout{Root: filepath.Join(dir, "state")},
		PG: pg, User: pgtest.User(t), Lean: true, OwnName: true, Slots: 2})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = st.Close(context.Background()) }()
	ctx := context.Background()
	conn := st.Conn()
	connect := func(ep pool.Endpoint) *pgx.Conn {
		t.Helper()
		q := url.Values{"host": {ep.Host}, "port": {strconv.Itoa(ep.Port)}, "user": {conn.Username},
			"password": {conn.Password}, "dbname": {ep.Database}}
		c, err := pgx.Connect(ctx, "postgres:///?"+q.Encode())
		if err != nil {
			t.Fatalf("connect to %+v: %v", ep, err)
		}
		return c
	}
	const tmpl = "lt_template_h"
	if _, _, err := st.Recover(ctx, "lt", "lt_test_", true); err != nil {
		t.Fatal(err)
	}
	if err := st.CreateTemplate(ctx, tmpl, "", "template0"); err != nil {
		t.Fatal(err)
	}
	c := connect(st.Endpoint(tmpl))
	for _, sql := range []string{"CREATE TABLE big AS SELECT g AS id, md5(g::text) AS v FROM generate_series(1, 20000) g", "CREATE INDEX ON big(id)", "VACUUM big", "CHECKPOINT"} {
		if _, err := c.Exec(ctx, sql); err != nil {
			t.Fatal(err)
		}
	}
	_ = c.Close(ctx)
	data := filepath.Join(storeDir, "templates", tmpl, "data")
	if cat, user := catalogMaps(t, data); len(cat) < 100 || len(user) == 0 {
		t.Fatalf("before finalize the template cluster has %d catalog maps and %d of its table, want many and some", len(cat), len(user))
	}
	if err := st.FinalizeTemplate(ctx, tmpl); err != nil {
		t.Fatal(err)
	}
	cat, user := catalogMaps(t, data)
	if len(cat) != 0 {
		t.Fatalf("the finalized template cluster keeps %d catalog maps: %v", len(cat), cat[:min(len(cat), 5)])
	}
	if len(user) == 0 {
		t.Fatal("the finalize removed the maps of the template's own table")
	}
	for _, n := range []string{"lt_test_h_0", "lt_test_h_1"} {
		if _, err := st.Create(ctx, n, tmpl, ""); err != nil {
			t.Fatalf("Create %s: %v", n, err)
		}
		c := connect(st.Endpoint(n))
		var plan string
		rows, err := c.Query(ctx, "EXPLAIN (ANALYZE, COSTS OFF) SELECT id FROM big WHERE id BETWEEN 100 AND 200")
		if err != nil {
			t.Fatal(err)
		}
		lines, err := pgx.CollectRows(rows, pgx.RowTo[string])
		if err != nil {
			t.Fatal(err)
		}
		plan = strings.Join(lines, "\n")
		if strings.Contains(plan, "Index Only Scan") && !strings.Contains(plan, "Heap Fetches: 0") {
			t.Fatalf("the template's table lost its visibility map in test copy %s:\n%s", n, plan)
		}
		for _, sql := range []string{
			"CREATE TABLE t (id int PRIMARY KEY, v text)",
			"INSERT INTO t SELECT g, 'x' FROM generate_series(1, 1000) g",
			"UPDATE big SET v = 'y' WHERE id < 50",
			"DROP TABLE t",
			"CREATE TABLE t2 (a int)",
			"DROP TABLE t2",
			"VACUUM (FREEZE) pg_class, pg_attribute, big",
		} {
			if _, err := c.Exec(ctx, sql); err != nil {
				t.Fatalf("%s in test copy %s: %v", sql, n, err)
			}
		}
		var count int
		if err := c.QueryRow(ctx, "SELECT count(*) FROM pg_class").Scan(&count); err != nil || count < 100 {
			t.Fatalf("pg_class in test copy %s: %d rows, %v", n, count, err)
		}
		_ = c.Close(ctx)
	}
	// VACUUM made the maps of the catalogs it visited again, in the test
	// cluster (not in the template's).
	tests, _ := filepath.Glob(filepath.Join(storeDir, "tests", "*", "data"))
	if len(tests) != 1 {
		t.Fatalf("test clusters: %v, want one", tests)
	}
	if cat, _ := catalogMaps(t, tests[0]); len(cat) == 0 {
		t.Fatal("VACUUM of the catalogs in a test cluster made no map again")
	}
	if cat, _ := catalogMaps(t, data); len(cat) != 0 {
		t.Fatalf("the template cluster has catalog maps again: %v", cat)
	}
}
