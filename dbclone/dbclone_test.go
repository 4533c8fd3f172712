package dbclone

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgfork/pgfork/internal/errs"
)

func TestValidateName(t *testing.T) {
	ok := []string{"a", "with space", `quote"d`, "it's", "MixedCase", "ünïcødé", strings.Repeat("x", 63), strings.Repeat("é", 31) + "x"}
	for _, n := range ok {
		if err := ValidateName(n); err != nil {
			t.Errorf("ValidateName(%q) = %v, want nil", n, err)
		}
	}
	bad := []string{"", strings.Repeat("x", 64), strings.Repeat("é", 32), "nul\x00byte", "bad\xffutf8"}
	for _, n := range bad {
		err := ValidateName(n)
		if errs.KindOf(err) != errs.Usage {
			t.Errorf("ValidateName(%q) = %v, want a usage error", n, err)
		}
	}
	if _, err := CountNames(strings.Repeat("p", 60), 1000); errs.KindOf(err) != errs.Usage {
		t.Errorf("CountNames with a too-long longest name = %v, want a usage error", err)
	}
	if n, err := CountNames("w", 3); err != nil || strings.Join(n, ",") != "w_1,w_2,w_3" {
		t.Errorf("CountNames(w, 3) = %v, %v", n, err)
	}
}

const fixtureTemplate = `Fixture "tmpl" ü`

var fixtures sync.Map // server name -> *sync.Once

// fixture creates (once per server) a template with tables, hstore and
// pgcrypto data, a sequence and a large object.
func fixture(t *testing.T, s *server) string {
	t.Helper()
	once, _ := fixtures.LoadOrStore(s.name, &sync.Once{})
	var ferr error
	once.(*sync.Once).Do(func() {
		ferr = makeContentDB(s, fixtureTemplate, 20000)
	})
	if ferr != nil {
		t.Fatal(ferr)
	}
	return fixtureTemplate
}

func makeContentDB(s *server, name string, rows int) error {
	ctx := context.Background()
	c, err := pgx.Connect(ctx, s.inst.ConnString("", ""))
	if err != nil {
		return err
	}
	defer c.Close(ctx)
	if _, err := c.Exec(ctx, "CREATE DATABASE "+quote(name)); err != nil {
		return err
	}
	d, err := pgx.Connect(ctx, s.inst.ConnString("", name))
	if err != nil {
		return err
	}
	defer d.Close(ctx)
	for _, q := range []string{
		`CREATE EXTENSION pgcrypto`,
		`CREATE EXTENSION hstore`,
		`CREATE TABLE "Items" (id serial PRIMARY KEY, name text, attrs hstore, digest bytea)`,
		fmt.Sprintf(`INSERT INTO "Items" (name, attrs, digest) SELECT 'item ' || g, hstore('k', g::text), digest(g::text, 'sha256') FROM generate_series(1, %d) g`, rows),
		`CREATE TABLE "other table" (k text PRIMARY KEY, v jsonb)`,
		`INSERT INTO "other table" SELECT 'key' || g, jsonb_build_object('g', g) FROM generate_series(1, 500) g`,
		`CREATE SEQUENCE "Seq two"`,
		`SELECT setval('"Seq two"', 42)`,
		`SELECT lo_from_bytea(0, convert_to(repeat('large object payload ', 1000), 'UTF8'))`,
	} {
		if _, err := d.Exec(ctx, q); err != nil {
			return fmt.Errorf("%s: %w", q, err)
		}
	}
	return nil
}

