package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/pgfork/pgfork/instance"
)

// The "js" scenario (issue 21) runs a generated TypeScript-style test suite
// with vitest (4 workers) against one PostgreSQL 18, side by side:
// (a) every test file runs the 40 migrations and the seed into a fresh
// CREATE DATABASE; (b) a template built once, then CREATE DATABASE …
// TEMPLATE + DROP per test (Testcontainers' restoreSnapshot pattern); (d)
// clients/js (pgfork/vitest's db fixture) with pgfork serve on the same
// server (ext4); (e) the same on a PostgreSQL 18 on the XFS reflink mount
// (file_copy_method=clone), when there is one; and (c) PGlite, a fresh
// instance per file with the migrations and seed, each test rolled back;
// and (f) the floor (issue 33): the same tests, each vitest worker reusing
// one database taken once from the same serve (no isolation). (d) and (e)
// run twice on their serve; the second run is measured against the floor.
// Issue 34's zero-setup second run (the glue starting pgfork serve itself)
// is measured when the glue does so.
//
// Scale: PGFORK_BENCH_JS_SEED_MB (default 50) and PGFORK_BENCH_JS_TESTS
// (default 300, in files of 15 tests).
func init() {
	register(Scenario{Name: "js", Issue: "JS/TS client with vitest vs migrations per file and CREATE DATABASE … TEMPLATE per test (issue 21)", Run: runJSBench})
}

const jsBenchFilesPerTest = 15

// jsMigrations generates 40 migrations: 60 tables with indexes and foreign
// keys, and a few functions.
func jsMigrations() map[string]string {
	out := map[string]string{}
	table := 0
	for i := 1; i <= 40; i++ {
		var b strings.Builder
		n := 1
		if i%2 == 0 {
			n = 2
		}
		for k := 0; k < n; k++ {
			table++
			fmt.Fprintf(&b, "CREATE TABLE t%03d (id bigserial PRIMARY KEY, name text NOT NULL, score int NOT NULL DEFAULT 0, created timestamptz NOT NULL DEFAULT now(), data jsonb", table)
			if table > 1 {
				fmt.Fprintf(&b, ", parent bigint REFERENCES t%03d (id)", table-1)
			}
			b.WriteString(");\n")
			fmt.Fprintf(&b, "CREATE INDEX t%03d_name ON t%03d (name);\nCREATE INDEX t%03d_score ON t%03d (score, created);\n", table, table, table, table)
		}
		if i%8 == 0 {
			fmt.Fprintf(&b, "CREATE FUNCTION f%02d(x int) RETURNS int LANGUAGE sql IMMUTABLE AS $$ SELECT x * %d $$;\n", i, i)
		}
		out[fmt.Sprintf("%03d_m.sql", i)] = b.String()
	}
	return out
}

// jsSeed is about mb MB of rows (~210 bytes each, plus an index).
func jsSeed(mb int) string {
	rows := mb * 1_000_000 / 260
	return fmt.Sprintf("INSERT INTO t001 (name, score, data) SELECT 'seed ' || g, g %% 1000, jsonb_build_object('v', repeat(md5(g::text), 5)) FROM generate_series(1, %d) g;\nANALYZE;\n", rows)
}

// The JavaScript shared by the contenders' test files.
const jsBenchCommon = `import { readFileSync, readdirSync, appendFileSync } from "node:fs";
import { join } from "node:path";
import pg from "pg";

export const dir = process.env.PGB_DIR;
export async function migrate(url) {
  const c = new pg.Client({ connectionString: url });
  await c.connect();
  try {
    for (const f of readdirSync(join(dir, "migrations")).sort()) await c.query(readFileSync(join(dir, "migrations", f), "utf8"));
    await c.query(readFileSync(join(dir, "seed.sql"), "utf8"));
  } finally {
    await c.end();
  }
}
export async function seed(url) {
  const c = new pg.Client({ connectionString: url });
  await c.connect();
  try { await c.query(readFileSync(join(dir, "seed.sql"), "utf8")); } finally { await c.end(); }
}
export async function admin(sql) {
  const c = new pg.Client({ connectionString: process.env.PGB_ADMIN_URL });
  await c.connect();
  try { await c.query(sql); } finally { await c.end(); }
}
export function dbUrl(name) {
  const u = new URL(process.env.PGB_ADMIN_URL);
  u.pathname = "/" + name;
  return u.toString();
}
// One test's work: a short transaction.
export async function work(c) {
  await c.query("BEGIN");
  await c.query("INSERT INTO t002 (name, score) VALUES ('test', 1)");
  await c.query("UPDATE t001 SET score = score + 1 WHERE id = 1");
  await c.query("SELECT count(*) FROM t002");
  await c.query("COMMIT");
}
export function record(ms, handOutMs = ms) {
  appendFileSync(process.env.PGB_OUT, ms.toFixed(3) + " " + handOutMs.toFixed(3) + "\n");
}
`

