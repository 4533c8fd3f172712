//! What #[pgfork::test] promises beyond the README's examples: every
//! signature, every argument, a database per test, a failing migration that
//! fails every waiting test (here and in other processes) instead of hanging.

use std::time::{Duration, Instant};

use pgfork::testing::{TestArgs, TestFixture};
use pgfork::{Client, Error, Template};
use sqlx::pool::PoolConnection;
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use sqlx::{Connection, PgConnection, PgPool, Postgres};

async fn users(conn: &mut PgConnection) -> i64 {
    sqlx::query_scalar("SELECT count(*) FROM users")
        .fetch_one(conn)
        .await
        .unwrap()
}

// Three tests that each insert the same unique name and count one row: they
// pass together only if each has a database of its own.
#[pgfork::test]
async fn own_database_1(pool: PgPool) {
    sqlx::query("INSERT INTO users (name) VALUES ('same')")
        .execute(&pool)
        .await
        .unwrap();
    assert_eq!(users(&mut pool.acquire().await.unwrap()).await, 1);
}

#[pgfork::test]
async fn own_database_2(pool: PgPool) {
    sqlx::query("INSERT INTO users (name) VALUES ('same')")
        .execute(&pool)
        .await
        .unwrap();
    assert_eq!(users(&mut pool.acquire().await.unwrap()).await, 1);
}

#[pgfork::test]
async fn own_database_3(mut conn: PgConnection) {
    sqlx::query("INSERT INTO users (name) VALUES ('same')")
        .execute(&mut conn)
        .await
        .unwrap();
    assert_eq!(users(&mut conn).await, 1);
}

// sqlx spells the directory "./migrations".
#[pgfork::test(migrations = "./migrations")]
async fn pool_connection(mut conn: PoolConnection<Postgres>) {
    assert_eq!(users(&mut conn).await, 0);
}

#[pgfork::test]
async fn pool_and_connect_options(opts: PgPoolOptions, connect: PgConnectOptions) {
    let pool = opts.connect_with(connect).await.unwrap();
    assert_eq!(users(&mut pool.acquire().await.unwrap()).await, 0);
    pool.close().await;
}

#[pgfork::test]
async fn connect_options(connect: PgConnectOptions) {
    let mut conn = PgConnection::connect_with(&connect).await.unwrap();
    assert_eq!(users(&mut conn).await, 0);
    conn.close().await.unwrap();
}

#[pgfork::test(migrations = false)]
async fn no_migrations(mut conn: PgConnection) {
    let n: i64 = sqlx::query_scalar("SELECT count(*) FROM pg_tables WHERE tablename = 'users'")
        .fetch_one(&mut conn)
        .await
        .unwrap();
    assert_eq!(n, 0);
}

// Fixtures in order, in the three spellings: a name, a .sql path, path + scripts.
#[pgfork::test(fixtures("users", "seed/posts.sql"))]
async fn fixtures_in_order(mut conn: PgConnection) {
    let titles: Vec<String> = sqlx::query_scalar("SELECT title FROM posts ORDER BY title")
        .fetch_all(&mut conn)
        .await
        .unwrap();
    assert_eq!(titles, ["hello from ada", "hello from grace"]);
}

#[pgfork::test(fixtures(path = "fixtures", scripts("users")))]
async fn fixtures_path_and_scripts(mut conn: PgConnection) -> Result<(), sqlx::Error> {
    assert_eq!(users(&mut conn).await, 2);
    Ok(())
}

// The same migrations read at run time and embedded share one template key.
static EMBEDDED: sqlx::migrate::Migrator = sqlx::migrate!("./migrations");

#[tokio::test]
async fn directory_and_embedded_migrator_share_a_key() {
    let dir = sqlx::migrate::Migrator::new(std::path::Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/migrations")))
        .await
        .unwrap();
    let fx = [TestFixture {
        path: "fixtures/users.sql",
        contents: include_str!("fixtures/users.sql"),
    }];
    let key = |m| pgfork::template_hash(None, &pgfork::testing::template_key(Some(m), &fx)).unwrap();
    assert_eq!(key(&dir), key(&EMBEDDED));
    let no_fixtures = pgfork::template_hash(None, &pgfork::testing::template_key(Some(&EMBEDDED), &[])).unwrap();
    assert_ne!(key(&EMBEDDED), no_fixtures, "fixtures are part of the key");
}

// A failing migration: the test fails naming it and PostgreSQL's error.
#[pgfork::test(migrations = "broken_migrations")]
#[should_panic(
    expected = "migration 20240101000002_broken failed: error returned from database: relation \"no_such_table\" does not exist"
)]
async fn failing_migration_is_named(_pool: PgPool) {
    unreachable!("the template cannot be built");
}

fn broken_args() -> TestArgs {
    let mut args = TestArgs::new("behaviour::broken");
    args.migrations_dir(concat!(env!("CARGO_MANIFEST_DIR"), "/broken_migrations"));
    args.fixtures(&[TestFixture {
        path: "x",
        contents: "SELECT 1",
    }]);
    args
}

// Tests of one process waiting for a template whose migration fails all
// fail with that error.
#[test]
fn failing_migration_fails_every_waiting_test_here() {
    let threads: Vec<_> = (0..4)
        .map(|_| {
            std::thread::spawn(|| {
                let rt = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .unwrap();
                rt.block_on(pgfork::testing::test_db(&broken_args())).map(|_| ())
            })
        })
        .collect();
    for t in threads {
        let err = t.join().unwrap().unwrap_err();
        assert!(matches!(err, Error::MigrationFailed(_)), "{err:?}");
        assert!(
            err.to_string().contains("migration 20240101000002_broken failed"),
            "{err}"
        );
    }
}

