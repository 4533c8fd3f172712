package logical_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgfork/pgfork/instance"
	"github.com/pgfork/pgfork/internal/errs"
	"github.com/pgfork/pgfork/internal/pgtest"
	"github.com/pgfork/pgfork/internal/proc"
	"github.com/pgfork/pgfork/internal/testenv"
	"github.com/pgfork/pgfork/pgbin"
	"github.com/pgfork/pgfork/pgdata"
	"github.com/pgfork/pgfork/upgrade"
	"github.com/pgfork/pgfork/upgrade/logical"
)

// builds returns the oldest and the newest PostgreSQL builds under test.
func builds(t *testing.T) (old, new upgrade.Install) {
	t.Helper()
	var all []upgrade.Install
	for _, d := range testenv.RequireMajors(t, 2) {
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
	if all[0].Major == all[len(all)-1].Major {
		t.Skip("needs two different PostgreSQL majors")
	}
	return all[0], all[len(all)-1]
}

// logicalSettings are what --logical needs of the old cluster.
func logicalSettings(extra map[string]string) map[string]string {
	s := map[string]string{"wal_level": "logical", "max_wal_senders": "10", "max_replication_slots": "10",
		"fsync": "off", "synchronous_commit": "on", "max_prepared_transactions": "2"}
	for k, v := range extra {
		s[k] = v
	}
	return s
}

// startOld starts the old cluster in dir with settings; it is stopped
// when the test ends.
func startOld(t *testing.T, old upgrade.Install, dir string, settings map[string]string) *instance.Instance {
	t.Helper()
	inst, err := instance.Start(context.Background(), instance.Config{BinDir: old.BinDir, Env: old.Env, DataDir: dir, User: pgtest.User(t),
		Settings: settings, LogFile: filepath.Join(filepath.Dir(dir), filepath.Base(dir)+".log")})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = inst.Stop(context.Background(), instance.Fast) })
	return inst
}

func run(t *testing.T, o logical.Options, onEvent func(upgrade.Event)) (*logical.Result, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	o.User = pgtest.User(t)
	o.Jobs = 2
	o.OnEvent = func(e upgrade.Event) {
		if e.Message != "" {
			t.Logf("%s: %s", e.Phase, e.Message)
		}
		if onEvent != nil {
			onEvent(e)
		}
	}
	return logical.Run(ctx, o)
}

// nothingLeft checks that the old cluster has no slot, publication or
// write refusal of the run, and that NEW_DATADIR was not left.
func nothingLeft(t *testing.T, inst *instance.Instance, dbs []string, newDir string, readOnly bool) {
	t.Helper()
	if n := pgtest.Query(t, inst.ConnString("", "postgres"), "SELECT count(*) FROM pg_replication_slots"); n != "0" {
		t.Errorf("%s replication slots left on the old cluster", n)
	}
	for _, db := range dbs {
		if n := pgtest.Query(t, inst.ConnString("", db), "SELECT count(*) FROM pg_publication"); n != "0" {
			t.Errorf("%s publications left in database %s of the old cluster", n, db)
		}
	}
	want := "off"
	if readOnly {
		want = "on"
	}
	if v := pgtest.Query(t, inst.ConnString("", "postgres"), "SHOW default_transaction_read_only"); v != want {
		t.Errorf("default_transaction_read_only on the old cluster: %s, want %s", v, want)
	}
	if newDir != "" {
		if _, err := os.Lstat(newDir); err == nil {
			t.Errorf("the new data directory %s was left", newDir)
		}
	}
}

// writer commits a row every few milliseconds on the old cluster's items
// table in database db, reconnecting after errors, and records the ids
// the server acknowledged.
type writer struct {
	mu    sync.Mutex
	acked []int64
	at    []time.Time // when each was acknowledged
	errs  int
	stop  chan struct{}
	done  chan struct{}
}

func startWriter(url string) *writer {
	w := &writer{stop: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer close(w.done)
		ctx := context.Background()
		var conn *pgx.Conn
		defer func() {
			if conn != nil {
				conn.Close(ctx)
			}
		}()
		for {
			select {
			case <-w.stop:
				return
			case <-time.After(3 * time.Millisecond):
			}
			if conn == nil || conn.IsClosed() {
				c, err := pgx.Connect(ctx, url)
				if err != nil {
					w.mu.Lock()
					w.errs++
					w.mu.Unlock()
					continue
				}
				conn = c
			}
			var id int64
			err := conn.QueryRow(ctx, "INSERT INTO items(v) VALUES ('w') RETURNING id").Scan(&id)
			w.mu.Lock()
			if err == nil {
				w.acked, w.at = append(w.acked, id), append(w.at, time.Now())
			} else {
				w.errs++
			}
			w.mu.Unlock()
		}
	}()
	return w
}

func (w *writer) count() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return len(w.acked)
}