// jsBenchTest returns contender c's test file number i.
func jsBenchTest(c string, i, tests int) string {
	var b strings.Builder
	switch c {
	case "a":
		fmt.Fprintf(&b, `import { afterAll, beforeAll, test } from "vitest";
import pg from "pg";
import { admin, dbUrl, migrate, work } from "./common.mjs";
const name = "jsa_" + process.pid + "_%d";
let c;
beforeAll(async () => {
  await admin("CREATE DATABASE " + name);
  await migrate(dbUrl(name));
  c = new pg.Client({ connectionString: dbUrl(name) });
  await c.connect();
});
afterAll(async () => { await c.end(); await admin("DROP DATABASE " + name); });
`, i)
		for k := 0; k < tests; k++ {
			fmt.Fprintf(&b, "test(\"t%d\", async () => { await work(c); });\n", k)
		}
	case "b":
		fmt.Fprintf(&b, `import { afterEach, beforeEach, test } from "vitest";
import pg from "pg";
import { admin, dbUrl, record, work } from "./common.mjs";
let c, name, n = 0;
beforeEach(async () => {
  const t0 = performance.now();
  name = "jsb_" + process.pid + "_%d_" + n++;
  await admin("CREATE DATABASE " + name + " TEMPLATE jsb_template");
  c = new pg.Client({ connectionString: dbUrl(name) });
  await c.connect();
  record(performance.now() - t0);
});
afterEach(async () => { await c.end(); await admin("DROP DATABASE " + name); });
`, i)
		for k := 0; k < tests; k++ {
			fmt.Fprintf(&b, "test(\"t%d\", async () => { await work(c); });\n", k)
		}
	case "c":
		fmt.Fprintf(&b, `import { afterAll, beforeAll, test } from "vitest";
import { readFileSync, readdirSync } from "node:fs";
import { join } from "node:path";
import { PGlite } from "@electric-sql/pglite";
import { dir, record } from "./common.mjs";
// PGlite as its users run it: a fresh instance per file, migrations and seed
// into it, and each test's transaction rolled back. (file %d)
let db;
beforeAll(async () => {
  db = new PGlite();
  for (const f of readdirSync(join(dir, "migrations")).sort()) await db.exec(readFileSync(join(dir, "migrations", f), "utf8"));
  await db.exec(readFileSync(join(dir, "seed.sql"), "utf8"));
});
afterAll(async () => { await db.close(); });
`, i)
		for k := 0; k < tests; k++ {
			fmt.Fprintf(&b, `test("t%d", async () => {
  await db.exec("BEGIN");
  await db.query("INSERT INTO t002 (name, score) VALUES ('test', 1)");
  await db.query("UPDATE t001 SET score = score + 1 WHERE id = 1");
  await db.query("SELECT count(*) FROM t002");
  await db.exec("ROLLBACK");
});
`, k)
		}
	case "f":
		b.WriteString(`import { test } from "vitest";
import pg from "pg";
import { record, work } from "./common.mjs";
// The floor: each vitest worker reuses one database taken once (no isolation);
// a test connects to it as (d)'s fixture does to its own.
const urls = process.env.PGB_FLOOR_URLS.split(" ");
const url = urls[(Number(process.env.VITEST_POOL_ID ?? "1") - 1) % urls.length];
async function floor(fn) {
  const t0 = performance.now();
  const c = new pg.Client({ connectionString: url });
  await c.connect();
  record(performance.now() - t0);
  try { await fn(c); } finally { await c.end(); }
}
`)
		for k := 0; k < tests; k++ {
			fmt.Fprintf(&b, "test(\"t%d\", async () => { await floor(work); });\n", k)
		}
	default: // d, e: this package
		b.WriteString(`import { test } from "pgfork/vitest";
import { record, work } from "./common.mjs";
`)
		for k := 0; k < tests; k++ {
			fmt.Fprintf(&b, "test(\"t%d\", async ({ db }) => { record(db.acquireMs, db.handOutMs); await work(db.client); });\n", k)
		}
	}
	return b.String()
}

