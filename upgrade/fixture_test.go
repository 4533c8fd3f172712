package upgrade_test

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgfork/pgfork/clone"
	"github.com/pgfork/pgfork/instance"
	"github.com/pgfork/pgfork/internal/pgtest"
	"github.com/pgfork/pgfork/internal/testenv"
	"github.com/pgfork/pgfork/pgbin"
	"github.com/pgfork/pgfork/pgclone"
	"github.com/pgfork/pgfork/upgrade"
)

// builds are the old (oldest) and new (newest) PostgreSQL builds under test.
type builds struct{ old, new upgrade.Install }

func findBuilds(t *testing.T) builds {
	t.Helper()
	all := allBuilds(t)
	b := builds{old: all[0], new: all[len(all)-1]}
	if b.old.Major == b.new.Major {
		t.Skip("needs two different PostgreSQL majors")
	}
	return b
}

// findBuildsBefore18 returns the oldest build and the newest one older
// than PostgreSQL 18 (which starts without optimizer statistics after
// pg_upgrade).
func findBuildsBefore18(t *testing.T) builds {
	t.Helper()
	all := allBuilds(t)
	b := builds{old: all[0]}
	for _, in := range all {
		if in.Major > b.old.Major && in.Major < 18 {
			b.new = in
		}
	}
	if b.new.BinDir == "" {
		if testenv.Require() {
			t.Fatal("needs a PostgreSQL major between the oldest and 18 (e.g. 17)")
		}
		t.Skip("needs a PostgreSQL major between the oldest and 18 (e.g. 17)")
	}
	return b
}

func allBuilds(t *testing.T) []upgrade.Install {
	t.Helper()
	dirs := testenv.RequireMajors(t, 2)
	var all []upgrade.Install
	for _, d := range dirs {
		v, err := pgbin.ToolVersion(context.Background(), filepath.Join(d, "postgres"), nil)
		if err != nil {
			t.Fatalf("%s: %v", d, err)
		}
		m, err := pgbin.MajorOf(v)
		if err != nil {
			t.Fatal(err)
		}
		in := pgbin.Installation{BinDir: d, Version: v, Major: m}
		all = append(all, upgrade.Install{BinDir: d, Version: v, Major: m, Env: in.Env()})
	}
	sort.Slice(all, func(i, j int) bool { return all[i].Major < all[j].Major })
	return all
}

var (
	fixtureOnce sync.Once
	fixtureDir  string
	fixtureErr  error
	fixtureSums map[string]string
)

// fixture builds (once per test binary) a stopped old-major cluster with
// data in several databases, sequences, large objects, contrib extensions
// (pgcrypto, hstore) and a table in a tablespace, and returns its data dir
// and the per-table checksums of its contents.
func fixture(t *testing.T, b builds) (string, map[string]string) {
	t.Helper()
	fixtureOnce.Do(func() {
		base, err := os.MkdirTemp("", "pgfork-upgrade-fixture-")
		if err != nil {
			fixtureErr = err
			return
		}
		_ = os.Chmod(base, 0o755)
		fixtureDir = filepath.Join(base, "data")
		fixtureSums, fixtureErr = buildFixture(b.old, fixtureDir, filepath.Join(base, "tblspc"), pgtest.User(t))
	})
	if fixtureErr != nil {
		t.Fatalf("fixture: %v", fixtureErr)
	}
	return fixtureDir, fixtureSums
}

// TestMain removes the shared fixture at the end.
//
// The upgrade tests mostly wait on pg_upgrade, PostgreSQL and the disks, so
// the ones that can run beside each other call t.Parallel(); Go starts them
// only once every test that does not has finished. Each works in a
// directory of its own on its own copy of the fixture (copyFixture), with
// ports from instance.FreePort, and pg_upgrade's servers listen only on
// the run's private socket directory. A test stays serial when it sets one
// of the package's hooks (upgrade.SetTestHook, upgrade.SetHookBeforeStop:
// one per process, which would fire in the other tests' runs too) or looks
// at every process on the machine (TestOnlineRehearsal's nice check).
// TestKillDuringUpgrade's killed runs are processes of their own, so they
// set the hooks there and the test itself runs in parallel.
func TestMain(m *testing.M) {
	code := m.Run()
	if fixtureDir != "" {
		_ = os.RemoveAll(filepath.Dir(fixtureDir))
	}
	os.Exit(code)
}