// TestLogicalUpgradeWithWriter upgrades a running cluster with --logical
// --stop-old while a writer commits a row every few milliseconds at the
// application's address all along: after the hand-over the new cluster
// answers there, every acknowledged write is on it, the old cluster's rows
// and sequences are all on it, and nothing of the run is left on either
// side. It runs as on an old cluster without pg_walinspect (13 and 14, or
// 15+ without contrib): no WAL scan, every database subscribed
// (TestLogicalSubscribesWriters runs the scan).
func TestLogicalUpgradeWithWriter(t *testing.T) {
	old, nw := builds(t)
	logical.WithoutWALInspect(t)
	base := testenv.XFSDir(t)
	oldDir := filepath.Join(base, "old")
	pgtest.InitDB(t, oldDir, pgtest.Server{BinDir: old.BinDir, Env: old.Env})
	inst := startOld(t, old, oldDir, logicalSettings(nil))
	pg := inst.ConnString("", "postgres")
	pgtest.Exec(t, pg, "CREATE DATABASE shop", "CREATE DATABASE app")
	shop := inst.ConnString("", "shop")
	pgtest.Exec(t, shop, "CREATE TABLE items (id bigserial PRIMARY KEY, v text)",
		"INSERT INTO items(v) SELECT 'before' FROM generate_series(1, 1000)",
		"CREATE UNLOGGED TABLE scratch (x int)")
	app := inst.ConnString("", "app")
	pgtest.Exec(t, app, "CREATE TABLE events (id int PRIMARY KEY, at timestamptz DEFAULT now())",
		"CREATE SEQUENCE ticket", "SELECT nextval('ticket') FROM generate_series(1, 42)",
		"INSERT INTO events(id) SELECT g FROM generate_series(1, 100) g")

	// The application's address: the old cluster's socket and port, which
	// the new cluster takes over.
	w := startWriter(shop)
	stopWriter := func() {
		select {
		case <-w.stop:
		default:
			close(w.stop)
		}
		<-w.done
	}
	defer stopWriter()
	testenv.WaitFor(t, "the writer's first commits", func() bool { return w.count() > 10 })

	newDir := filepath.Join(base, "new")
	oldFiles := dirNames(t, oldDir)
	var afterR, atWindow int
	t0 := time.Now()
	res, err := run(t, logical.Options{OldDir: oldDir, NewDir: newDir, Old: old, New: nw, HandOver: true}, func(e upgrade.Event) {
		switch {
		case e.Phase == logical.PhaseSlots && e.Done:
			afterR = w.count()
		case e.Phase == logical.PhaseSubscribe && !e.Done && e.Message == "":
			// Written after R, before the subscriptions exist: replication
			// must carry them, and the window the sequence's moves.
			pgtest.Exec(t, app, "SELECT nextval('ticket') FROM generate_series(1, 8)", "UPDATE events SET at = now() WHERE id <= 10")
		case e.Phase == logical.PhaseWindow && !e.Done:
			atWindow = w.count()
		}
	})
	elapsed := time.Since(t0)
	if err != nil {
		t.Fatalf("upgrade --logical: %v (hint: %s)", err, errs.HintOf(err))
	}
	t.Cleanup(func() {
		if in, err := instance.Attach(newDir); err == nil {
			_ = in.Stop(context.Background(), instance.Fast)
		}
	})
	// The old data directory is the user's: the run's private start of the
	// old cluster (its clean-up) leaves no file of pgfork's there.
	if extra := newNames(oldFiles, dirNames(t, oldDir)); len(extra) > 0 {
		t.Errorf("the run left %v in the old data directory", extra)
	}
	if subs := slices.Sorted(slices.Values(res.Subscribed)); res.WALScan || !slices.Equal(subs, []string{"app", "postgres", "shop"}) {
		t.Errorf("WAL scan %v, subscribed %v; without pg_walinspect want no scan and every database subscribed (app, postgres, shop)", res.WALScan, subs)
	}
	if !res.HandedOver || res.Port != inst.Port || res.SocketDir != inst.SocketDir {
		t.Errorf("handed over %v on port %d, socket %s; want the old cluster's port %d and socket %s", res.HandedOver, res.Port, res.SocketDir, inst.Port, inst.SocketDir)
	}
	// The writer goes on at the same address, now the new cluster's.
	before := w.count()
	testenv.WaitFor(t, "writes acknowledged by the new cluster at the old one's address", func() bool { return w.count() > before+10 })
	stopWriter()
	var gap time.Duration
	for i := 1; i < len(w.at); i++ {
		gap = max(gap, w.at[i].Sub(w.at[i-1]))
	}
	t.Logf("window (writes refused until the new cluster accepted at the old address): %s; longest gap between acknowledged writes: %s; whole run: %s; R = %s; %d writes acknowledged (%d before R, %d before the window); phases: %v",
		res.Window, gap.Round(time.Millisecond), elapsed.Round(time.Millisecond), res.R, w.count(), afterR, atWindow, res.Phases)
	if atWindow <= afterR {
		t.Errorf("the writer committed nothing between R and the window (%d, %d): the test proves nothing", afterR, atWindow)
	}
	if v := pgtest.Query(t, pg, "SELECT current_setting('server_version_num')::int / 10000"); v != fmt.Sprint(nw.Major) {
		t.Errorf("the old cluster's address answers PostgreSQL %s, want %d", v, nw.Major)
	}
	ids := pgtest.Query(t, shop, "SELECT string_agg(id::text, ',') FROM items")
	have := map[string]bool{}
	for _, s := range strings.Split(ids, ",") {
		have[s] = true
	}
	missing := 0
	for _, id := range w.acked {
		if !have[fmt.Sprint(id)] {
			missing++
		}
	}
	if missing > 0 {
		t.Errorf("%d of %d acknowledged writes are missing on the new cluster", missing, len(w.acked))
	}
	if n := pgtest.Query(t, pg, "SELECT count(*) FROM pg_subscription"); n != "0" {
		t.Errorf("%s subscriptions left on the new cluster", n)
	}
	for _, db := range []string{"postgres", "shop", "app"} {
		if n := pgtest.Query(t, inst.ConnString("", db), "SELECT count(*) FROM pg_publication"); n != "0" {
			t.Errorf("%s publications left in database %s of the new cluster", n, db)
		}
	}
	newSums := map[string]string{
		"app":  pgtest.Query(t, app, "SELECT count(*) || ' ' || max(at) || ' ' || (SELECT last_value FROM ticket) FROM events"),
		"shop": pgtest.Query(t, shop, "SELECT last_value FROM items_id_seq"),
	}

	// Roll back: the old cluster, stopped by the hand-over, serves again at
	// its address, read-write. All it holds is on the new cluster, and
	// nothing of the run is left on it.
	if v := pgtest.Query(t, shop, "SHOW default_transaction_read_only"); v != "off" {
		t.Errorf("the new cluster runs with default_transaction_read_only = %s", v)
	}
	rb, err := logical.Rollback(context.Background(), logical.Options{OldDir: oldDir, NewDir: newDir, Old: old, New: nw, User: pgtest.User(t)})
	if err != nil {
		t.Fatalf("rollback: %v (hint: %s)", err, errs.HintOf(err))
	}
	t.Logf("rollback: %s", strings.Join(rb.Did, "; "))
	if v := pgtest.Query(t, pg, "SELECT current_setting('server_version_num')::int / 10000"); v != fmt.Sprint(old.Major) {
		t.Errorf("after the rollback the old cluster's address answers PostgreSQL %s, want %d", v, old.Major)
	}
	if v := pgtest.Query(t, app, "SELECT count(*) || ' ' || max(at) || ' ' || (SELECT last_value FROM ticket) FROM events"); v != newSums["app"] {
		t.Errorf("database app: old cluster %q, new cluster %q", v, newSums["app"])
	}
	if v := pgtest.Query(t, app, "SELECT last_value FROM ticket"); v != "50" {
		t.Errorf("sequence ticket on the old cluster: %s, want 50", v)
	}
	oldIDs := strings.Split(pgtest.Query(t, shop, "SELECT string_agg(id::text, ',') FROM items"), ",")
	lost := 0
	for _, id := range oldIDs {
		if !have[id] {
			lost++
		}
	}
	if lost > 0 {
		t.Errorf("%d of the old cluster's %d rows of shop.items are not on the new cluster", lost, len(oldIDs))
	}
	var oldSeq, newSeq int64
	if _, err := fmt.Sscan(pgtest.Query(t, shop, "SELECT last_value FROM items_id_seq"), &oldSeq); err != nil {
		t.Fatal(err)
	}
	if _, err := fmt.Sscan(newSums["shop"], &newSeq); err != nil || newSeq < oldSeq {
		t.Errorf("items_id_seq on the new cluster %s, below the old cluster's %d", newSums["shop"], oldSeq)
	}
	nothingLeft(t, inst, []string{"postgres", "shop", "app"}, "", false)
	pgtest.Exec(t, shop, "INSERT INTO items(v) VALUES ('after the rollback')")
	// Nor does the rollback's start of the old cluster.
	if extra := newNames(oldFiles, dirNames(t, oldDir)); len(extra) > 0 {
		t.Errorf("the rollback left %v in the old data directory", extra)
	}
}