func jsBenchSetup(c string) string {
	switch c {
	case "a", "c", "f":
		return "export default async function () {}\n"
	case "b":
		return `import { admin, dbUrl, migrate } from "./common.mjs";
export default async function () {
  await admin("DROP DATABASE IF EXISTS jsb_template");
  await admin("CREATE DATABASE jsb_template");
  await migrate(dbUrl("jsb_template"));
}
`
	default:
		return `import { pgforkSetup } from "pgfork/vitest-setup";
import { seed } from "./common.mjs";
export default pgforkSetup({ migrations: process.env.PGB_DIR + "/migrations", seed, extraKey: process.env.PGB_KEY });
`
	}
}

// jsBenchProject writes the generated suite into dir, with node_modules
// linking clients/js's dependencies and pgfork itself.
func jsBenchProject(dir, clientsJS string, seedMB, tests int) error {
	write := func(name, content string) error {
		if err := os.MkdirAll(filepath.Dir(filepath.Join(dir, name)), 0o755); err != nil {
			return err
		}
		return os.WriteFile(filepath.Join(dir, name), []byte(content), 0o644)
	}
	for name, sql := range jsMigrations() {
		if err := write("migrations/"+name, sql); err != nil {
			return err
		}
	}
	if err := write("seed.sql", jsSeed(seedMB)); err != nil {
		return err
	}
	files := (tests + jsBenchFilesPerTest - 1) / jsBenchFilesPerTest
	for _, c := range []string{"a", "b", "c", "d", "f"} {
		if err := write(c+"/common.mjs", jsBenchCommon); err != nil {
			return err
		}
		if err := write(c+"/setup.mjs", jsBenchSetup(c)); err != nil {
			return err
		}
		cfg := `import { defineConfig } from "vitest/config";
export default defineConfig({ test: { globalSetup: ["./setup.mjs"], include: ["*.test.mjs"], pool: "forks", maxWorkers: 4, testTimeout: 300000, hookTimeout: 600000 } });
`
		if err := write(c+"/vitest.config.mjs", cfg); err != nil {
			return err
		}
		for i := 0; i < files; i++ {
			n := min(jsBenchFilesPerTest, tests-i*jsBenchFilesPerTest)
			if err := write(fmt.Sprintf("%s/f%02d.test.mjs", c, i), jsBenchTest(c, i, n)); err != nil {
				return err
			}
		}
	}
	nm := filepath.Join(dir, "node_modules")
	if err := os.MkdirAll(nm, 0o755); err != nil {
		return err
	}
	ents, err := os.ReadDir(filepath.Join(clientsJS, "node_modules"))
	if err != nil {
		return err
	}
	for _, e := range ents {
		if err := os.Symlink(filepath.Join(clientsJS, "node_modules", e.Name()), filepath.Join(nm, e.Name())); err != nil {
			return err
		}
	}
	return os.Symlink(clientsJS, filepath.Join(nm, "pgfork"))
}

