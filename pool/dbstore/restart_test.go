package dbstore_test

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgfork/pgfork/instance"
	"github.com/pgfork/pgfork/internal/pgtest"
	"github.com/pgfork/pgfork/internal/testenv"
	"github.com/pgfork/pgfork/pool"
	"github.com/pgfork/pgfork/pool/dbstore"
)

// leavingCreator is a dbstore.SQLCreator whose drops do nothing once
// leave is set: what serve's shutdown does with the copies it has no time
// left to drop ("left for the next start to drop"); else each takes at
// least dropCost.
type leavingCreator struct {
	*dbstore.SQLCreator
	leave atomic.Bool
}

// dropCost is what a DROP DATABASE takes on a disk that syncs (60-100 ms,
// mostly the checkpoint it forces; docs/server.md): the test servers run
// without fsync, where it takes a few milliseconds, and a restart's drops
// would be over before the first clients come.
const dropCost = 100 * time.Millisecond

// Drop drops name, unless the copies are to be left.
func (c *leavingCreator) Drop(ctx context.Context, name string) error {
	if c.leave.Load() {
		return nil
	}
	start := time.Now()
	err := c.SQLCreator.Drop(ctx, name)
	select {
	case <-time.After(dropCost - time.Since(start)):
	case <-ctx.Done():
	}
	return err
}

// TestRestartHandsOutOnlyLiveFreshCopies (issue 58): a restart on a
// server full of a previous run's copies — used ones its stop had no time
// to drop, fresh ones it left ready (more than the new pool adopts, so the
// rest are dropped in the background) and a kept one — hands out, while
// those drops run, only databases that exist and are fresh copies of the
// template (its marker, none of a test's writes), however fast the
// clients take them; the kept one stays. Drops take what they take on a
// disk that syncs (dropCost). On the oldest and the newest build.
//
// It failed before the fix: the copies left ready beyond what the new
// pool adopted were dropped by name while the pool made new copies under
// their ids, and clients got `database "rs_test_h58_003" does not exist`.
func TestRestartHandsOutOnlyLiveFreshCopies(t *testing.T) {
	builds := pgtest.Builds(t, 0)
	if len(builds) > 2 {
		builds = []pgtest.Build{builds[0], builds[len(builds)-1]}
	}
	for _, b := range builds {
		t.Run(b.Name(), func(t *testing.T) { handOutAfterRestart(t, b) })
	}
}