// dirNames lists the names in dir.
func dirNames(t *testing.T, dir string) []string {
	t.Helper()
	es, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var n []string
	for _, e := range es {
		n = append(n, e.Name())
	}
	return n
}

// newNames returns the names of now that were not in before.
func newNames(before, now []string) []string {
	var n []string
	for _, x := range now {
		if !slices.Contains(before, x) {
			n = append(n, x)
		}
	}
	return n
}

// TestLogicalRefusals: each precondition --logical needs is checked before
// anything is created, with a clear error of a documented kind (exit
// code), on one old cluster restarted with the settings each case needs.
func TestLogicalRefusals(t *testing.T) {
	old, nw := builds(t)
	base := testenv.XFSDir(t)
	oldDir := filepath.Join(base, "old")
	newDir := filepath.Join(base, "new")
	pgtest.InitDB(t, oldDir, pgtest.Server{BinDir: old.BinDir, Env: old.Env})
	dbs := []string{"postgres", "shop"}
	refused := func(t *testing.T, inst *instance.Instance, kind errs.Kind, want string) {
		t.Helper()
		_, err := run(t, logical.Options{OldDir: oldDir, NewDir: newDir, Old: old, New: nw}, nil)
		if err == nil {
			t.Fatal("the run was not refused")
		}
		if errs.KindOf(err) != kind || !strings.Contains(err.Error(), want) {
			t.Errorf("error %v (kind %v), want kind %v and %q", err, errs.KindOf(err), kind, want)
		}
		if errs.HintOf(err) == "" {
			t.Errorf("no hint with %v", err)
		}
		nothingLeft(t, inst, dbs, newDir, false)
	}
	restart := func(inst *instance.Instance, settings map[string]string) *instance.Instance {
		if inst != nil {
			if err := inst.Stop(context.Background(), instance.Fast); err != nil {
				t.Fatal(err)
			}
		}
		return startOld(t, old, oldDir, settings)
	}

	inst := restart(nil, logicalSettings(map[string]string{"wal_level": "replica"}))
	pgtest.Exec(t, inst.ConnString("", "postgres"), "CREATE DATABASE shop")
	pgtest.Exec(t, inst.ConnString("", "shop"), "CREATE TABLE items (id int PRIMARY KEY)")
	t.Run("wal_level", func(t *testing.T) { refused(t, inst, errs.Unsupported, "wal_level = replica") })

	inst = restart(inst, logicalSettings(map[string]string{"max_wal_senders": "1"}))
	t.Run("wal_senders", func(t *testing.T) { refused(t, inst, errs.Unsupported, "free WAL senders") })

	inst = restart(inst, logicalSettings(map[string]string{"max_wal_senders": "2"}))
	t.Run("written_beyond_wal_senders", func(t *testing.T) {
		// Enough WAL senders for the preflight (the clone's and one), but
		// three databases written after R: refused before the window,
		// naming the setting.
		pg := inst.ConnString("", "postgres")
		pgtest.Exec(t, pg, "CREATE DATABASE more", "CREATE TABLE t (id int PRIMARY KEY)")
		defer pgtest.Exec(t, pg, "DROP DATABASE more", "DROP TABLE t")
		more := inst.ConnString("", "more")
		pgtest.Exec(t, more, "CREATE TABLE t (id int PRIMARY KEY)")
		window := false
		_, err := run(t, logical.Options{OldDir: oldDir, NewDir: newDir, Old: old, New: nw}, func(e upgrade.Event) {
			if e.Phase == logical.PhaseSubscribe && !e.Done && e.Message == "" {
				pgtest.Exec(t, pg, "INSERT INTO t VALUES (1)")
				pgtest.Exec(t, more, "INSERT INTO t VALUES (1)")
				pgtest.Exec(t, inst.ConnString("", "shop"), "INSERT INTO items VALUES (1)")
			}
			if e.Phase == logical.PhaseWindow {
				window = true
			}
		})
		if errs.KindOf(err) != errs.Unsupported || err == nil || !strings.Contains(err.Error(), "3 databases of the old cluster were written during the run") ||
			!strings.Contains(errs.HintOf(err), "max_wal_senders") {
			t.Errorf("error %v (hint %q), want 3 written databases and max_wal_senders named", err, errs.HintOf(err))
		}
		if window {
			t.Error("writes were refused before the refusal")
		}
		nothingLeft(t, inst, append(dbs, "more"), newDir, false)
		pgtest.Exec(t, inst.ConnString("", "shop"), "DELETE FROM items")
	})

	inst = restart(inst, logicalSettings(nil))
	pg, shop := inst.ConnString("", "postgres"), inst.ConnString("", "shop")
	t.Run("slots", func(t *testing.T) {
		pgtest.Exec(t, pg, "SELECT pg_create_physical_replication_slot('other_' || g) FROM generate_series(1, 8) g")
		_, err := run(t, logical.Options{OldDir: oldDir, NewDir: newDir, Old: old, New: nw}, nil)
		if errs.KindOf(err) != errs.Unsupported || err == nil || !strings.Contains(err.Error(), "free replication slots") {
			t.Errorf("error %v, want too few replication slots", err)
		}
		pgtest.Exec(t, pg, "SELECT pg_drop_replication_slot('other_' || g) FROM generate_series(1, 8) g")
		nothingLeft(t, inst, dbs, newDir, false)
	})
	t.Run("tablespace", func(t *testing.T) {
		tsDir := filepath.Join(base, "ts")
		if err := pgtest.User(t).MkdirOwned(tsDir, 0o700); err != nil {
			t.Fatal(err)
		}
		pgtest.Exec(t, pg, "CREATE TABLESPACE ts LOCATION '"+tsDir+"'")
		defer pgtest.Exec(t, pg, "DROP TABLESPACE ts")
		refused(t, inst, errs.Unsupported, "tablespaces (ts)")
	})
	t.Run("no_replica_identity", func(t *testing.T) {
		pgtest.Exec(t, shop, "CREATE TABLE log (line text)")
		refused(t, inst, errs.Unsupported, "shop: log")
		pgtest.Exec(t, shop, "ALTER TABLE log REPLICA IDENTITY FULL")
	})
	t.Run("prepared_transaction", func(t *testing.T) {
		pgtest.Exec(t, shop, "BEGIN; INSERT INTO items VALUES (1); PREPARE TRANSACTION 'pending'")
		refused(t, inst, errs.Busy, "pending")
		pgtest.Exec(t, shop, "ROLLBACK PREPARED 'pending'")
	})
	t.Run("long_transaction", func(t *testing.T) {
		ctx := context.Background()
		conn, err := pgx.Connect(ctx, shop)
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close(ctx)
		if _, err := conn.Exec(ctx, "BEGIN"); err != nil {
			t.Fatal(err)
		}
		if _, err := conn.Exec(ctx, "SELECT txid_current()"); err != nil {
			t.Fatal(err)
		}
		testenv.WaitFor(t, "the transaction to be older than 10 ms", func() bool {
			return pgtest.Query(t, pg, "SELECT count(*) FROM pg_stat_activity WHERE backend_xid IS NOT NULL AND xact_start < now() - interval '10 ms'") == "1"
		})
		_, err = run(t, logical.Options{OldDir: oldDir, NewDir: newDir, Old: old, New: nw, MaxXactAge: 10 * time.Millisecond}, nil)
		if errs.KindOf(err) != errs.Busy || err == nil || !strings.Contains(err.Error(), "transactions older than 10ms") ||
			!strings.Contains(err.Error(), fmt.Sprintf("pid %d", conn.PgConn().PID())) {
			t.Errorf("error %v, want a refusal naming the session", err)
		}
		nothingLeft(t, inst, dbs, newDir, false)
		if _, err := conn.Exec(ctx, "ROLLBACK"); err != nil {
			t.Fatal(err)
		}
	})
	t.Run("replication_refused", func(t *testing.T) {
		hba := filepath.Join(oldDir, "pg_hba.conf")
		was, err := os.ReadFile(hba)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(hba, append([]byte("local replication all reject\n"), was...), 0o600); err != nil {
			t.Fatal(err)
		}
		pgtest.Exec(t, pg, "SELECT pg_reload_conf()")
		defer func() {
			if err := os.WriteFile(hba, was, 0o600); err != nil {
				t.Fatal(err)
			}
			pgtest.Exec(t, pg, "SELECT pg_reload_conf()")
		}()
		testenv.WaitFor(t, "the old cluster to load the rejecting pg_hba.conf", func() bool {
			return pgtest.Query(t, pg, "SELECT count(*) FROM pg_hba_file_rules WHERE 'replication' = ANY(database) AND auth_method = 'reject'") != "0"
		})
		refused(t, inst, errs.Permission, "refuses a replication connection")
	})
	t.Run("subscriber", func(t *testing.T) {
		pgtest.Exec(t, shop, "CREATE SUBSCRIPTION upstream CONNECTION 'dbname=nowhere' PUBLICATION p WITH (connect = false)")
		refused(t, inst, errs.Unsupported, "is a subscriber")
		pgtest.Exec(t, shop, "ALTER SUBSCRIPTION upstream SET (slot_name = NONE)", "DROP SUBSCRIPTION upstream")
	})
	t.Run("leftover", func(t *testing.T) {
		pgtest.Exec(t, shop, "CREATE PUBLICATION pgfork_upgrade FOR ALL TABLES")
		_, err := run(t, logical.Options{OldDir: oldDir, NewDir: newDir, Old: old, New: nw}, nil)
		if errs.KindOf(err) != errs.Exists || err == nil || !strings.Contains(err.Error(), "publication pgfork_upgrade in database shop") {
			t.Errorf("error %v, want a leftover publication named", err)
		}
		pgtest.Exec(t, shop, "DROP PUBLICATION pgfork_upgrade")
	})
	t.Run("another_run", func(t *testing.T) {
		// A state file of a run that is alive (this test process).
		st := newDir + ".pgfork-logical.json"
		raw := fmt.Sprintf(`{"pid": %d, "pid_start": %d, "old_dir": %q}`, os.Getpid(), proc.StartTime(os.Getpid()), oldDir)
		if err := os.WriteFile(st, []byte(raw), 0o600); err != nil {
			t.Fatal(err)
		}
		defer os.Remove(st)
		refused(t, inst, errs.Busy, fmt.Sprintf("another upgrade of this cluster runs (pid %d)", os.Getpid()))
		if _, err := os.Stat(st); err != nil {
			t.Errorf("the other run's state file was removed: %v", err)
		}
	})
	t.Run("new_exists", func(t *testing.T) {
		if err := os.Mkdir(newDir, 0o755); err != nil {
			t.Fatal(err)
		}
		defer os.Remove(newDir)
		_, err := run(t, logical.Options{OldDir: oldDir, NewDir: newDir, Old: old, New: nw}, nil)
		if errs.KindOf(err) != errs.Exists {
			t.Errorf("error %v, want Exists", err)
		}
	})
}

