package main

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
)

// The "rust" scenario (issue 22) runs a generated Rust test suite with
// `cargo test` (default test threads) against one PostgreSQL 18, side by
// side: (a) #[sqlx::test] as it is (a database per test, every migration run
// into it); (b) the hand-written template pattern (a template migrated once,
// CREATE DATABASE … TEMPLATE + DROP per test); (c) #[pgfork::test]
// (clients/rust) against pgfork serve on the same server (ext4); (d) the same
// on a PostgreSQL 18 on the XFS reflink mount, when there is one; and (f)
// their floor (issue 33): the same tests, each test thread reusing one
// database taken once from the same serve (no isolation). (c) and (d) run
// twice on their serve; the second run is measured against the floor.
// Issue 34's zero-setup second run (the crate starting pgfork serve itself)
// is measured when the crate does so. The build of the suite (all four test
// binaries) is timed apart.
//
// Scale: PGFORK_BENCH_RUST_TESTS (default 200). PGFORK_BENCH_RUST_TARGET: a
// cargo target directory kept between runs (default: a fresh one).
func init() {
	register(Scenario{Name: "rust", Issue: "Rust client: #[pgfork::test] vs #[sqlx::test] and CREATE DATABASE … TEMPLATE per test (issue 22)", Run: runRustBench})
}

const rustBenchCommon = `use sqlx::Connection;

/// The test's work: a short transaction.
pub async fn work(c: &mut sqlx::PgConnection) {
    let mut tx = c.begin().await.unwrap();
    sqlx::query("INSERT INTO t002 (name, score) VALUES ('test', 1)").execute(&mut *tx).await.unwrap();
    sqlx::query("UPDATE t001 SET score = score + 1 WHERE id = 1").execute(&mut *tx).await.unwrap();
    let _: i64 = sqlx::query_scalar("SELECT count(*) FROM t002").fetch_one(&mut *tx).await.unwrap();
    tx.commit().await.unwrap();
}

#[allow(dead_code)]
pub fn record(acquire: std::time::Duration) {
    use std::io::Write;
    let ms = acquire.as_secs_f64() * 1e3;
    let mut f = std::fs::OpenOptions::new().create(true).append(true).open(std::env::var("PGB_OUT").unwrap()).unwrap();
    writeln!(f, "{ms:.3} {ms:.3}").unwrap();
}
`

// (b): the template rsb_template is migrated by the harness; each test
// clones it, connects, works, disconnects and drops its copy.
const rustBenchB = `mod common;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Instant;

use sqlx::postgres::PgConnectOptions;
use sqlx::{Connection, Executor, PgConnection};

static N: AtomicUsize = AtomicUsize::new(0);

fn opts(db: &str) -> PgConnectOptions {
    let v = |k: &str| std::env::var(k).unwrap();
    PgConnectOptions::new()
        .host(&v("PGB_HOST"))
        .port(v("PGB_PORT").parse().unwrap())
        .username(&v("PGB_USER"))
        .password(&v("PGB_PASSWORD"))
        .database(db)
}

async fn with_db() {
    let t0 = Instant::now();
    let name = format!("rsb_{}_{}", std::process::id(), N.fetch_add(1, Ordering::SeqCst));
    let mut admin = PgConnection::connect_with(&opts("postgres")).await.unwrap();
    admin.execute(format!("CREATE DATABASE {name} TEMPLATE rsb_template").as_str()).await.unwrap();
    let mut c = PgConnection::connect_with(&opts(&name)).await.unwrap();
    common::record(t0.elapsed());
    common::work(&mut c).await;
    c.close().await.unwrap();
    admin.execute(format!("DROP DATABASE {name}").as_str()).await.unwrap();
    admin.close().await.unwrap();
}
`