// handOutAfterRestart is TestRestartHandsOutOnlyLiveFreshCopies on build b.
func handOutAfterRestart(t *testing.T, b pgtest.Build) {
	ctx := context.Background()
	inst := pgtest.New(t, b.Server())
	const (
		prefix = "rs"
		hash   = "h58"
		made   = 40 // the first run's pool
		used   = 12 // of them handed out and written to, left by the stop
		init2  = 2  // the restarted pool's Initial (it adopts that many)
		max2   = 8  // and Max: hand-outs beyond init2 make copies under new ids
	)
	check, err := pgxpool.New(ctx, inst.ConnString("postgres", "postgres"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(check.Close)
	open := func(cfg pool.ManagerConfig) (*pool.Manager, *leavingCreator) {
		t.Helper()
		admin, err := dbstore.OpenAdmin(ctx, inst.ConnString("postgres", "postgres"), 8)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(admin.Close)
		cr := &leavingCreator{SQLCreator: &dbstore.SQLCreator{Admin: admin, Strategy: dbstore.StrategyAuto}}
		if err := cr.Probe(ctx); err != nil {
			t.Fatal(err)
		}
		m, err := pool.NewManager(cfg, dbstore.New(admin, cr))
		if err != nil {
			t.Fatal(err)
		}
		if err := m.Open(ctx); err != nil {
			t.Fatal(err)
		}
		return m, cr
	}
	cfg := pool.ManagerConfig{Prefix: prefix, Owner: "postgres", Initial: made, Max: made, Parallel: 4,
		GetTimeout: 2 * time.Minute, IdleTimeout: -1}
	m, cr := open(cfg)
	tpl, err := m.InitializeTemplate(ctx, hash)
	if err != nil {
		t.Fatal(err)
	}
	pgtest.Exec(t, inst.ConnString("postgres", tpl.Database),
		"CREATE TABLE marker (v text)", "INSERT INTO marker VALUES ('template')", "CREATE TABLE writes (n int)")
	if err := m.FinalizeTemplate(ctx, hash); err != nil {
		t.Fatal(err)
	}
	testenv.WaitFor(t, "the first pool to fill", func() bool { return readyOf(m) == made })
	var keptName string
	for i := range used {
		db, err := m.GetTestDatabase(ctx, hash)
		if err != nil {
			t.Fatal(err)
		}
		pgtest.Exec(t, inst.ConnString("postgres", db.Name), "INSERT INTO writes VALUES (1)")
		if i == 0 {
			if err := m.Keep(ctx, hash, db.ID); err != nil {
				t.Fatal(err)
			}
			keptName = db.Name
		}
	}
	cr.leave.Store(true)
	if err := m.Close(ctx); err != nil {
		t.Fatal(err)
	}
	type copyOf struct {
		OID  uint32
		Name string
	}
	rows, err := check.Query(ctx, "SELECT oid, datname FROM pg_database WHERE starts_with(datname, $1)", prefix+"_test_")
	if err != nil {
		t.Fatal(err)
	}
	before, err := pgx.CollectRows(rows, pgx.RowToStructByPos[copyOf])
	if err != nil || len(before) < made {
		t.Fatalf("the first run left %d copies (%v), want at least %d", len(before), err, made)
	}
	oids, names := make([]uint32, len(before)), make([]string, len(before))
	for i, c := range before {
		oids[i], names[i] = c.OID, c.Name
	}

	// The restart: a pool smaller than what was left ready. Rounds of
	// clients take every copy the pool holds as fast as it hands them out
	// (a copy waits for its connection a moment, as while a test's fixture
	// sets up), then each connects to its copy, checks it, writes to it
	// and gives it back, until no copy of the first run is left under its
	// name.
	cfg.Initial, cfg.Max = init2, max2
	m, _ = open(cfg)
	defer func() { _ = m.Close(ctx) }()
	leftOfFirstRun := func() int {
		t.Helper()
		var n int
		if err := check.QueryRow(ctx, `SELECT count(*) FROM unnest($1::oid[], $2::text[]) AS b(oid, name)
			JOIN pg_database d ON d.oid = b.oid AND d.datname = b.name WHERE b.name <> $3`, oids, names, keptName).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	deadline := time.Now().Add(3 * time.Minute)
	for round := 0; ; round++ {
		dbs := make([]pool.TestDatabase, max2)
		errc := make(chan error, max2)
		for i := range dbs {
			go func() {
				var err error
				dbs[i], err = m.GetTestDatabase(ctx, hash)
				errc <- err
			}()
		}
		for range dbs {
			if err := <-errc; err != nil {
				t.Fatalf("round %d: hand-out: %v", round, err)
			}
		}
		for _, db := range dbs {
			if err := useFresh(ctx, inst, db.Name); err != nil {
				t.Errorf("round %d: %s, handed out: %v", round, db.Name, err)
			}
			if err := m.Recreate(ctx, hash, db.ID); err != nil {
				t.Fatalf("round %d: recreate %s: %v", round, db.Name, err)
			}
		}
		if t.Failed() {
			break
		}
		left := leftOfFirstRun()
		if left == 0 && round >= 3 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("after 3 minutes (%d rounds), %d copies of the first run still under their names", round+1, left)
		}
	}
	var writes int
	c, err := pgx.Connect(ctx, inst.ConnString("postgres", keptName))
	if err == nil {
		err = c.QueryRow(ctx, "SELECT count(*) FROM writes").Scan(&writes)
		_ = c.Close(ctx)
	}
	if err != nil || writes != 1 {
		t.Errorf("kept database %s after the restart: %d writes, %v; want it as its test left it", keptName, writes, err)
	}
}

// useFresh connects to database name, checks that it is a fresh copy of
// the template (its marker, no writes) and writes to it, as a test would.
func useFresh(ctx context.Context, inst *instance.Instance, name string) error {
	c, err := pgx.Connect(ctx, inst.ConnString("postgres", name))
	if err != nil {
		return err
	}
	defer func() { _ = c.Close(ctx) }()
	var marker string
	var writes int
	if err := c.QueryRow(ctx, "SELECT (SELECT v FROM marker), (SELECT count(*) FROM writes)").Scan(&marker, &writes); err != nil {
		return err
	}
	if marker != "template" || writes != 0 {
		return fmt.Errorf("not a fresh copy: marker %q, %d writes", marker, writes)
	}
	_, err = c.Exec(ctx, "INSERT INTO writes VALUES (1)")
	return err
}

// readyOf is how many databases m's pools have ready.
func readyOf(m *pool.Manager) int {
	ts, _ := m.Stats()
	n := 0
	for _, x := range ts {
		n += x.Pool.ByState[pool.Ready]
	}
	return n
}