// TestLogicalRollsBack: what logical replication does not carry, written on
// the old cluster after R, stops the run before or inside the window, and
// so do a window past its deadline and an interrupt: each time the old
// cluster serves writes again and nothing of the run is left on it (one
// old cluster for all, which each rollback leaves as it was).
func TestLogicalRollsBack(t *testing.T) {
	old, nw := builds(t)
	base := testenv.XFSDir(t)
	oldDir := filepath.Join(base, "old")
	newDir := filepath.Join(base, "new")
	pgtest.InitDB(t, oldDir, pgtest.Server{BinDir: old.BinDir, Env: old.Env})
	inst := startOld(t, old, oldDir, logicalSettings(nil))
	pgtest.Exec(t, inst.ConnString("", "postgres"), "CREATE DATABASE shop")
	shop := inst.ConnString("", "shop")
	pgtest.Exec(t, shop, "CREATE TABLE items (id bigserial PRIMARY KEY, v text)", "INSERT INTO items(v) VALUES ('before')")
	dbs := []string{"postgres", "shop"}

	// rollsBack runs the upgrade, runs sql on the old cluster when phase
	// at starts (after R), cancels the run when cancelAt starts, and checks
	// the error and the rollback.
	rollsBack := func(t *testing.T, o logical.Options, at string, sql []string, cancelAt string, kind errs.Kind, want string) {
		t.Helper()
		o.OldDir, o.NewDir, o.Old, o.New = oldDir, newDir, old, nw
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		window := false
		o.User, o.Jobs = pgtest.User(t), 2
		t0 := time.Now()
		o.OnEvent = func(e upgrade.Event) {
			if e.Done && e.Step == "" {
				t.Logf("%s done at %s", e.Phase, time.Since(t0).Round(time.Millisecond))
			}
			if e.Message != "" {
				t.Logf("%s: %s", e.Phase, e.Message)
			}
			if e.Phase == logical.PhaseSubscribe && !e.Done && e.Message == "" {
				// Written after R: shop is subscribed from the start (only
				// the databases written after R are), and its apply worker
				// meets what sql does below.
				pgtest.Exec(t, shop, "INSERT INTO items(v) VALUES ('after R')")
			}
			if e.Phase == at && !e.Done && e.Message == "" && len(sql) > 0 {
				pgtest.Exec(t, shop, sql...)
			}
			if e.Phase == logical.PhaseWindow && !e.Done {
				window = true
			}
			if e.Phase == cancelAt && !e.Done {
				cancel()
			}
		}
		_, err := logical.Run(ctx, o)
		if err == nil {
			t.Fatal("the run succeeded")
		}
		t.Logf("error: %v (hint: %s)", err, errs.HintOf(err))
		if errs.KindOf(err) != kind || !strings.Contains(err.Error(), want) {
			t.Errorf("error %v (kind %v), want kind %v and %q", err, errs.KindOf(err), kind, want)
		}
		if window && kind != errs.Busy && at != logical.PhaseWindow {
			t.Error("writes were refused on the old cluster before the failure was found")
		}
		nothingLeft(t, inst, dbs, newDir, false)
		pgtest.Exec(t, shop, "INSERT INTO items(v) VALUES ('after the rollback')")
	}
	t.Run("ddl_stops_apply", func(t *testing.T) {
		// After the subscriptions were compared with the old catalogs: the
		// apply stops, which must be found before writes are refused, and
		// the message says what the apply worker logged (the missing
		// column), not only that it failed.
		rollsBack(t, logical.Options{}, logical.PhaseCatchUp, []string{"ALTER TABLE items ADD COLUMN extra int", "INSERT INTO items(v, extra) VALUES ('x', 1)"},
			"", errs.Unsupported, `database "shop" of the new cluster stopped: its apply worker failed with: logical replication target relation "public.items" is missing replicated column: "extra"`)
		pgtest.Exec(t, shop, "ALTER TABLE items DROP COLUMN extra")
	})
	t.Run("persistent_apply_error", func(t *testing.T) {
		// Not a schema mismatch, but an error the apply worker meets again
		// at each restart (the old cluster's WAL sender cannot decode
		// without its publication) while its slot stays where it is: it
		// fails the run, with the error's text, after a few restarts
		// rather than at the catch-up's deadline.
		rollsBack(t, logical.Options{}, logical.PhaseCatchUp, []string{"DROP PUBLICATION pgfork_upgrade", "INSERT INTO items(v) VALUES ('x')"},
			"", errs.Busy, `publication "pgfork_upgrade" does not exist`)
	})
	t.Run("table_after_r", func(t *testing.T) {
		rollsBack(t, logical.Options{}, logical.PhaseSubscribe, []string{"CREATE TABLE late (id int PRIMARY KEY)"}, "", errs.Unsupported, "catalog or the large objects of database shop")
		pgtest.Exec(t, shop, "DROP TABLE late")
	})
	t.Run("large_object_after_catch_up", func(t *testing.T) {
		// After the catch-up found both sides equal, before writes are
		// refused: only the window's own read (the same statement that
		// found the table above) finds it.
		rollsBack(t, logical.Options{}, logical.PhaseWindow, []string{"SELECT lo_from_bytea(0, 'blob')"}, "", errs.Unsupported, "catalog or the large objects of database shop")
		pgtest.Exec(t, shop, "SELECT lo_unlink(oid) FROM pg_largeobject_metadata")
	})
	t.Run("window_deadline", func(t *testing.T) {
		rollsBack(t, logical.Options{Window: time.Nanosecond}, "", nil, "", errs.Busy, "writes were given back")
	})
	t.Run("interrupt", func(t *testing.T) {
		rollsBack(t, logical.Options{}, "", nil, logical.PhaseCatchUp, errs.Interrupted, "the old cluster serves")
	})
	// Last, on the same clusters: the run without the hand-over (what
	// --logical does without --stop-old) succeeds, and leaves the old
	// cluster running read-only with nothing of the run on it, the new one
	// on its private socket with the rows written after R and no
	// subscription; --rollback then gives writes back to the old cluster.
	//
	// As the catch-up begins, the old cluster ends the run's WAL senders:
	// every apply worker fails once ("could not receive data from WAL
	// stream", counted in pg_stat_subscription_stats) and restarts by
	// itself; that transient error must not fail the run.
	t.Run("without_handover", func(t *testing.T) {
		o := logical.Options{OldDir: oldDir, NewDir: newDir, Old: old, New: nw}
		res, err := run(t, o, func(e upgrade.Event) {
			if e.Phase == logical.PhaseSubscribe && !e.Done && e.Message == "" {
				pgtest.Exec(t, shop, "INSERT INTO items(v) VALUES ('after R')")
			}
			if e.Phase == logical.PhaseCatchUp && !e.Done && e.Message == "" {
				// Only shop was written after R: one subscription.
				lostWALSenders(t, inst, newDir, 1)
				pgtest.Exec(t, shop, "INSERT INTO items(v) VALUES ('after the lost connections')")
			}
		})
		if err != nil {
			t.Fatalf("the run without the hand-over: %v (hint: %s)", err, errs.HintOf(err))
		}
		if res.HandedOver {
			t.Fatal("the run says it handed over without being asked to")
		}
		nothingLeft(t, inst, dbs, "", true)
		want := pgtest.Query(t, shop, "SELECT count(*) || ' ' || max(id) FROM items")
		newInst, err := instance.Attach(newDir)
		if err != nil || newInst.Port != res.Port || newInst.SocketDir != res.SocketDir {
			t.Fatalf("the new cluster is not where the run says (port %d, socket %s): %+v, %v", res.Port, res.SocketDir, newInst, err)
		}
		newShop := newInst.ConnString("", "shop")
		if got := pgtest.Query(t, newShop, "SELECT count(*) || ' ' || max(id) FROM items"); got != want {
			t.Errorf("shop.items on the new cluster: %q, on the old: %q", got, want)
		}
		if n := pgtest.Query(t, newShop, "SELECT count(*) FROM pg_subscription"); n != "0" {
			t.Errorf("%s subscriptions left on the new cluster", n)
		}
		if _, err := logical.Rollback(context.Background(), logical.Options{OldDir: oldDir, NewDir: newDir, Old: old, New: nw, User: pgtest.User(t)}); err != nil {
			t.Fatalf("--rollback after the run without the hand-over: %v", err)
		}
		pgtest.Exec(t, shop, "INSERT INTO items(v) VALUES ('after the rollback')")
	})
}