// (f), the floor: each test thread reuses one database taken once (no
// isolation); a test opens a PgPool on it as #[pgfork::test] does on its own.
const rustBenchF = `mod common;

use std::sync::{LazyLock, Mutex};
use std::time::Instant;

use sqlx::postgres::PgPoolOptions;

static FREE: LazyLock<Mutex<Vec<String>>> =
    LazyLock::new(|| Mutex::new(std::env::var("PGB_FLOOR_URLS").unwrap().split(' ').map(String::from).collect()));

async fn floor() {
    let url = FREE.lock().unwrap().pop().expect("more tests at once than floor databases");
    let t0 = Instant::now();
    let pool = PgPoolOptions::new().max_connections(5).connect(&url).await.unwrap();
    common::record(t0.elapsed());
    common::work(&mut pool.acquire().await.unwrap()).await;
    pool.close().await;
    FREE.lock().unwrap().push(url);
}
`

func rustBenchTests(c string, tests int) string {
	var b strings.Builder
	switch c {
	case "f":
		b.WriteString(rustBenchF)
		for k := 0; k < tests; k++ {
			fmt.Fprintf(&b, "\n#[tokio::test]\nasync fn t%03d() {\n    floor().await;\n}\n", k)
		}
	case "a":
		b.WriteString("mod common;\n\n")
		for k := 0; k < tests; k++ {
			fmt.Fprintf(&b, "#[sqlx::test(migrations = \"./migrations\")]\nasync fn t%03d(pool: sqlx::PgPool) {\n    common::work(&mut pool.acquire().await.unwrap()).await;\n}\n\n", k)
		}
	case "b":
		b.WriteString(rustBenchB)
		for k := 0; k < tests; k++ {
			fmt.Fprintf(&b, "\n#[tokio::test]\nasync fn t%03d() {\n    with_db().await;\n}\n", k)
		}
	default: // c, d
		b.WriteString("mod common;\n\n")
		for k := 0; k < tests; k++ {
			fmt.Fprintf(&b, "#[pgfork::test(migrations = \"./migrations\")]\nasync fn t%03d(pool: sqlx::PgPool) {\n    common::work(&mut pool.acquire().await.unwrap()).await;\n}\n\n", k)
		}
	}
	return b.String()
}

func rustBenchProject(dir, clientsRust string, tests int) error {
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
	manifest := fmt.Sprintf(`[package]
name = "pgfork-bench-suite"
version = "0.0.0"
edition = "2024"
publish = false

[workspace]

[dev-dependencies]
pgfork = { path = %q, features = ["sqlx"] }
sqlx = { version = "0.8", default-features = false, features = ["postgres", "runtime-tokio", "migrate", "macros"] }
tokio = { version = "1", default-features = false, features = ["rt", "macros"] }

[profile.dev]
debug = 0
`, filepath.Join(clientsRust, "pgfork"))
	files := map[string]string{
		"Cargo.toml":          manifest,
		"src/lib.rs":          "",
		"tests/common/mod.rs": rustBenchCommon,
		"tests/a.rs":          rustBenchTests("a", tests),
		"tests/b.rs":          rustBenchTests("b", tests),
		"tests/c.rs":          rustBenchTests("c", tests),
		"tests/f.rs":          rustBenchTests("f", tests),
	}
	for name, content := range files {
		if err := write(name, content); err != nil {
			return err
		}
	}
	// The versions clients/rust is tested with.
	lock, err := os.ReadFile(filepath.Join(clientsRust, "Cargo.lock"))
	if err != nil {
		return err
	}
	return write("Cargo.lock", string(lock))
}

// rustCargo runs cargo in the suite; offline first (the crates are in
// CARGO_HOME after clients/rust's build), then online.
func rustCargo(ctx context.Context, proj string, env []string, args ...string) ([]byte, error) {
	run := func(extra ...string) ([]byte, error) {
		cmd := exec.CommandContext(ctx, "cargo", append(args, extra...)...)
		cmd.Dir = proj
		cmd.Env = append(append(os.Environ(), "CARGO_TERM_COLOR=never"), env...)
		return cmd.CombinedOutput()
	}
	out, err := run("--offline")
	if err != nil && strings.Contains(string(out), "offline") {
		return run()
	}
	return out, err
}