// A test in another process (its own client, after a 423) waits on the
// server for the template's finalize; when the migration fails the
// template is discarded and that test fails at once with MigrationFailed
// instead of waiting for the server's finalize timeout (15 s in clients/test.sh).
#[tokio::test]
async fn failing_migration_fails_tests_waiting_in_other_processes() {
    let builder = Client::from_env().unwrap();
    let other = Client::from_env().unwrap();
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos();
    let hash = pgfork::template_hash(None, &format!("waiters {} {nanos}", std::process::id())).unwrap();
    let (initialized, started) = tokio::sync::oneshot::channel();
    let build = pgfork::ensure_template(&builder, &hash, |_tpl| async {
        initialized.send(()).unwrap();
        // Let the other process's request reach the server and wait there
        // for the finalize (the server does not show finalize waiters; if
        // it came later it would get the same 410, so the test holds either way).
        tokio::time::sleep(Duration::from_millis(300)).await;
        Err("migration 0002_bad failed: boom")
    });
    let wait = async {
        started.await.unwrap();
        let t = Instant::now();
        let tpl = Template {
            client: other.clone(),
            hash: hash.clone(),
            built: false,
        };
        (tpl.database().await, t.elapsed())
    };
    let (built, (got, waited)) = tokio::join!(build, wait);
    let err = built.unwrap_err();
    assert!(
        matches!(err, Error::MigrationFailed(_)) && err.to_string().contains("0002_bad failed: boom"),
        "{err}"
    );
    let err = got.unwrap_err();
    assert!(
        matches!(err, Error::MigrationFailed(_)) && err.to_string().contains("was discarded"),
        "{err}"
    );
    // "was discarded" (the server's 410 to a waiter) and not a timeout: the
    // waiter was told when the build failed, not at its wait's end. How long
    // that took is logged, no verdict: a loaded machine stretches it.
    eprintln!("the waiter was told after {waited:?}");
}

// A test returning Err fails: run_test hands the Err back (and keeps its database).
async fn returns_err(_pool: PgPool) -> Result<(), String> {
    Err("failed on purpose".into())
}

#[test]
fn err_result_is_returned() {
    let f: fn(PgPool) -> _ = returns_err;
    let mut args = TestArgs::new("behaviour::returns_err");
    args.migrations_dir(concat!(env!("CARGO_MANIFEST_DIR"), "/migrations"));
    let out = pgfork::testing::TestFn::run_test(f, args);
    assert_eq!(out, Err("failed on purpose".to_string()));
}

// Passes (its database given back) unless PGFORK_EXAMPLE_PANIC=1, which
// panicking_test_keeps_its_database sets for a run of its own.
#[pgfork::test]
async fn panics_when_asked(pool: PgPool) {
    sqlx::query("INSERT INTO users (name) VALUES ('before the panic')")
        .execute(&pool)
        .await
        .unwrap();
    if std::env::var("PGFORK_EXAMPLE_PANIC").is_ok_and(|v| v == "1") {
        panic!("failing on purpose");
    }
}

// A panicking test's database is kept (not given back: POST …/keep, outside
// the pool's count) and its URL printed with the password masked.
#[tokio::test]
async fn panicking_test_keeps_its_database() {
    let out = std::process::Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "panics_when_asked", "--nocapture", "--test-threads", "1"])
        .env("PGFORK_EXAMPLE_PANIC", "1")
        .env_remove("PGFORK_SHOW_PASSWORD")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "the test should have failed: {stderr}");
    let line = stderr
        .lines()
        .find(|l| l.contains("keeping test database"))
        .unwrap_or_else(|| panic!("no kept-database line: {stderr}"));
    assert!(line.contains("behaviour::panics_when_asked failed"), "{line}");
    assert!(line.contains(":***@"), "password not masked: {line}");

    // The same role and password as every database of this server.
    let client = Client::from_env().unwrap();
    let tpl = pgfork::testing::template_for(&{
        let mut a = TestArgs::new("behaviour::probe");
        a.migrations_dir(concat!(env!("CARGO_MANIFEST_DIR"), "/migrations"));
        a
    })
    .await
    .unwrap();
    let probe = client.get_test_database(&tpl.hash).await.unwrap();
    let password = probe.config.password.clone();
    client.recreate(&probe).await.unwrap();
    assert!(
        !password.is_empty() && !line.contains(&password),
        "password printed: {line}"
    );

    // The server was told: it counts the database as kept, outside the pool.
    let listed = client.list_templates().await.unwrap();
    let kept_now = listed["templates"]
        .as_array()
        .and_then(|ts| ts.iter().find(|t| t["templateHash"] == tpl.hash.as_str()))
        .and_then(|t| t["kept"].as_u64())
        .unwrap_or(0);
    assert!(
        kept_now >= 1,
        "the server does not count the failed test's database as kept: {listed}"
    );

    // Kept: its hand-out is still out, so giving it back now succeeds (once).
    let token = line
        .split("hand-out ")
        .nth(1)
        .and_then(|s| s.split(')').next())
        .unwrap();
    let id: i64 = line
        .split(", id ")
        .nth(1)
        .and_then(|s| s.split(',').next())
        .unwrap()
        .parse()
        .unwrap();
    let kept = pgfork::TestDatabase {
        template_hash: tpl.hash.clone(),
        id,
        token: Some(token.to_string()),
        config: Default::default(),
    };
    client
        .recreate(&kept)
        .await
        .expect("the kept database was given back already");
}