// lostWALSenders waits until the run's n apply workers stream from the
// old cluster (inst), ends their WAL senders there, and waits until the
// new cluster (running on newDir) counts an apply error for each: the
// transient failure of a lost connection.
func lostWALSenders(t *testing.T, inst *instance.Instance, newDir string, n int) {
	t.Helper()
	pg := inst.ConnString("", "postgres")
	active := `SELECT count(*) FROM pg_replication_slots WHERE slot_name LIKE 'pgfork\_upgrade\_%' AND active_pid IS NOT NULL`
	testenv.WaitFor(t, "the run's WAL senders", func() bool { return pgtest.Query(t, pg, active) == fmt.Sprint(n) })
	newInst, err := instance.Attach(newDir)
	if err != nil {
		t.Fatal(err)
	}
	newInst.Release()
	newPG := newInst.ConnString("", "postgres")
	counts := func() map[string]int {
		c := map[string]int{}
		for _, kv := range strings.Split(pgtest.Query(t, newPG, "SELECT string_agg(subid || ':' || apply_error_count, ',') FROM pg_stat_subscription_stats"), ",") {
			if k, v, ok := strings.Cut(kv, ":"); ok {
				x, err := strconv.Atoi(v)
				if err != nil {
					t.Fatalf("apply_error_count %q: %v", v, err)
				}
				c[k] = x
			}
		}
		return c
	}
	before := counts()
	pgtest.Exec(t, pg, `SELECT pg_terminate_backend(active_pid) FROM pg_replication_slots WHERE slot_name LIKE 'pgfork\_upgrade\_%' AND active_pid IS NOT NULL`)
	testenv.WaitFor(t, "an apply error counted for every subscription", func() bool {
		rose := 0
		for k, v := range counts() {
			if v > before[k] {
				rose++
			}
		}
		return rose == n
	})
}

