package serve_test

import (
	"context"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgfork/pgfork/clone"
	"github.com/pgfork/pgfork/instance"
	"github.com/pgfork/pgfork/internal/errs"
	"github.com/pgfork/pgfork/internal/testenv"
	"github.com/pgfork/pgfork/pgdata"
	"github.com/pgfork/pgfork/pool"
	"github.com/pgfork/pgfork/serve"
	"github.com/pgfork/pgfork/server/managed"
)

// TestChooseCopies: auto gives cloned clusters on PostgreSQL 15-17 on a
// reflink filesystem only; PostgreSQL 18 clones databases itself, and
// without reflink a cluster copy copies every database in full.
func TestChooseCopies(t *testing.T) {
	for _, c := range []struct {
		copies string
		major  int
		shares bool
		want   bool
	}{
		{"auto", 15, true, true}, {"", 17, true, true}, {"auto", 15, false, false}, {"auto", 18, true, false},
		{"databases", 15, true, false}, {"clusters", 18, false, true},
	} {
		if got, err := serve.ChooseCopies(c.copies, c.major, c.shares); err != nil || got != c.want {
			t.Errorf("ChooseCopies(%q, %d, %v) = %v, %v; want %v", c.copies, c.major, c.shares, got, err, c.want)
		}
	}
	if _, err := serve.ChooseCopies("cluster", 15, true); errs.KindOf(err) != errs.Usage {
		t.Errorf("ChooseCopies(cluster) = %v, want a usage error", err)
	}
}

func connectAs(ctx context.Context, t testing.TB, c pool.ConnInfo, ep pool.Endpoint) *pgx.Conn {
	t.Helper()
	if ep.Port == 0 {
		ep.Host, ep.Port = c.Host, c.Port
	}
	q := url.Values{"host": {ep.Host}, "port": {strconv.Itoa(ep.Port)}, "user": {c.Username}, "password": {c.Password}, "dbname": {ep.Database}}
	conn, err := pgx.Connect(ctx, "postgres:///?"+q.Encode())
	if err != nil {
		t.Fatalf("connect to %+v: %v", ep, err)
	}
	return conn
}

// TestManagedClustersBelow18 (issue 33): on PostgreSQL 15 with the state
// on a reflink filesystem, the managed mode gives each test a reflink
// copy of its template's cluster on a port of its own (CREATE DATABASE
// would copy the template in full), with the managed server's role and
// password (a superuser, or with --least-privilege a CREATEDB role), and
// a test's writes reach neither the template nor the next test. A
// leftover of a killed serve (a test cluster still running, its
// directory) is stopped and removed by the next start.
func TestManagedClustersBelow18(t *testing.T) {
	// One state directory: the second run finds the base cluster made.
	root := filepath.Join(testenv.XFSDir(t), "state")
	for _, least := range []bool{false, true} {
		t.Run("least-privilege="+strconv.FormatBool(least), func(t *testing.T) {
			testManagedClusters(t, root, least)
		})
	}
}