// benchPG18 starts a PostgreSQL 18 in a new directory under base.
func benchPG18(ctx context.Context, base string) (*instance.Instance, pgServer, func(), error) {
	pgInst, err := findPG(18)
	if err != nil {
		return nil, pgServer{}, nil, err
	}
	user, err := instance.ResolveUser("")
	if err != nil {
		return nil, pgServer{}, nil, err
	}
	dir, err := os.MkdirTemp(base, "pgfork-bench-js-")
	if err != nil {
		return nil, pgServer{}, nil, err
	}
	_ = os.Chmod(dir, 0o755)
	data := filepath.Join(dir, "data")
	if err := instance.InitDB(ctx, instance.InitOptions{BinDir: pgInst.BinDir, Env: pgInst.Env(), DataDir: data, User: user, NoSync: true}); err != nil {
		os.RemoveAll(dir)
		return nil, pgServer{}, nil, err
	}
	srv, err := instance.Start(ctx, instance.Config{BinDir: pgInst.BinDir, Env: pgInst.Env(), DataDir: data, User: user, TCP: true,
		Profile: instance.Test, Settings: map[string]string{"max_connections": "300", "max_wal_size": "4GB"}})
	if err != nil {
		os.RemoveAll(dir)
		return nil, pgServer{}, nil, err
	}
	if err := srv.SetPassword(ctx, "postgres", fmt.Sprintf("bench%x", time.Now().UnixNano())); err != nil {
		_ = srv.Stop(context.Background(), instance.Fast)
		os.RemoveAll(dir)
		return nil, pgServer{}, nil, err
	}
	pg := pgServer{host: srv.Host, port: srv.Port, user: "postgres", password: srv.Password, url: srv.ConnString("postgres", "postgres"), version: pgInst.Version}
	return srv, pg, func() { _ = srv.Stop(context.Background(), instance.Fast); os.RemoveAll(dir) }, nil
}

// jsBenchRun runs contender c's suite with vitest and returns its wall time
// and the per-test acquisition times it recorded.
func jsBenchRun(ctx context.Context, proj, clientsJS, c string, env []string, filter ...string) (time.Duration, Sample, Sample, error) {
	out := filepath.Join(proj, fmt.Sprintf("acquire-%s-%d.txt", c, time.Now().UnixNano()))
	cmd := exec.CommandContext(ctx, filepath.Join(clientsJS, "node_modules", ".bin", "vitest"), append([]string{"run", "--root", filepath.Join(proj, c)}, filter...)...)
	cmd.Env = append(append(os.Environ(), "NO_COLOR=1", "PGB_DIR="+proj, "PGB_OUT="+out), env...)
	took, _, err := runSuite(cmd, "passed")
	if err != nil {
		return 0, nil, nil, fmt.Errorf("vitest (%s): %w", c, err)
	}
	s, h := readTimings(out)
	return took, s, h, nil
}