// fingerprint sums up a database's content: per-table checksums, sequences'
// last values, large objects and extensions.
func fingerprint(t *testing.T, s *server, db string) string {
	t.Helper()
	ctx := context.Background()
	// Its own connection, closed on return: a session left on a template
	// would block copies of it.
	c, err := pgx.Connect(ctx, s.inst.ConnString("", db))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close(ctx)
	var b strings.Builder
	rows, err := c.Query(ctx, `SELECT format('%I.%I', schemaname, relname) FROM pg_stat_user_tables ORDER BY 1`)
	if err != nil {
		t.Fatal(err)
	}
	tables, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	if len(tables) == 0 {
		t.Fatalf("%s: database %q has no tables", s.name, db)
	}
	for _, tb := range tables {
		var sum string
		var n int64
		if err := c.QueryRow(ctx, `SELECT md5(coalesce(string_agg(x::text, ',' ORDER BY x::text), '')), count(*) FROM `+tb+` x`).Scan(&sum, &n); err != nil {
			t.Fatal(err)
		}
		fmt.Fprintf(&b, "table %s %d %s\n", tb, n, sum)
	}
	for _, q := range []string{
		`SELECT coalesce(string_agg(sequencename || '=' || coalesce(last_value, 0), ',' ORDER BY sequencename), '') FROM pg_sequences`,
		`SELECT coalesce(string_agg(md5(lo_get(oid)), ',' ORDER BY oid), '') FROM pg_largeobject_metadata`,
		`SELECT string_agg(extname || ' ' || extversion, ',' ORDER BY extname) FROM pg_extension`,
	} {
		var v string
		if err := c.QueryRow(ctx, q).Scan(&v); err != nil {
			t.Fatal(err)
		}
		b.WriteString(v + "\n")
	}
	return b.String()
}

func dropDB(t *testing.T, conn *pgx.Conn, name string) {
	t.Helper()
	if _, err := conn.Exec(context.Background(), "DROP DATABASE IF EXISTS "+quote(name)+" WITH (FORCE)"); err != nil {
		t.Fatal(err)
	}
}

func TestCreateEveryStrategyCopiesContent(t *testing.T) {
	each(t, func(t *testing.T, s *server) {
		ctx := context.Background()
		tmpl := fixture(t, s)
		want := fingerprint(t, s, tmpl)
		conn := s.connect(t, "", "")
		tg, err := Inspect(ctx, conn, s.canClone)
		if err != nil {
			t.Fatal(err)
		}
		if tg.Version != s.major {
			t.Fatalf("Inspect says version %d, want %d", tg.Version, s.major)
		}
		for _, st := range []Strategy{WalLog, FileCopy, Clone, Auto} {
			name := "copy by " + string(st) + " Ü"
			res, err := Create(ctx, conn, name, tmpl, CreateOptions{Strategy: st, Target: tg})
			if st == Clone && !(s.canClone && s.major >= 18) {
				if errs.KindOf(err) != errs.Unsupported {
					t.Fatalf("clone on %s: got %v, want an unsupported error", s.name, err)
				}
				continue
			}
			if err != nil {
				t.Fatalf("%s: %v", st, err)
			}
			t.Cleanup(func() { dropDB(t, conn, name) })
			if st != Auto && res.Strategy != st {
				t.Errorf("%s: result says strategy %s", st, res.Strategy)
			}
			if st == Auto {
				if res.Advice == nil || res.Strategy != res.Advice.Choice {
					t.Errorf("auto: advice %+v, used %s", res.Advice, res.Strategy)
				}
				if s.canClone && s.major >= 18 && res.Strategy == WalLog {
					t.Errorf("auto chose wal_log where clone is available")
				}
			}
			if got := fingerprint(t, s, name); got != want {
				t.Errorf("%s: copy differs from template:\n got %s\nwant %s", st, got, want)
			}
			t.Logf("%s: %s", st, res.Elapsed)
		}
		// The session's file_copy_method is left as the server has it.
		if tg.Version >= 18 {
			var m string
			if err := conn.QueryRow(ctx, "SHOW file_copy_method").Scan(&m); err != nil || m != tg.FileCopyMethod {
				t.Errorf("file_copy_method after Create = %q (%v), want %q", m, err, tg.FileCopyMethod)
			}
		}
	})
}