// killChildEnv, set in a process started from this test binary, makes
// TestLogicalKilled run one upgrade and kill itself (SIGKILL) at a known
// point: once writes are refused on the old cluster ("window"), or with
// the hand-over once its clean-up begins ("cleanup").
const killChildEnv = "PGFORK_LOGICAL_KILL_CHILD"

// killChild is what the parent test tells the child.
type killChild struct {
	OldDir, NewDir, Shop, At string
}

// replSlots lists the run's slots in a stopped cluster's pg_replslot.
func replSlots(t *testing.T, dataDir string) []string {
	t.Helper()
	es, err := os.ReadDir(filepath.Join(dataDir, "pg_replslot"))
	if err != nil {
		t.Fatal(err)
	}
	var n []string
	for _, e := range es {
		if strings.HasPrefix(e.Name(), "pgfork_upgrade") {
			n = append(n, e.Name())
		}
	}
	return n
}

// TestLogicalKilled: pgfork killed (SIGKILL) inside the window leaves the
// old cluster read-only with the run's slots and publications; the next
// run on the same NEW_DATADIR gives writes back, drops them, stops the
// servers the killed run left, removes its clone and NEW_DATADIR, says so,
// and upgrades with the hand-over. Killed again between the hand-over and
// its clean-up (the new cluster serves at the old address; the stopped old
// cluster still carries the slots and publications), the next run finishes
// the clean-up (a private start of the old cluster) and says the upgrade
// was done; the rollback then finds nothing of the run on the old cluster.
func TestLogicalKilled(t *testing.T) {
	old, nw := builds(t)
	if raw := os.Getenv(killChildEnv); raw != "" {
		var k killChild
		if err := json.Unmarshal([]byte(raw), &k); err != nil {
			t.Fatal(err)
		}
		_, err := run(t, logical.Options{OldDir: k.OldDir, NewDir: k.NewDir, Old: old, New: nw, HandOver: k.At == "cleanup"}, func(e upgrade.Event) {
			switch {
			case k.At == "window" && e.Phase == logical.PhaseWindow && strings.Contains(e.Message, "writes refused"),
				k.At == "cleanup" && e.Phase == logical.PhaseCleanup && !e.Done:
				_ = syscall.Kill(os.Getpid(), syscall.SIGKILL)
			case k.At == "cleanup" && e.Phase == logical.PhaseSubscribe && !e.Done && e.Message == "":
				pgtest.Exec(t, k.Shop, "INSERT INTO items(v) SELECT 'after R' FROM generate_series(1, 10)")
			}
		})
		t.Fatalf("the child was not killed: %v", err)
	}
	base := testenv.XFSDir(t)
	oldDir := filepath.Join(base, "old")
	newDir := filepath.Join(base, "new")
	pgtest.InitDB(t, oldDir, pgtest.Server{BinDir: old.BinDir, Env: old.Env})
	inst := startOld(t, old, oldDir, logicalSettings(nil))
	t.Cleanup(func() {
		for _, d := range []string{newDir, oldDir} {
			if in, err := instance.Attach(d); err == nil {
				_ = in.Stop(context.Background(), instance.Fast)
			}
		}
	})
	pg := inst.ConnString("", "postgres")
	pgtest.Exec(t, pg, "CREATE DATABASE shop")
	shop := inst.ConnString("", "shop")
	pgtest.Exec(t, shop, "CREATE TABLE items (id bigserial PRIMARY KEY, v text)", "INSERT INTO items(v) VALUES ('before')")
	dbs := []string{"postgres", "shop"}
	opts, err := os.ReadFile(filepath.Join(oldDir, "postmaster.opts"))
	if err != nil {
		t.Fatal(err)
	}
	child := func(at string) string {
		t.Helper()
		raw, err := json.Marshal(killChild{OldDir: oldDir, NewDir: newDir, Shop: shop, At: at})
		if err != nil {
			t.Fatal(err)
		}
		cmd := exec.Command(os.Args[0], "-test.run=^TestLogicalKilled$", "-test.v")
		cmd.Env = append(os.Environ(), killChildEnv+"="+string(raw))
		out, err := cmd.CombinedOutput()
		var ee *exec.ExitError
		if !errors.As(err, &ee) || ee.Sys().(syscall.WaitStatus).Signal() != syscall.SIGKILL {
			t.Fatalf("the child was not killed (%v):\n%s", err, out)
		}
		return string(out)
	}

	child("window")
	if v := pgtest.Query(t, shop, "SHOW default_transaction_read_only"); v != "on" {
		t.Fatalf("the old cluster is not read-only after the kill in the window (%s): the test proves nothing", v)
	}
	if n := pgtest.Query(t, shop, "SELECT count(*) FROM pg_replication_slots"); n == "0" {
		t.Fatal("no slots after the kill: the test proves nothing")
	}

	// The next run cleans up, upgrades, hands over, and is killed as its
	// clean-up begins.
	out := child("cleanup")
	for _, want := range []string{"stopped the server left on " + newDir, "gave writes back", "dropped its slots and publications in 2 databases", "removed " + newDir} {
		if !strings.Contains(out, want) {
			t.Errorf("the clean-up after the kill in the window does not say %q:\n%s", want, out)
		}
	}
	if v := pgtest.Query(t, pg, "SELECT current_setting('server_version_num')::int / 10000"); v != fmt.Sprint(nw.Major) {
		t.Fatalf("after the kill in the clean-up the old address answers PostgreSQL %s, want %d (the hand-over was done)", v, nw.Major)
	}
	if s := replSlots(t, oldDir); len(s) != 2 {
		t.Fatalf("the stopped old cluster carries slots %v after the kill in the clean-up, want 2: the test proves nothing", s)
	}
	if _, err := os.Stat(newDir + ".pgfork-logical.json"); err != nil {
		t.Fatalf("no state file after the kill in the clean-up: %v", err)
	}

	// The next run finishes the clean-up and says the upgrade was done.
	_, err = run(t, logical.Options{OldDir: oldDir, NewDir: newDir, Old: old, New: nw, HandOver: true}, nil)
	if errs.KindOf(err) != errs.Exists || err == nil || !strings.Contains(err.Error(), "the clean-up is done now") {
		t.Fatalf("the run after the kill in the clean-up: %v, want Exists saying the clean-up is done", err)
	}
	t.Logf("the run after the kill in the clean-up: %v", err)
	if s := replSlots(t, oldDir); len(s) != 0 {
		t.Errorf("the old cluster still carries slots %v", s)
	}
	if _, running, _ := pgdata.Running(oldDir); running {
		t.Error("the old cluster's private server was left running")
	}
	if b, err := os.ReadFile(filepath.Join(oldDir, "postmaster.opts")); err != nil || string(b) != string(opts) {
		t.Errorf("the old cluster's postmaster.opts is %q (%v), want it as it ran: %q", b, err, opts)
	}
	if n := pgtest.Query(t, shop, "SELECT count(*) FROM pg_subscription"); n != "0" {
		t.Errorf("%s subscriptions left on the new cluster", n)
	}
	q := "SELECT count(*) || ' ' || max(id) || ' ' || (SELECT last_value FROM items_id_seq) FROM items"
	onNew := pgtest.Query(t, shop, q)
	if !strings.HasPrefix(onNew, "11 ") {
		t.Errorf("shop.items on the new cluster: %q, want 11 rows", onNew)
	}

	// The rollback starts the old cluster at its address as it ran: no
	// slot or publication of the run on it, writes allowed, every row.
	rb, err := logical.Rollback(context.Background(), logical.Options{OldDir: oldDir, NewDir: newDir, Old: old, New: nw, User: pgtest.User(t)})
	if err != nil {
		t.Fatalf("rollback: %v (hint: %s)", err, errs.HintOf(err))
	}
	t.Logf("rollback: %s", strings.Join(rb.Did, "; "))
	if v := pgtest.Query(t, pg, "SELECT current_setting('server_version_num')::int / 10000"); v != fmt.Sprint(old.Major) {
		t.Errorf("after the rollback the old address answers PostgreSQL %s, want %d", v, old.Major)
	}
	if a := pgtest.Query(t, shop, q); a != onNew {
		t.Errorf("shop.items: old cluster %q, new cluster %q", a, onNew)
	}
	nothingLeft(t, inst, dbs, "", false)
	if m, _ := filepath.Glob(filepath.Join(base, ".old.pgfork-logical-*")); len(m) > 0 {
		t.Errorf("the clone was left: %v", m)
	}
	if m, _ := filepath.Glob(newDir + ".pgfork-logical*"); len(m) > 0 {
		t.Errorf("the state file was left: %v", m)
	}
}