func buildFixture(old upgrade.Install, data, tsDir string, u *instance.OSUser) (map[string]string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	if err := instance.InitDB(ctx, instance.InitOptions{BinDir: old.BinDir, Env: old.Env, DataDir: data, User: u, NoSync: true, Locale: "C.UTF-8"}); err != nil {
		return nil, err
	}
	if err := u.MkdirOwned(tsDir, 0o700); err != nil {
		return nil, err
	}
	inst, err := instance.Start(ctx, instance.Config{BinDir: old.BinDir, Env: old.Env, DataDir: data, User: u, Profile: instance.Test,
		LogFile: filepath.Join(filepath.Dir(data), "fixture.log")})
	if err != nil {
		return nil, err
	}
	defer func() { _ = inst.Stop(context.Background(), instance.Fast) }()
	exec := func(db string, sqls ...string) error {
		conn, err := pgx.Connect(ctx, inst.ConnString("", db))
		if err != nil {
			return err
		}
		defer conn.Close(ctx)
		for _, q := range sqls {
			if _, err := conn.Exec(ctx, q); err != nil {
				return fmt.Errorf("%s: %s: %w", db, q, err)
			}
		}
		return nil
	}
	if err := exec("postgres",
		"CREATE TABLESPACE ts1 LOCATION '"+tsDir+"'",
		"CREATE DATABASE shop", "CREATE DATABASE crm",
		"CREATE TABLE notes(id serial primary key, body text)",
		"INSERT INTO notes(body) SELECT 'note ' || g FROM generate_series(1, 50) g",
	); err != nil {
		return nil, err
	}
	if err := exec("shop",
		"CREATE EXTENSION pgcrypto", "CREATE EXTENSION hstore",
		"CREATE TABLE items(id bigserial primary key, name text not null, attrs hstore, digest bytea, price numeric(10,2))",
		"INSERT INTO items(name, attrs, digest, price) SELECT 'item ' || g, hstore('color', (g % 7)::text), digest('item ' || g, 'sha256'), g * 1.25 FROM generate_series(1, 3000) g",
		"CREATE INDEX items_name ON items(name)",
		"CREATE SEQUENCE order_no START 1000",
		"SELECT nextval('order_no') FROM generate_series(1, 42)",
		"CREATE TABLE archive(id int, payload text) TABLESPACE ts1",
		"INSERT INTO archive SELECT g, repeat(md5(g::text), 20) FROM generate_series(1, 2000) g",
		"CREATE TABLE docs(id int primary key, blob oid)",
		"INSERT INTO docs SELECT g, lo_from_bytea(0, convert_to(repeat('large object ' || g, 500), 'UTF8')) FROM generate_series(1, 5) g",
		"CREATE MATERIALIZED VIEW item_colors AS SELECT attrs -> 'color' AS color, count(*) FROM items GROUP BY 1",
		"ANALYZE",
	); err != nil {
		return nil, err
	}
	if err := exec("crm",
		"CREATE SCHEMA sales",
		"CREATE TABLE sales.customers(id int generated always as identity primary key, name text, since date)",
		"INSERT INTO sales.customers(name, since) SELECT 'c' || g, date '2020-01-01' + g FROM generate_series(1, 1500) g",
		"CREATE TABLE sales.events(at timestamptz, customer int references sales.customers(id), kind text) PARTITION BY RANGE (at)",
		"CREATE TABLE sales.events_2024 PARTITION OF sales.events FOR VALUES FROM ('2024-01-01') TO ('2025-01-01')",
		"INSERT INTO sales.events SELECT timestamptz '2024-01-01' + g * interval '1 hour', 1 + g % 1500, 'k' || (g % 3) FROM generate_series(1, 2000) g",
	); err != nil {
		return nil, err
	}
	return contentSums(ctx, inst)
}

// contentSums returns a checksum per table (of its rows in a stable
// order), per sequence (last value) and per large object, in every
// database, plus the installed extensions.
func contentSums(ctx context.Context, inst *instance.Instance) (map[string]string, error) {
	out := map[string]string{}
	conn, err := pgx.Connect(ctx, inst.ConnString("", "postgres"))
	if err != nil {
		return nil, err
	}
	rows, _ := conn.Query(ctx, "SELECT datname FROM pg_database WHERE datallowconn ORDER BY 1")
	dbs, err := pgx.CollectRows(rows, pgx.RowTo[string])
	conn.Close(ctx)
	if err != nil {
		return nil, err
	}
	for _, db := range dbs {
		c, err := pgx.Connect(ctx, inst.ConnString("", db))
		if err != nil {
			return nil, err
		}
		rows, _ := c.Query(ctx, `SELECT format('%I.%I', n.nspname, c.relname), c.relkind::text FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
			WHERE c.relkind IN ('r', 'S', 'm') AND n.nspname NOT IN ('pg_catalog', 'information_schema', 'pg_toast') ORDER BY 1`)
		type rel struct{ name, kind string }
		rels, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (rel, error) {
			var x rel
			return x, r.Scan(&x.name, &x.kind)
		})
		if err != nil {
			c.Close(ctx)
			return nil, err
		}
		for _, r := range rels {
			q := "SELECT coalesce(md5(string_agg(x::text, E'\\n' ORDER BY x::text)), 'empty') FROM " + r.name + " x"
			if r.kind == "S" {
				q = "SELECT last_value::text || '/' || is_called::text FROM " + r.name
			}
			var s string
			if err := c.QueryRow(ctx, q).Scan(&s); err != nil {
				c.Close(ctx)
				return nil, fmt.Errorf("%s %s: %w", db, r.name, err)
			}
			out[db+"/"+r.name] = s
		}
		var los, exts string
		if err := c.QueryRow(ctx, `SELECT coalesce(string_agg(oid::text || ':' || md5(lo_get(oid)), ',' ORDER BY oid), '') FROM pg_largeobject_metadata`).Scan(&los); err != nil {
			c.Close(ctx)
			return nil, err
		}
		if err := c.QueryRow(ctx, `SELECT string_agg(extname, ',' ORDER BY extname) FROM pg_extension`).Scan(&exts); err != nil {
			c.Close(ctx)
			return nil, err
		}
		out[db+"/large objects"] = los
		out[db+"/extensions"] = exts
		c.Close(ctx)
	}
	return out, nil
}