func TestCreateErrors(t *testing.T) {
	each(t, func(t *testing.T, s *server) {
		ctx := context.Background()
		tmpl := fixture(t, s)
		conn := s.connect(t, "", "")
		cases := []struct {
			name, tmpl string
			opts       CreateOptions
			kind       errs.Kind
			msg        string
		}{
			{"postgres", tmpl, CreateOptions{}, errs.Exists, `"postgres" already exists`},
			{"new one", "no such template", CreateOptions{}, errs.NotFound, `"no such template" does not exist`},
			{"", tmpl, CreateOptions{}, errs.Usage, "empty"},
			{strings.Repeat("n", 64), tmpl, CreateOptions{}, errs.Usage, "64 bytes"},
			{"new one", tmpl, CreateOptions{Strategy: "fast"}, errs.Usage, "unknown strategy"},
			{"new one", tmpl, CreateOptions{Owner: "no such role"}, errs.NotFound, "new one"},
		}
		for _, c := range cases {
			_, err := Create(ctx, conn, c.name, c.tmpl, c.opts)
			if errs.KindOf(err) != c.kind || err == nil || !strings.Contains(err.Error(), c.msg) {
				t.Errorf("Create(%q, %q, %+v) = %v, want %v error mentioning %q", c.name, c.tmpl, c.opts, err, c.kind, c.msg)
			}
			if errs.HintOf(err) == "" && c.kind != errs.NotFound {
				t.Errorf("Create(%q): error %v has no hint", c.name, err)
			}
		}
		var n int
		if err := conn.QueryRow(ctx, `SELECT count(*) FROM pg_database WHERE datname = 'new one'`).Scan(&n); err != nil || n != 0 {
			t.Errorf("a failed Create left a database behind (%d, %v)", n, err)
		}
	})
}

func TestCreatePrivileges(t *testing.T) {
	each(t, func(t *testing.T, s *server) {
		ctx := context.Background()
		tmpl := fixture(t, s)
		admin := s.connect(t, "", "")
		for _, q := range []string{
			`DROP ROLE IF EXISTS "no createdb"`, `CREATE ROLE "no createdb" LOGIN`,
			`DROP ROLE IF EXISTS "can createdb"`, `CREATE ROLE "can createdb" LOGIN CREATEDB`,
		} {
			if _, err := admin.Exec(ctx, q); err != nil {
				t.Fatal(err)
			}
		}
		t.Cleanup(func() {
			dropDB(t, admin, "mine")
			_, _ = admin.Exec(ctx, `DROP ROLE IF EXISTS "no createdb"`)
			_, _ = admin.Exec(ctx, `DROP ROLE IF EXISTS "can createdb"`)
		})
		c := s.connect(t, "no createdb", "postgres")
		_, err := Create(ctx, c, "mine", tmpl, CreateOptions{Strategy: WalLog})
		if errs.KindOf(err) != errs.Permission || !strings.Contains(err.Error(), "CREATEDB") || !strings.Contains(errs.HintOf(err), `ALTER ROLE "no createdb" CREATEDB`) {
			t.Errorf("no CREATEDB: got %v (hint %q), want a permission error with the ALTER ROLE hint", err, errs.HintOf(err))
		}
		c2 := s.connect(t, "can createdb", "postgres")
		_, err = Create(ctx, c2, "mine", tmpl, CreateOptions{Strategy: WalLog})
		if errs.KindOf(err) != errs.Permission || !strings.Contains(errs.HintOf(err), "IS_TEMPLATE") {
			t.Errorf("not the template's owner: got %v (hint %q), want a permission error about IS_TEMPLATE", err, errs.HintOf(err))
		}
		// template1 is a template: allowed.
		if _, err := Create(ctx, c2, "mine", "template1", CreateOptions{Strategy: WalLog}); err != nil {
			t.Errorf("CREATEDB role copying template1: %v", err)
		}
	})
}