func testManagedClusters(t *testing.T, root string, least bool) {
	hash := "clusters-" + strconv.FormatBool(least)
	ctx := context.Background()
	o := managedOptions(t, root)
	if o.PG.Major >= 18 {
		t.Skipf("the first PostgreSQL of the test environment is %d: it clones databases itself", o.PG.Major)
	}
	o.LeastPrivilege = least
	o.Manager.Initial = 1
	b, err := serve.NewManaged(ctx, o)
	if err != nil {
		t.Fatal(err)
	}
	closed := false
	defer func() {
		if !closed {
			_ = b.Close(context.Background())
		}
	}()
	if b.Copies != serve.CopiesClusters {
		t.Fatalf("PostgreSQL %d on XFS: copies %q, want cloned clusters", o.PG.Major, b.Copies)
	}
	dir := managed.Dir(filepath.Join(root, "serve"), o.PG.Major)
	if pw, err := os.ReadFile(filepath.Join(dir, "password")); err != nil || strings.TrimSpace(string(pw)) != b.Conn.Password {
		t.Fatalf("the clients' password is not the managed server's (%v)", err)
	}
	if _, err := os.Stat(filepath.Join(dir, "pgdata")); err == nil {
		t.Error("the managed server was created too: the cloned clusters need none")
	}
	tpl, err := b.Manager.InitializeTemplate(ctx, hash)
	if err != nil {
		t.Fatal(err)
	}
	c := connectAs(ctx, t, b.Conn, tpl.Endpoint)
	if _, err := c.Exec(ctx, "CREATE TABLE items AS SELECT g AS id, repeat('x', 200) AS pad FROM generate_series(1, 20000) g"); err != nil {
		t.Fatal(err)
	}
	var super bool
	if err := c.QueryRow(ctx, "SELECT rolsuper FROM pg_roles WHERE rolname = current_user").Scan(&super); err != nil {
		t.Fatal(err)
	}
	if super == least {
		t.Errorf("the clients' role: superuser %v with least privilege %v", super, least)
	}
	var roles string
	if err := c.QueryRow(ctx, `SELECT string_agg(rolname, ',' ORDER BY rolname) FROM pg_roles WHERE rolname NOT LIKE 'pg\_%'`).Scan(&roles); err != nil {
		t.Fatal(err)
	}
	if roles != "pgfork,postgres" {
		t.Errorf("roles of the template's cluster: %s, want the clients' and the bootstrap superuser only", roles)
	}
	c.Close(ctx)
	if err := b.Manager.FinalizeTemplate(ctx, hash); err != nil {
		t.Fatal(err)
	}
	var ports []int
	for i := range 2 {
		db, err := b.Manager.GetTestDatabase(ctx, hash)
		if err != nil {
			t.Fatal(err)
		}
		if db.Endpoint.Port == 0 || db.Endpoint.Port == tpl.Endpoint.Port {
			t.Fatalf("test database %+v: want a cluster of its own", db.Endpoint)
		}
		ports = append(ports, db.Endpoint.Port)
		if db.Endpoint.Database != b.Manager.TestName(hash, db.ID) {
			t.Errorf("test database named %q, want the test's name %q", db.Endpoint.Database, b.Manager.TestName(hash, db.ID))
		}
		c := connectAs(ctx, t, b.Conn, db.Endpoint)
		var n int
		if err := c.QueryRow(ctx, "SELECT count(*) FROM items").Scan(&n); err != nil || n != 20000 {
			t.Fatalf("test %d: %d rows of the template's 20000 (%v)", i, n, err)
		}
		if _, err := c.Exec(ctx, "DELETE FROM items"); err != nil {
			t.Fatal(err)
		}
		// The table's file in this test's database (a slot copy of the
		// template's database has an OID of its own).
		var data, file string
		if err := c.QueryRow(ctx, "SELECT current_setting('data_directory'), pg_relation_filepath('items')").Scan(&data, &file); err == nil && !least {
			if shared, err := clone.SharedBytes(filepath.Join(data, file)); err != nil || shared == 0 {
				t.Errorf("the test cluster's copy of the table shares no blocks (%d, %v): not a reflink copy", shared, err)
			}
		}
		c.Close(ctx)
		if err := b.Manager.Recreate(ctx, hash, db.ID); err != nil {
			t.Fatal(err)
		}
	}
	if ports[0] == ports[1] {
		t.Logf("both tests got port %d (a port is reused once its cluster stopped)", ports[0])
	}

	if least {
		return // the leftover below is the same either way
	}
	// A killed serve leaves a test cluster running: the next start stops
	// it and removes it.
	leftover := filepath.Join(dir, "clusters", "tests", b.Manager.TestName(hash, 999))
	cctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	if err := b.Close(cctx); err != nil {
		t.Fatal(err)
	}
	closed = true
	tplData := filepath.Join(dir, "clusters", "templates")
	ents, _ := os.ReadDir(tplData)
	if len(ents) == 0 {
		t.Fatal("no template cluster")
	}
	u := o.User
	if err := os.MkdirAll(leftover, 0o755); err != nil {
		t.Fatal(err)
	}
	if _, err := clone.Copy(ctx, filepath.Join(tplData, ents[0].Name(), "data"), filepath.Join(leftover, "data"),
		clone.Options{Sync: clone.SyncNone, Filter: pgdata.Filter, Owner: u.Owner()}); err != nil {
		t.Fatal(err)
	}
	inst, err := instance.Start(ctx, instance.Config{BinDir: o.PG.BinDir, Env: o.PG.Env(), DataDir: filepath.Join(leftover, "data"), User: u, Profile: instance.Test})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = inst.Stop(context.Background(), instance.Immediate) }()
	again, err := serve.NewManaged(ctx, o)
	if err != nil {
		t.Fatal(err)
	}
	defer again.Close(context.Background())
	if running(filepath.Join(leftover, "data")) {
		t.Error("the leftover test cluster still runs after the next start")
	}
	if _, err := os.Stat(leftover); err == nil {
		t.Error("the leftover test cluster's directory is still there")
	}
	if _, err := again.Manager.GetTestDatabase(ctx, hash); err != nil {
		t.Fatalf("the template after a restart: %v", err)
	}
}