// TestLogicalSubscribesWriters: at R every database gets a slot, but only
// the databases written after R get a subscription (an apply worker on the
// new cluster, a WAL sender on the old one), as the old cluster's WAL
// proves. Six databases: two written by writers all along, one written
// only as the window begins (after the catch-up's last scan: the window's
// final scan must find it, subscribe it and carry its rows), one whose
// sequence moves after R without WAL (its value was logged ahead before
// R: the new cluster's is no lower), and two untouched. Every acknowledged
// write is on the new cluster, and nothing of the run (subscriptions,
// slots, publications, the scan's extension) is left on either side.
func TestLogicalSubscribesWriters(t *testing.T) {
	old, nw := builds(t)
	base := testenv.XFSDir(t)
	oldDir := filepath.Join(base, "old")
	pgtest.InitDB(t, oldDir, pgtest.Server{BinDir: old.BinDir, Env: old.Env})
	// No autovacuum and no timed checkpoint: a database nobody writes
	// writes nothing by itself (and the sequence below moves without WAL).
	inst := startOld(t, old, oldDir, logicalSettings(map[string]string{"autovacuum": "off", "checkpoint_timeout": "1h"}))
	dbs := []string{"postgres", "w1", "w2", "late", "quiet1", "quiet2"}
	url := map[string]string{}
	for _, db := range dbs {
		url[db] = inst.ConnString("", db)
		if db != "postgres" {
			pgtest.Exec(t, url["postgres"], "CREATE DATABASE "+db)
		}
		pgtest.Exec(t, url[db], "CREATE TABLE items (id bigserial PRIMARY KEY, v text)", "INSERT INTO items(v) SELECT 'before' FROM generate_series(1, 100)")
	}
	pgtest.Exec(t, url["quiet2"], "CREATE SEQUENCE s", "SELECT nextval('s')")
	writers := []*writer{startWriter(url["w1"]), startWriter(url["w2"])}
	stopWriters := func() {
		for _, w := range writers {
			select {
			case <-w.stop:
			default:
				close(w.stop)
			}
			<-w.done
		}
	}
	defer stopWriters()
	for _, w := range writers {
		testenv.WaitFor(t, "the writers' first commits", func() bool { return w.count() > 10 })
	}

	newDir := filepath.Join(base, "new")
	t.Cleanup(func() {
		if in, err := instance.Attach(newDir); err == nil {
			_ = in.Stop(context.Background(), instance.Fast)
		}
	})
	var subscribed, oldSeq string
	res, err := run(t, logical.Options{OldDir: oldDir, NewDir: newDir, Old: old, New: nw, HandOver: true}, func(e upgrade.Event) {
		switch {
		case e.Phase == logical.PhaseSlots && !e.Done && e.Message == "":
			// After the clone's checkpoint, before R: WAL-logged, the
			// value logged ahead.
			pgtest.Exec(t, url["quiet2"], "SELECT nextval('s')")
		case e.Phase == logical.PhaseSubscribe && !e.Done && e.Message == "":
			// After R: no WAL (the value was logged ahead).
			pgtest.Exec(t, url["quiet2"], "SELECT nextval('s') FROM generate_series(1, 5)")
		case e.Phase == logical.PhaseWindow && !e.Done && e.Message == "":
			// After the catch-up's last scan, before writes are refused.
			pgtest.Exec(t, url["late"], "INSERT INTO items(v) SELECT 'late' FROM generate_series(1, 3)")
			oldSeq = pgtest.Query(t, url["quiet2"], "SELECT last_value FROM s")
		case e.Phase == logical.PhaseCleanup && !e.Done:
			// The new cluster serves at the old address; its disabled
			// subscriptions are dropped next (pg_subscription is shared).
			subscribed = pgtest.Query(t, url["postgres"], `SELECT coalesce(string_agg(d.datname, ',' ORDER BY d.datname), '')
				FROM pg_subscription s JOIN pg_database d ON d.oid = s.subdbid`)
		}
	})
	if err != nil {
		t.Fatalf("upgrade --logical: %v (hint: %s)", err, errs.HintOf(err))
	}
	t.Logf("window %s, phases %v; subscribed %v, in the window %v", res.Window, res.Phases, res.Subscribed, res.SubscribedInWindow)
	if subscribed != "late,w1,w2" {
		t.Errorf("subscriptions on the new cluster: %q, want only the written databases: late,w1,w2", subscribed)
	}
	if !res.WALScan || !slices.Equal(res.SubscribedInWindow, []string{"late"}) {
		t.Errorf("WAL scan %v, subscribed in the window %v; want the scan, and late", res.WALScan, res.SubscribedInWindow)
	}
	for _, w := range writers {
		before := w.count()
		testenv.WaitFor(t, "writes acknowledged by the new cluster at the old one's address", func() bool { return w.count() > before+10 })
	}
	stopWriters()
	if v := pgtest.Query(t, url["postgres"], "SELECT current_setting('server_version_num')::int / 10000"); v != fmt.Sprint(nw.Major) {
		t.Fatalf("the old cluster's address answers PostgreSQL %s, want %d", v, nw.Major)
	}
	for i, db := range []string{"w1", "w2"} {
		have := map[string]bool{}
		for _, s := range strings.Split(pgtest.Query(t, url[db], "SELECT string_agg(id::text, ',') FROM items"), ",") {
			have[s] = true
		}
		missing := 0
		for _, id := range writers[i].acked {
			if !have[fmt.Sprint(id)] {
				missing++
			}
		}
		if missing > 0 {
			t.Errorf("%d of %d acknowledged writes to %s are missing on the new cluster", missing, len(writers[i].acked), db)
		}
	}
	if n := pgtest.Query(t, url["late"], "SELECT count(*) FROM items WHERE v = 'late'"); n != "3" {
		t.Errorf("late.items on the new cluster has %s of the 3 rows written as the window began", n)
	}
	var o, n int64
	if _, err := fmt.Sscan(oldSeq, &o); err != nil {
		t.Fatalf("quiet2.s on the old cluster: %q", oldSeq)
	}
	if _, err := fmt.Sscan(pgtest.Query(t, url["quiet2"], "SELECT nextval('s')"), &n); err != nil || n <= o {
		t.Errorf("quiet2.s on the new cluster gives %d (%v), not above the old cluster's last value %d", n, err, o)
	}
	for _, db := range dbs {
		if n := pgtest.Query(t, url[db], "SELECT count(*) FROM pg_publication"); n != "0" {
			t.Errorf("%s publications left in database %s of the new cluster", n, db)
		}
	}
	if n := pgtest.Query(t, url["postgres"], "SELECT count(*) FROM pg_subscription"); n != "0" {
		t.Errorf("%s subscriptions left on the new cluster", n)
	}
	// Back to the old cluster: nothing of the run on it, the scan's
	// extension included.
	if _, err := logical.Rollback(context.Background(), logical.Options{OldDir: oldDir, NewDir: newDir, Old: old, New: nw, User: pgtest.User(t)}); err != nil {
		t.Fatalf("rollback: %v (hint: %s)", err, errs.HintOf(err))
	}
	nothingLeft(t, inst, dbs, "", false)
	for _, db := range append(dbs, "template1") {
		if n := pgtest.Query(t, inst.ConnString("", db), "SELECT count(*) FROM pg_extension WHERE extname = 'pg_walinspect'"); n != "0" {
			t.Errorf("pg_walinspect left in database %s of the old cluster", n)
		}
	}
}