func TestCreateTemplateBusy(t *testing.T) {
	each(t, func(t *testing.T, s *server) {
		ctx := context.Background()
		admin := s.connect(t, "", "")
		tmpl := "busy template"
		dropDB(t, admin, tmpl)
		s.exec(t, admin, "CREATE DATABASE "+quote(tmpl))
		t.Cleanup(func() { dropDB(t, admin, tmpl) })

		cfg, _ := pgx.ParseConfig(s.inst.ConnString("", tmpl))
		cfg.RuntimeParams["application_name"] = "busy-holder"
		holder, err := pgx.ConnectConfig(ctx, cfg)
		if err != nil {
			t.Fatal(err)
		}
		defer holder.Close(ctx)
		var pid int
		_ = holder.QueryRow(ctx, "SELECT pg_backend_pid()").Scan(&pid)

		// Without --force: waits, then fails naming the session.
		t0 := time.Now()
		_, err = Create(ctx, admin, "busy copy", tmpl, CreateOptions{Strategy: WalLog, WaitTimeout: 300 * time.Millisecond})
		if errs.KindOf(err) != errs.Busy || !strings.Contains(err.Error(), fmt.Sprintf("pid %d", pid)) ||
			!strings.Contains(err.Error(), "busy-holder") || !strings.Contains(err.Error(), "user postgres") {
			t.Fatalf("busy template: got %v, want a busy error naming pid %d and busy-holder", err, pid)
		}
		// At the earliest after its wait; the upper bound only says it
		// did not wait for something else (no load reaches a minute).
		if el := time.Since(t0); el < 300*time.Millisecond || el > time.Minute {
			t.Errorf("busy error after %s, want after the 300ms wait", el)
		}
		// A session that leaves while we wait is waited for.
		go func() { time.Sleep(200 * time.Millisecond); holder.Close(ctx) }()
		res, err := Create(ctx, admin, "busy copy", tmpl, CreateOptions{Strategy: WalLog, WaitTimeout: time.Minute})
		if err != nil || len(res.Terminated) != 0 {
			t.Fatalf("waiting for a session to leave: %v (terminated %v)", err, res)
		}
		dropDB(t, admin, "busy copy")

		// With force: the session is terminated.
		holder2, err := pgx.ConnectConfig(ctx, cfg)
		if err != nil {
			t.Fatal(err)
		}
		defer holder2.Close(ctx)
		res, err = Create(ctx, admin, "busy copy", tmpl, CreateOptions{Strategy: FileCopy, Force: true})
		if err != nil {
			t.Fatalf("force: %v", err)
		}
		t.Cleanup(func() { dropDB(t, admin, "busy copy") })
		if len(res.Terminated) != 1 || res.Terminated[0].Application != "busy-holder" {
			t.Errorf("force terminated %+v, want the busy-holder session", res.Terminated)
		}
		if _, err := holder2.Exec(ctx, "SELECT 1"); err == nil {
			t.Errorf("the terminated session still works")
		}
	})
}

func TestCreateConcurrentFromOneTemplate(t *testing.T) {
	each(t, func(t *testing.T, s *server) {
		ctx := context.Background()
		tmpl := fixture(t, s)
		want := fingerprint(t, s, tmpl)
		admin := s.connect(t, "", "")
		const n = 6
		errc := make(chan error, n)
		var wg sync.WaitGroup
		for i := range n {
			wg.Add(1)
			go func() {
				defer wg.Done()
				c, err := pgx.Connect(ctx, s.inst.ConnString("", ""))
				if err != nil {
					errc <- err
					return
				}
				defer c.Close(ctx)
				st := []Strategy{Auto, WalLog, FileCopy}[i%3]
				// A minute to wait for the others' sessions: a loaded machine
				// decides how long they stay.
				_, err = Create(ctx, c, fmt.Sprintf("concurrent %d", i), tmpl, CreateOptions{Strategy: st, WaitTimeout: time.Minute})
				errc <- err
			}()
		}
		wg.Wait()
		close(errc)
		for err := range errc {
			if err != nil {
				t.Fatal(err)
			}
		}
		for i := range n {
			name := fmt.Sprintf("concurrent %d", i)
			t.Cleanup(func() { dropDB(t, admin, name) })
			if got := fingerprint(t, s, name); got != want {
				t.Errorf("%s differs from the template", name)
			}
		}
		// CreateMany: bounded concurrency, names _1.._N.
		names, _ := CountNames("many", 8)
		connect := func(ctx context.Context) (*pgx.Conn, error) { return pgx.Connect(ctx, s.inst.ConnString("", "")) }
		var calls int
		res, err := CreateMany(ctx, connect, names, "template1", CreateOptions{}, 3, func(done, total int) { calls++ })
		if err != nil {
			t.Fatal(err)
		}
		for _, n := range names {
			t.Cleanup(func() { dropDB(t, admin, n) })
		}
		if len(res.Created) != 8 || calls != 8 || res.Rate <= 0 {
			t.Errorf("CreateMany: %+v, %d progress calls", res, calls)
		}
		// A second run fails on the first existing name and says so.
		if _, err := CreateMany(ctx, connect, names[:2], "template1", CreateOptions{Strategy: WalLog}, 2, nil); errs.KindOf(err) != errs.Exists {
			t.Errorf("CreateMany over existing names: %v, want an exists error", err)
		}
	})
}