func runJSBench(ctx context.Context, r *Report) error {
	r.Notef("Load average at start: %s (2 cores shared with other work; times grow with contention).", loadAvg())
	defer func() { r.Notef("Load average at the end: %s.", loadAvg()) }()
	seedMB, tests := 50, 300
	if v, err := strconv.Atoi(os.Getenv("PGFORK_BENCH_JS_SEED_MB")); err == nil && v > 0 {
		seedMB = v
	}
	if v, err := strconv.Atoi(os.Getenv("PGFORK_BENCH_JS_TESTS")); err == nil && v > 0 {
		tests = v
	}
	if seedMB != 50 || tests != 300 {
		r.Notef("SCALED DOWN for this machine: seed %d MB (issue: ≈50 MB), %d tests (issue: 300).", seedMB, tests)
	}
	wd, err := os.Getwd()
	if err != nil {
		return err
	}
	clientsJS := filepath.Join(wd, "clients", "js")
	if _, err := os.Stat(filepath.Join(clientsJS, "node_modules", ".bin", "vitest")); err != nil {
		if out, err := exec.CommandContext(ctx, "npm", "ci", "--ignore-scripts", "--no-audit", "--no-fund", "--prefix", clientsJS).CombinedOutput(); err != nil {
			return fmt.Errorf("npm ci in clients/js: %v: %s", err, out)
		}
	}
	if out, err := exec.CommandContext(ctx, "npm", "run", "--silent", "--prefix", clientsJS, "build").CombinedOutput(); err != nil {
		return fmt.Errorf("building clients/js: %v: %s", err, out)
	}
	tmp, bin, err := clientWorkspace("pgfork-bench-js-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(tmp)
	proj := filepath.Join(tmp, "suite")
	if err := jsBenchProject(proj, clientsJS, seedMB, tests); err != nil {
		return err
	}
	files := (tests + jsBenchFilesPerTest - 1) / jsBenchFilesPerTest
	r.Notef("Suite: 40 generated migrations (60 tables with two indexes each and foreign keys, 5 functions), a seed of ≈%d MB into one table, %d tests in %d files "+
		"(vitest %s, pool forks, 4 workers); each test runs a short transaction (INSERT, UPDATE, SELECT) on its own database. Times are the whole `vitest run`, "+
		"process start to exit. (c) PGlite (@electric-sql/pglite %s, a dev dependency locked in clients/js): a WASM PostgreSQL in each worker, not the server these tests deploy to.",
		seedMB, tests, files, "4", jsPGliteVersion(clientsJS))

	_, pg, stopPG, err := benchPG18(ctx, os.TempDir())
	if err != nil {
		return err
	}
	defer stopPG()
	version := pg.version
	r.Notef("PostgreSQL %s, test profile (fsync off …), data on ext4 (%s), TCP 127.0.0.1:%d.", version, os.TempDir(), pg.port)

	stateDir := filepath.Join(tmp, "state")
	if err := os.MkdirAll(stateDir, 0o755); err != nil {
		return err
	}
	port := 16000 + os.Getpid()%1000*3
	// serve's own pool sizes (issue 33): a pinned --pool-init turns off
	// the learning of the demand, and a pinned --pool-max held 16 of a
	// 300-test run.
	srv, err := startServeEnv(bin, stateDir, port, []string{"PGFORK_PG_URL=" + pg.url})
	if err != nil {
		return err
	}
	defer func() { _ = srv.stop() }()
	srv2Sized := "not measured"
	key := fmt.Sprintf("bench-%d", time.Now().UnixNano())
	adminEnv := []string{"PGB_ADMIN_URL=" + pg.url}
	dEnv := []string{"PGFORK_URL=" + srv.base, "PGB_KEY=" + key, "PGFORK_TOKEN="}

	var res []suiteRun
	measure := func(name, c string, env []string, filter ...string) (suiteRun, error) {
		took, s, h, err := jsBenchRun(ctx, proj, clientsJS, c, env, filter...)
		if err != nil {
			return suiteRun{}, err
		}
		fmt.Printf("  %s: %s\n", name, Dur(took))
		return suiteRun{name, took, s, h}, nil
	}
	run := func(name, c string, env []string, filter ...string) error {
		x, err := measure(name, c, env, filter...)
		if err == nil {
			res = append(res, x)
		}
		return err
	}
	const (
		dCold   = "(d) pgfork, cold: builds the template"
		dSecond = "(d) pgfork, second run on the same serve (template built)"
		fFloor  = "(f) floor: each worker reuses one database (no isolation)"
		eSecond = "(e) pgfork on XFS reflink (clone), second run on the same serve"
		eFloor  = "(f) floor on XFS reflink: each worker reuses one database"
	)
	secondRunAndFloor := func(p *serveProc, second, floor string, env []string) (float64, string, error) {
		l, err := secondAndFloor(ctx, p, 4, min(tests, 40), func() (suiteRun, error) { return measure(second, "d", env) },
			func(urls string) (suiteRun, error) { return measure(floor, "f", append(env, "PGB_FLOOR_URLS="+urls)) })
		if err == nil {
			res = append(res, l.second, l.floor)
		}
		return l.bare, l.before, err
	}
	if err := run(dCold, "d", append(adminEnv, dEnv...)); err != nil {
		return err
	}
	if err := run("(b) CREATE DATABASE … TEMPLATE + DROP per test", "b", adminEnv); err != nil {
		return err
	}
	bare, before, err := secondRunAndFloor(srv, dSecond, fFloor, append(adminEnv, dEnv...))
	if err != nil {
		return err
	}
	if err := run("(a) migrations + seed per test file", "a", adminEnv); err != nil {
		return err
	}
	if err := run("(c) PGlite: instance + migrations + seed per file, tests rolled back", "c", adminEnv); err != nil {
		r.Notef("(c) PGlite failed: %v", err)
	}
	// The overhead with a warm pool: one file's tests (fewer than the pool's
	// ready databases) after the pool has refilled.
	ready, err := srv.waitReady(ctx, min(jsBenchFilesPerTest, tests), 5*time.Minute)
	if err != nil {
		return err
	}
	if err := run(fmt.Sprintf("(d) pgfork, one file (%d tests) from a full pool (%d ready)", min(jsBenchFilesPerTest, tests), ready), "d", append(adminEnv, dEnv...), "f00.test.mjs"); err != nil {
		return err
	}
	warmPool := res[len(res)-1]
	// Issue 34: the same file with nothing started by hand, twice.
	zFirst, zSecond, zBase, zLeft, zNot := zeroSetup(ctx, bin, tmp, srv, port+2, nil, func(env []string) (time.Duration, error) {
		took, _, _, err := jsBenchRun(ctx, proj, clientsJS, "d", append(env, "PGB_KEY="+key+"-zero"), "f00.test.mjs")
		return took, err
	})
	// The XFS part runs on its own: not beside this serve's full copies.
	if err := srv.release(); err != nil {
		return fmt.Errorf("releasing the ext4 serve's databases: %w", err)
	}

	// (e): the same on a PostgreSQL on the XFS reflink mount, if any.
	var eBare float64
	eBefore := "not measured"
	if xfs := os.Getenv("PGFORK_TEST_XFS"); xfs != "" {
		if _, err := os.Stat(xfs); err == nil {
			_, pgx2, stop2, err := benchPG18(ctx, xfs)
			if err != nil {
				r.Notef("(e) not measured: %v", err)
			} else {
				defer stop2()
				// A state directory of its own: serve locks its directory.
				stateDir2 := filepath.Join(tmp, "state-xfs")
				if err := os.MkdirAll(stateDir2, 0o755); err != nil {
					return err
				}
				srv2, err := startServeEnv(bin, stateDir2, port+1, []string{"PGFORK_PG_URL=" + pgx2.url}, "--can-clone")
				if err != nil {
					return err
				}
				defer func() { _ = srv2.stop() }()
				eEnv := []string{"PGB_ADMIN_URL=" + pgx2.url, "PGFORK_URL=" + srv2.base, "PGB_KEY=" + key, "PGFORK_TOKEN="}
				if err := run("(e) pgfork on XFS reflink (clone), cold", "d", eEnv); err != nil {
					return err
				}
				if eBare, eBefore, err = secondRunAndFloor(srv2, eSecond, eFloor, eEnv); err != nil {
					return err
				}
				srv2Sized = srv2.sized()
				r.Notef("(e): a second PostgreSQL %s with its data on the XFS reflink mount %s; pgfork serve --can-clone (file_copy_method=clone).", version, xfs)
			}
		}
	} else {
		r.Notef("(e) not measured: no reflink volume (PGFORK_TEST_XFS unset).")
	}

	byName := map[string]suiteRun{}
	var a, b time.Duration
	var peers []suiteRun // (a), (b) and (c) PGlite, whole suites
	for _, x := range res {
		byName[x.name] = x
		switch {
		case strings.HasPrefix(x.name, "(a)"):
			a = x.took
			peers = append(peers, x)
		case strings.HasPrefix(x.name, "(b)"):
			b = x.took
			peers = append(peers, x)
		case strings.HasPrefix(x.name, "(c) PGlite"):
			peers = append(peers, x)
		}
	}
	var rows [][]string
	for _, x := range res {
		ra, rb := Ratio(a, x.took), Ratio(b, x.took)
		if x.name == warmPool.name { // one file, not the suite: no ratio
			ra, rb = "—", "—"
		}
		rows = append(rows, []string{x.name, Dur(x.took), ra, rb, x.acquire.Cell(0.5), x.acquire.Cell(0.99), x.handOut.Cell(0.5), x.handOut.Cell(0.99)})
	}
	srvSized := srv.sized()
	r.Notef("Whole suite (%d tests, 4 vitest workers), one run each but the second run and the floor (each the run of median suite time of %d runs, in turns: second, floor, second, floor …), pgfork serve with its own pool sizes (what it said: %s; (e): %s); per-test overhead: the time a test waited for its database "+
		"(pgfork: hand-out + connect, db.acquireMs; (b): CREATE DATABASE … TEMPLATE + connect; (f): connect), and of that the hand-out alone (pgfork: GET …/tests, db.handOutMs; (b), (f): the same as the whole). "+
		"Every test writes, so every database is recreated from the template after its test (in the background, 2 at a time): a suite longer than the pool drains it and waits for creations. "+
		"Each later run and each floor run starts once the run before it has ended for the pool (its run gap, 2 s without a hand-out, passed: the demand it took is learned) and the pool has settled (nothing creating, recreating or warming); each floor (f) run takes 4 databases from the same serve (given back after it), "+
		"one per vitest worker (VITEST_POOL_ID), and each test connects to its worker's (no isolation). Before the second run: %s; (e): %s (a run that takes more than its pool holds makes the rest beside its tests).", tests, laterRuns, srvSized, srv2Sized, before, eBefore)
	r.Table([]string{"contender", "suite", "vs (a)", "vs (b)", "wait p50", "wait p99", "hand-out p50", "hand-out p99"}, rows)
	r.Notef("Against the floor (issue 33): whole `vitest run` wall times; fresh DBs/s: the suite's tests over its wall time (each test takes one fresh database); "+
		"bare: 4 sessions running CREATE DATABASE … STRATEGY FILE_COPY from a copy of the template on the same cluster, %d databases.", min(tests, 40))
	r.floorRows("pgfork", "ext4", tests, bare, byName[fFloor], byName[dCold], byName[dSecond], peers...)
	if _, ok := byName[eFloor]; ok {
		r.floorRows("pgfork", "XFS reflink", tests, eBare, byName[eFloor], byName["(e) pgfork on XFS reflink (clone), cold"], byName[eSecond])
	}
	r.ZeroSetupTarget("JS (vitest, one file)", zFirst, zSecond, zBase, zLeft, zNot)
	dWarm := byName[dSecond].took
	r.Notef("Against the peers (kept from issue 21; issue 33 replaced its targets \"(d) ≥ 10x (a)\" and \"≥ 3x (b)\" by the floor's): (d)'s second run is %s (a) and %s (b); cold, template build included: %s and %s.",
		Ratio(a, dWarm), Ratio(b, dWarm), Ratio(a, byName[dCold].took), Ratio(b, byName[dCold].took))
	if warmAcq, warmHand := warmPool.acquire, warmPool.handOut; len(warmAcq) > 0 {
		p50, p99 := warmAcq.Quantile(0.5), warmAcq.Quantile(0.99)
		h50, h99 := warmHand.Quantile(0.5), warmHand.Quantile(0.99)
		r.Target(h50 <= 5*time.Millisecond && h99 <= 50*time.Millisecond, "per-test overhead of (d) with a warm pool (one file's tests, the pool full), the hand-out: p50 %s (≤ 5 ms), p99 %s (≤ 50 ms) over %d tests", Dur(h50), Dur(h99), len(warmHand))
		r.Target(p50 <= 5*time.Millisecond && p99 <= 50*time.Millisecond, "the same with connecting db.client (pg, SCRAM over TCP; the first test of each worker also loads pg): p50 %s (≤ 5 ms), p99 %s (≤ 50 ms)", Dur(p50), Dur(p99))
	}
	// A fresh database is a new backend: what connecting costs at least.
	if fresh, open, err := newBackendCost(ctx, pg.url, []string{"SELECT 1"}, 200); err == nil {
		r.Notef("Bound of connecting, measured after the runs on the same server: a new backend (pgx: connect over TCP with SCRAM as the tests do, SELECT 1, close) takes %s p50 (p99 %s) "+
			"against %s for SELECT 1 on an open connection, 200 times each in turns: %s per test that no fresh database per test avoids, since a PostgreSQL backend serves one database.",
			Dur(fresh.Median()), Dur(fresh.Quantile(0.99)), Dur(open.Median()), Dur(fresh.Median()-open.Median()))
	} else {
		r.Notef("Bound of connecting not measured: %v", err)
	}
	return nil
}

// jsPGliteVersion is the installed @electric-sql/pglite's version.
func jsPGliteVersion(clientsJS string) string {
	b, err := os.ReadFile(filepath.Join(clientsJS, "node_modules", "@electric-sql", "pglite", "package.json"))
	if err != nil {
		return "?"
	}
	var p struct {
		Version string `json:"version"`
	}
	if json.Unmarshal(b, &p) != nil {
		return "?"
	}
	return p.Version
}