// copyFixture clones the fixture (with its tablespace) into dir/name.
func copyFixture(t *testing.T, b builds, dir string) string {
	t.Helper()
	src, _ := fixture(t, b)
	dst := filepath.Join(dir, "old")
	_, err := pgclone.Clone(context.Background(), pgclone.Options{
		Src: src, Dst: dst, Installation: pgbin.Installation{BinDir: b.old.BinDir, Version: b.old.Version, Major: b.old.Major},
		Method: clone.Auto, Sync: clone.SyncNone, User: pgtest.User(t),
	})
	if err != nil {
		t.Fatalf("copy fixture: %v", err)
	}
	return dst
}

// startAndSum starts a cluster, checks the extensions work and returns its
// content checksums.
func startAndSum(t *testing.T, in upgrade.Install, data string) map[string]string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	inst, err := instance.Start(ctx, instance.Config{BinDir: in.BinDir, Env: in.Env, DataDir: data, User: pgtest.User(t),
		LogFile: filepath.Join(t.TempDir(), "server.log")})
	if err != nil {
		t.Fatalf("start %s: %v", data, err)
	}
	defer func() {
		if err := inst.Stop(context.Background(), instance.Fast); err != nil {
			t.Error(err)
		}
	}()
	sums, err := contentSums(ctx, inst)
	if err != nil {
		t.Fatal(err)
	}
	conn, err := pgx.Connect(ctx, inst.ConnString("", "shop"))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	var s string
	if err := conn.QueryRow(ctx, `SELECT (hstore('a', '1') -> 'a') || encode(digest('x', 'sha1'), 'hex')`).Scan(&s); err != nil {
		t.Fatalf("extensions do not work: %v", err)
	}
	return sums
}

func compareSums(t *testing.T, want, got map[string]string) {
	t.Helper()
	if len(want) == 0 {
		t.Fatal("no checksums to compare")
	}
	for k, v := range want {
		if got[k] != v {
			t.Errorf("%s: %q after the upgrade, %q before", k, got[k], v)
		}
	}
	for k := range got {
		if _, ok := want[k]; !ok {
			t.Errorf("%s: appeared after the upgrade", k)
		}
	}
}

// treeSums returns a sha256 of every regular file's contents under the
// roots, and every symlink's target.
func treeSums(t *testing.T, roots ...string) map[string]string {
	t.Helper()
	out := map[string]string{}
	for _, root := range roots {
		err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
			if err != nil {
				return err
			}
			switch {
			case d.Type()&fs.ModeSymlink != 0:
				l, err := os.Readlink(p)
				out[p] = "-> " + l
				return err
			case d.IsDir():
				out[p] = "dir"
			case d.Type().IsRegular():
				f, err := os.Open(p)
				if err != nil {
					return err
				}
				h := sha256.New()
				_, err = io.Copy(h, f)
				f.Close()
				out[p] = hex.EncodeToString(h.Sum(nil))
				return err
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	return out
}

func tablespaceRoots(t *testing.T, data string) []string {
	t.Helper()
	roots := []string{data}
	links, _ := filepath.Glob(filepath.Join(data, "pg_tblspc", "*"))
	for _, l := range links {
		if target, err := os.Readlink(l); err == nil {
			roots = append(roots, target)
		}
	}
	if len(roots) < 2 {
		t.Fatalf("the fixture copy in %s has no tablespace", data)
	}
	return roots
}

func diffSums(a, b map[string]string) []string {
	var d []string
	for k, v := range a {
		if b[k] != v {
			d = append(d, k)
		}
	}
	for k := range b {
		if _, ok := a[k]; !ok {
			d = append(d, "+"+k)
		}
	}
	sort.Strings(d)
	return d
}