func TestOddNames(t *testing.T) {
	each(t, func(t *testing.T, s *server) {
		ctx := context.Background()
		admin := s.connect(t, "", "")
		names := []string{
			"with space", `with "quotes" and 'apostrophes'`, "MixedCase", "ünïcødé ☃",
			strings.Repeat("m", 63), strings.Repeat("é", 31) + "x", "semi;colon -- DROP DATABASE postgres",
		}
		prev := "template1"
		for _, n := range names {
			if _, err := Create(ctx, admin, n, prev, CreateOptions{Strategy: WalLog}); err != nil {
				t.Fatalf("%q: %v", n, err)
			}
			t.Cleanup(func() { dropDB(t, admin, n) })
			var got string
			if err := admin.QueryRow(ctx, `SELECT datname FROM pg_database WHERE datname = $1`, n).Scan(&got); err != nil || got != n {
				t.Errorf("database %q: found %q (%v)", n, got, err)
			}
			prev = n
		}
		// Snapshots of a 63-byte name with quotes keep within the limit.
		long := `"` + strings.Repeat("q", 61) + `"`
		if _, err := Create(ctx, admin, long, "template1", CreateOptions{Strategy: WalLog}); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { dropDB(t, admin, long) })
		info, _, err := Snapshot(ctx, admin, long, strings.Repeat("s", 63), CreateOptions{Strategy: WalLog})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _, _ = RemoveSnapshot(ctx, admin, long, info.Name) })
		if len(info.Database) > MaxNameBytes {
			t.Errorf("snapshot database name %q is too long", info.Database)
		}
	})
}