func rustBenchRun(ctx context.Context, proj, test string, env []string, filter ...string) (time.Duration, Sample, Sample, error) {
	out := filepath.Join(proj, fmt.Sprintf("acquire-%s-%d.txt", test, time.Now().UnixNano()))
	env = append(env, "PGB_OUT="+out, "PGFORK_TIMINGS="+out)
	t0 := time.Now()
	b, err := rustCargo(ctx, proj, env, append([]string{"test", "--test", test}, filter...)...)
	took := time.Since(t0)
	if err != nil || !strings.Contains(string(b), "test result: ok.") {
		return 0, nil, nil, fmt.Errorf("cargo test --test %s: %v:\n%s", test, err, b[max(0, len(b)-3000):])
	}
	s, h := readTimings(out)
	return took, s, h, nil
}

func runRustBench(ctx context.Context, r *Report) error {
	r.Notef("Load average at start: %s (2 cores shared with other work; times grow with contention).", loadAvg())
	defer func() { r.Notef("Load average at the end: %s.", loadAvg()) }()
	tests := 200
	if v, err := strconv.Atoi(os.Getenv("PGFORK_BENCH_RUST_TESTS")); err == nil && v > 0 {
		tests = v
	}
	if tests != 200 {
		r.Notef("SCALED: %d tests (issue: 200).", tests)
	}
	if _, err := exec.LookPath("cargo"); err != nil {
		return fmt.Errorf("cargo not found: the rust scenario needs a Rust toolchain")
	}
	wd, err := os.Getwd()
	if err != nil {
		return err
	}
	clientsRust := filepath.Join(wd, "clients", "rust")
	tmp, bin, err := clientWorkspace("pgfork-bench-rust-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(tmp)
	proj := filepath.Join(tmp, "suite")
	if err := rustBenchProject(proj, clientsRust, tests); err != nil {
		return err
	}
	// The suite's own target directory: its build is timed cold (the crates
	// themselves come from CARGO_HOME).
	// PGFORK_BENCH_RUST_TARGET keeps it between runs (the build is then not cold).
	targetDir, buildKind := filepath.Join(tmp, "target"), "cold target directory"
	if d := os.Getenv("PGFORK_BENCH_RUST_TARGET"); d != "" {
		targetDir, buildKind = d, "target directory "+d+" kept from earlier runs"
	}
	target := []string{"CARGO_TARGET_DIR=" + targetDir}
	t0 := time.Now()
	if out, err := rustCargo(ctx, proj, target, "test", "--no-run"); err != nil {
		return fmt.Errorf("building the suite: %v:\n%s", err, out)
	}
	build := time.Since(t0)
	// Each contender's test binary alone: its source touched, rebuilt (the
	// macros' expansion and the link; #[sqlx::test] embeds the migrations
	// into every test).
	var rebuilds []string
	for _, c := range []string{"a", "b", "c"} {
		now := time.Now()
		if err := os.Chtimes(filepath.Join(proj, "tests", c+".rs"), now, now); err != nil {
			return err
		}
		t := time.Now()
		if out, err := rustCargo(ctx, proj, target, "test", "--no-run", "--test", c); err != nil {
			return fmt.Errorf("rebuilding tests/%s.rs: %v:\n%s", c, err, out)
		}
		rebuilds = append(rebuilds, fmt.Sprintf("(%s) %s", c, Dur(time.Since(t))))
	}
	cargoV, _ := exec.Command("cargo", "--version").Output()
	r.Notef("Suite: 40 generated migrations (60 tables with two indexes each and foreign keys, 5 functions; the js scenario's), %d tests per contender in one test binary each, "+
		"run by `cargo test --test X` with the default test threads (%d here); each test runs a short transaction (INSERT, UPDATE, SELECT) on its own database through a PgPool "+
		"((b): a PgConnection). %s, sqlx 0.8, debug profile. Building the suite (four test binaries, every dependency, %s) took %s, not counted below; "+
		"rebuilding one contender's test binary after touching its file: %s.",
		tests, runtime.NumCPU(), strings.TrimSpace(string(cargoV)), buildKind, Dur(build), strings.Join(rebuilds, ", "))

	_, pg, stopPG, err := benchPG18(ctx, os.TempDir())
	if err != nil {
		return err
	}
	defer stopPG()
	admin, err := pgx.Connect(ctx, pg.url)
	if err != nil {
		return err
	}
	version := pg.version
	if _, err := admin.Exec(ctx, "CREATE DATABASE rsb_template"); err != nil {
		admin.Close(ctx)
		return err
	}
	admin.Close(ctx)
	if err := rustBenchMigrate(ctx, pg, "rsb_template"); err != nil {
		return err
	}
	r.Notef("PostgreSQL %s, test profile (fsync off …), data on ext4 (%s), TCP 127.0.0.1:%d.", version, os.TempDir(), pg.port)

	stateDir := filepath.Join(tmp, "state")
	if err := os.MkdirAll(stateDir, 0o755); err != nil {
		return err
	}
	port := 17000 + os.Getpid()%1000*3
	// serve's own pool sizes (issue 33), as (d)'s: a pinned --pool-init
	// turns off the learning of the demand.
	srv, err := startServeEnv(bin, stateDir, port, []string{"PGFORK_PG_URL=" + pg.url})
	if err != nil {
		return err
	}
	defer func() { _ = srv.stop() }()
	pgEnv := func(p pgServer) []string {
		return []string{
			fmt.Sprintf("DATABASE_URL=postgres://%s:%s@%s:%d/postgres?sslmode=disable", p.user, p.password, p.host, p.port),
			"PGB_HOST=" + p.host, fmt.Sprintf("PGB_PORT=%d", p.port), "PGB_USER=" + p.user, "PGB_PASSWORD=" + p.password,
		}
	}
	env := append(append(target, pgEnv(pg)...), "PGFORK_URL="+srv.base, "PGFORK_TOKEN=")

	var res []suiteRun
	measure := func(name, test string, env []string, filter ...string) (suiteRun, error) {
		took, s, h, err := rustBenchRun(ctx, proj, test, env, filter...)
		if err != nil {
			return suiteRun{}, err
		}
		fmt.Printf("  %s: %s\n", name, Dur(took))
		return suiteRun{name, took, s, h}, nil
	}
	run := func(name, test string, env []string, filter ...string) error {
		x, err := measure(name, test, env, filter...)
		if err == nil {
			res = append(res, x)
		}
		return err
	}
	const (
		cCold   = "(c) #[pgfork::test], cold: builds the template"
		cSecond = "(c) #[pgfork::test], second run on the same serve (template built)"
		fFloor  = "(f) floor: each test thread reuses one database (no isolation)"
		dCold   = "(d) #[pgfork::test] on XFS reflink (clone), cold"
		dSecond = "(d) #[pgfork::test] on XFS reflink (clone), second run on the same serve"
		dFloor  = "(f) floor on XFS reflink: each test thread reuses one database"
	)
	threads := runtime.NumCPU() // cargo test's default test threads
	secondRunAndFloor := func(p *serveProc, second, floor string, env []string) (float64, string, error) {
		l, err := secondAndFloor(ctx, p, threads, min(tests, 40), func() (suiteRun, error) { return measure(second, "c", env) },
			func(urls string) (suiteRun, error) { return measure(floor, "f", append(env, "PGB_FLOOR_URLS="+urls)) })
		if err == nil {
			res = append(res, l.second, l.floor)
		}
		return l.bare, l.before, err
	}
	if err := run(cCold, "c", env); err != nil {
		return err
	}
	if err := run("(b) CREATE DATABASE … TEMPLATE + DROP per test", "b", env); err != nil {
		return err
	}
	bare, before, err := secondRunAndFloor(srv, cSecond, fFloor, env)
	if err != nil {
		return err
	}
	if err := run("(a) #[sqlx::test]: migrations per test", "a", env); err != nil {
		return err
	}
	// Per-test overhead when the pool keeps up: 10 tests (t000…t009) from a full pool.
	ready, err := srv.waitReady(ctx, min(16, tests), 5*time.Minute)
	if err != nil {
		return err
	}
	fullPool := fmt.Sprintf("(c) #[pgfork::test], %d tests from a full pool (%d ready)", min(10, tests), ready)
	if err := run(fullPool, "c", env, "t00"); err != nil {
		return err
	}
	// Issue 34: the same tests with nothing started by hand, twice.
	zFirst, zSecond, zBase, zLeft, zNot := zeroSetup(ctx, bin, tmp, srv, port+2, pgEnv(pg), func(zenv []string) (time.Duration, error) {
		took, _, _, err := rustBenchRun(ctx, proj, "c", append(append(append([]string{}, target...), pgEnv(pg)...), zenv...), "t00")
		return took, err
	})
	// The XFS part runs on its own: not beside this serve's full copies.
	if err := srv.release(); err != nil {
		return fmt.Errorf("releasing the ext4 serve's databases: %w", err)
	}

	var dBare float64
	dBefore := "not measured"
	if xfs := os.Getenv("PGFORK_TEST_XFS"); xfs != "" {
		if _, err := os.Stat(xfs); err == nil {
			_, pg2, stop2, err := benchPG18(ctx, xfs)
			if err != nil {
				r.Notef("(d) not measured: %v", err)
			} else {
				defer stop2()
				// A state directory of its own: one pgfork serve per state directory.
				stateDir2 := filepath.Join(tmp, "state-xfs")
				if err := os.MkdirAll(stateDir2, 0o755); err != nil {
					return err
				}
				// serve's own sizes here too: with clone 64 per core.
				srv2, err := startServeEnv(bin, stateDir2, port+1, []string{"PGFORK_PG_URL=" + pg2.url}, "--can-clone")
				if err != nil {
					return err
				}
				defer func() { _ = srv2.stop() }()
				env2 := append(append(append([]string{}, target...), pgEnv(pg2)...), "PGFORK_URL="+srv2.base, "PGFORK_TOKEN=")
				if err := run(dCold, "c", env2); err != nil {
					return err
				}
				if dBare, dBefore, err = secondRunAndFloor(srv2, dSecond, dFloor, env2); err != nil {
					return err
				}
				r.Notef("(d): a second PostgreSQL %s with its data on the XFS reflink mount %s; pgfork serve --can-clone (file_copy_method=clone) with its own pool sizes "+
					"(no --pool-* flags: the pool learns the demand of a run and keeps it ready, up to 64 databases per core, %d at once).", version, xfs, runtime.NumCPU())
			}
		}
	} else {
		r.Notef("(d) not measured: no reflink volume (PGFORK_TEST_XFS unset).")
	}

	byName := map[string]suiteRun{}
	var a, b time.Duration
	var peers []suiteRun // (a) and (b)
	for _, x := range res {
		byName[x.name] = x
		switch {
		case strings.HasPrefix(x.name, "(a)"):
			a = x.took
			peers = append(peers, x)
		case strings.HasPrefix(x.name, "(b)"):
			b = x.took
			peers = append(peers, x)
		}
	}
	var rows [][]string
	for _, x := range res {
		ra, rb := Ratio(a, x.took), Ratio(b, x.took)
		if x.name == fullPool { // 10 tests, not the suite: no ratio
			ra, rb = "—", "—"
		}
		rows = append(rows, []string{x.name, Dur(x.took), ra, rb, x.acquire.Cell(0.5), x.acquire.Cell(0.99), x.handOut.Cell(0.5), x.handOut.Cell(0.99)})
	}
	r.Notef("Whole `cargo test --test X` run (%d tests; the binary is built already, cargo's check included), one run each but the second run and the floor (each the run of median suite time of %d runs, in turns: second, floor, second, floor …), pgfork serve with its own pool sizes (what it said: %s). "+
		"Per-test wait: (c)/(d) from PGFORK_TIMINGS: template (cached in the process after the first test), hand-out and connecting the PgPool (its first connection); of that the template and hand-out alone; "+
		"(b) CREATE DATABASE … TEMPLATE + connect (both columns); (f) connecting the PgPool (both columns). (a) has no hook: its suite time only. Every test writes, so every pgfork database is recreated after its test "+
		"(in the background, 2 at a time): a suite longer than the pool drains it and waits for creations; the full-pool row (10 tests, the pool refilled first) "+
		"is the overhead when the pool keeps up. Each later run and each floor run starts once the run before it has ended for the pool (its run gap, 2 s without a hand-out, passed: the demand it took is learned) and the pool has settled (nothing creating, recreating or warming); "+
		"each floor (f) run takes %d databases from the same serve (given back after it), one per test thread, and each test opens its PgPool on a free one (no isolation). Before the second run: %s; (d): %s.", tests, laterRuns, srv.sized(), threads, before, dBefore)
	r.Table([]string{"contender", "suite", "vs (a)", "vs (b)", "wait p50", "wait p99", "hand-out p50", "hand-out p99"}, rows)
	r.Notef("Against the floor (issue 33): whole `cargo test` wall times; fresh DBs/s: the suite's tests over its wall time (each test takes one fresh database); "+
		"bare: %d sessions (the test threads) running CREATE DATABASE … STRATEGY FILE_COPY from a copy of the template on the same cluster, %d databases.", threads, min(tests, 40))
	r.floorRows("#[pgfork::test]", "ext4", tests, bare, byName[fFloor], byName[cCold], byName[cSecond], peers...)
	if _, ok := byName[dFloor]; ok {
		r.floorRows("#[pgfork::test]", "XFS reflink", tests, dBare, byName[dFloor], byName[dCold], byName[dSecond])
	}
	second, full := byName[cSecond], byName[fullPool]
	if len(second.acquire) > 0 {
		p50 := second.acquire.Quantile(0.5)
		r.Target(p50 <= 20*time.Millisecond, "#[pgfork::test] from a debug build, hand-out plus the first connection (template cached, hand-out, PgPool's first connection), second run: p50 %s (≤ 20 ms), p99 %s; "+
			"from a full pool: p50 %s, p99 %s; the floor's first connection alone: p50 %s", Dur(p50), second.acquire.Cell(0.99), full.acquire.Cell(0.5), full.acquire.Cell(0.99), byName[fFloor].acquire.Cell(0.5))
	}
	r.ZeroSetupTarget(fmt.Sprintf("Rust (cargo test, %d tests)", min(10, tests)), zFirst, zSecond, zBase, zLeft, zNot)
	warm, cold := second.took, byName[cCold].took
	r.Notef("Against the peers (kept from issue 22; issue 33 replaced its targets \"(c) ≥ 10x (a)\" and \"≥ 3x (b)\" by the floor's): (c)'s second run is %s (a) #[sqlx::test] and %s (b); cold, template build included: %s and %s.",
		Ratio(a, warm), Ratio(b, warm), Ratio(a, cold), Ratio(b, cold))
	if len(full.handOut) > 0 {
		h50, a50 := full.handOut.Quantile(0.5), full.acquire.Quantile(0.5)
		r.Target(h50 <= 5*time.Millisecond, "per-test overhead of (c) from a full pool, template + hand-out: p50 %s (≤ 5 ms), p99 %s over %d tests; with connecting the PgPool: p50 %s, p99 %s",
			Dur(h50), full.handOut.Cell(0.99), len(full.handOut), Dur(a50), full.acquire.Cell(0.99))
	}
	return nil
}

// rustBenchMigrate runs the generated migrations into database db, in name order.
func rustBenchMigrate(ctx context.Context, pg pgServer, db string) error {
	c, err := pgx.Connect(ctx, fmt.Sprintf("postgres://%s:%s@%s:%d/%s?sslmode=disable", pg.user, pg.password, pg.host, pg.port, db))
	if err != nil {
		return err
	}
	defer c.Close(ctx)
	m := jsMigrations()
	names := make([]string, 0, len(m))
	for n := range m {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		if _, err := c.Exec(ctx, m[n]); err != nil {
			return fmt.Errorf("migration %s: %w", n, err)
		}
	}
	return nil
}