func TestSnapshotRestore(t *testing.T) {
	each(t, func(t *testing.T, s *server) {
		ctx := context.Background()
		admin := s.connect(t, "", "")
		db := `App "dev" DB`
		dropDB(t, admin, db)
		if err := makeContentDB(s, db, 2000); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { dropDB(t, admin, db) })
		before := fingerprint(t, s, db)

		info, res, err := Snapshot(ctx, admin, db, "", CreateOptions{Target: &Target{Version: s.major, CanClone: s.canClone}})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _, _ = RemoveSnapshot(ctx, admin, db, info.Name) })
		if s.canClone && s.major >= 18 && res.Strategy == WalLog {
			t.Errorf("snapshot by wal_log where clone is available")
		}
		if _, err := Refill(ctx, admin, info, CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		if _, _, err := Snapshot(ctx, admin, db, info.Name, CreateOptions{}); errs.KindOf(err) != errs.Exists {
			t.Errorf("second snapshot with the same name: %v, want an exists error", err)
		}
		// The snapshot cannot be connected to, and its metadata is listed.
		if c, err := pgx.Connect(ctx, s.inst.ConnString("", info.Database)); err == nil {
			c.Close(ctx)
			t.Errorf("could connect to snapshot database %s", info.Database)
		}
		list, err := Snapshots(ctx, admin, db)
		if err != nil || len(list) != 1 || list[0].Name != info.Name || !list[0].HasSpare || list[0].Size <= 0 || list[0].Source != db {
			t.Fatalf("Snapshots = %+v, %v", list, err)
		}

		// Change the database, then restore it.
		c := s.connect(t, "", db)
		s.exec(t, c, `DELETE FROM "Items" WHERE id % 2 = 0`)
		s.exec(t, c, `SELECT nextval('"Seq two"')`)
		s.exec(t, c, `CREATE TABLE added (x int)`)
		_ = c.Close(ctx)
		if fingerprint(t, s, db) == before {
			t.Fatal("the change did not change the fingerprint")
		}
		r, err := Restore(ctx, admin, db, "", RestoreOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if got := fingerprint(t, s, db); got != before {
			t.Errorf("restored database differs from the snapshot:\n got %s\nwant %s", got, before)
		}
		t.Logf("restore %s (swap %s)", r.Elapsed, r.Swap)
		var left int
		_ = admin.QueryRow(ctx, `SELECT count(*) FROM pg_database WHERE datname LIKE 'pgfork\_old\_%'`).Scan(&left)
		if left != 0 {
			t.Errorf("%d old databases left after restore", left)
		}
		// No spare until refilled; restoring then copies first.
		if l, _ := Snapshots(ctx, admin, db); len(l) != 1 || l[0].HasSpare {
			t.Errorf("after restore: %+v, want a snapshot without spare", l)
		}
		if _, err := Refill(ctx, admin, &list[0], CreateOptions{}); err != nil {
			t.Fatal(err)
		}

		// A session on the database blocks the restore, named, unless forced.
		cfg, _ := pgx.ParseConfig(s.inst.ConnString("", db))
		cfg.RuntimeParams["application_name"] = "editor"
		holder, err := pgx.ConnectConfig(ctx, cfg)
		if err != nil {
			t.Fatal(err)
		}
		defer holder.Close(ctx)
		s.exec(t, holder, `CREATE TABLE added_again (x int)`)
		_, err = Restore(ctx, admin, db, info.Name, RestoreOptions{})
		if errs.KindOf(err) != errs.Busy || !strings.Contains(err.Error(), "editor") || !strings.Contains(errs.CLIHintOf(err), "--force") {
			t.Fatalf("restore with a session: %v, want a busy error naming the editor session", err)
		}
		if _, err := holder.Exec(ctx, "SELECT 1"); err != nil {
			t.Errorf("a refused restore broke the session: %v", err)
		}
		r, err = Restore(ctx, admin, db, info.Name, RestoreOptions{Create: CreateOptions{Force: true}})
		if err != nil {
			t.Fatal(err)
		}
		if len(r.Terminated) != 1 || r.CopiedFirst {
			t.Errorf("forced restore: %+v", r)
		}
		if got := fingerprint(t, s, db); got != before {
			t.Errorf("forced restore: content differs")
		}
		// Without a spare the restore copies first.
		r, err = Restore(ctx, admin, db, info.Name, RestoreOptions{})
		if err != nil || !r.CopiedFirst {
			t.Errorf("restore without spare: %+v, %v", r, err)
		}

		// Errors: unknown snapshot, unknown database.
		if _, err := Restore(ctx, admin, db, "nope", RestoreOptions{}); errs.KindOf(err) != errs.NotFound {
			t.Errorf("restore of a missing snapshot: %v", err)
		}
		if _, _, err := Snapshot(ctx, admin, "no such db", "", CreateOptions{}); errs.KindOf(err) != errs.NotFound {
			t.Errorf("snapshot of a missing database: %v", err)
		}
		if _, err := RemoveSnapshot(ctx, admin, "", info.Name); err != nil {
			t.Errorf("RemoveSnapshot: %v", err)
		}
		if l, _ := Snapshots(ctx, admin, db); len(l) != 0 {
			t.Errorf("after rm: %+v", l)
		}
		var left2 int
		_ = admin.QueryRow(ctx, `SELECT count(*) FROM pg_database WHERE datname LIKE 'pgfork\_%'`).Scan(&left2)
		if left2 != 0 {
			t.Errorf("%d pgfork databases left after rm-snapshot", left2)
		}
	})
}
