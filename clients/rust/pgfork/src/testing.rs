//! Support of `#[pgfork::test]` (feature `sqlx`), and the same for code
//! that calls it by hand: [`TestArgs`] describes a test's template
//! (migrations and fixtures), [`TestFn`] runs a test function of any of the
//! signatures `#[sqlx::test]` takes.
//!
//! ## The template key
//!
//! A template's key is [`template_hash`](crate::template_hash) with no
//! directory and this text as the extra key (so any client can compute it):
//!
//! ```text
//! pgfork-rust-sqlx/1
//! migration <version> <type> <sha384 checksum in hex> <description>     (each, in the migrator's order)
//! fixture <length in bytes> <path>\n<contents>                           (each, in the attribute's order)
//! ```
//!
//! `<type>` is `simple`, `up` or `down`. The checksums are sqlx's (SHA-384
//! of each migration's SQL), so `migrations = "dir"` (read at run time) and
//! `migrator = "MIGRATOR"` (an embedded `sqlx::migrate!()`) of the same
//! files share one template; a changed migration or fixture is a new one.
//!
//! ## Compile errors
//!
//! A test `#[pgfork::test]` cannot run is a compile error, as these checks
//! (`compile_fail` doctests, run by `cargo test`) show. A parameter type it
//! cannot pass (E0277, "#[pgfork::test] cannot pass a database to a test
//! function of type …", with the list of signatures it can):
//!
//! ```compile_fail,E0277
//! async fn takes_a_string(_s: String) {}
//! // What #[pgfork::test] expands to (in a non-test build #[test] items vanish,
//! // so the doctest calls it directly).
//! let f: fn(_) -> _ = takes_a_string;
//! pgfork::testing::TestFn::run_test(f, pgfork::testing::TestArgs::new("x"));
//! ```
//!
//! The same with a pair in the wrong order:
//!
//! ```compile_fail,E0277
//! use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
//! async fn swapped(_c: PgConnectOptions, _p: PgPoolOptions) {}
//! let f: fn(_, _) -> _ = swapped;
//! pgfork::testing::TestFn::run_test(f, pgfork::testing::TestArgs::new("x"));
//! ```
//!
//! While the right signature compiles:
//!
//! ```no_run
//! async fn takes_a_pool(_pool: sqlx::PgPool) {}
//! let f: fn(_) -> _ = takes_a_pool;
//! pgfork::testing::TestFn::run_test(f, pgfork::testing::TestArgs::new("x"));
//! ```
//!
//! The attribute's own checks: a test that is not `async`, …
//!
//! ```compile_fail
//! #[pgfork::test]
//! fn not_async(_pool: sqlx::PgPool) {}
//! ```
//!
//! … an unknown argument, …
//!
//! ```compile_fail
//! #[pgfork::test(migratons = "migrations")]
//! async fn typo(_pool: sqlx::PgPool) {}
//! ```
//!
//! … two sources of migrations, …
//!
//! ```compile_fail
//! #[pgfork::test(migrations = false, migrator = "crate::MIGRATOR")]
//! async fn both(_pool: sqlx::PgPool) {}
//! ```
//!
//! … a migrations directory that does not exist, and no database parameter:
//!
//! ```compile_fail
//! #[pgfork::test(migrations = "no/such/dir")]
//! async fn missing(_pool: sqlx::PgPool) {}
//! ```
//!
//! ```compile_fail
//! #[pgfork::test]
//! async fn no_database() {}
//! ```

use std::collections::HashMap;
use std::future::Future;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use sqlx::migrate::{MigrateError, MigrationType, Migrator};
use sqlx::pool::PoolConnection;
use sqlx::postgres::{PgConnectOptions, PgConnection, PgPool, PgPoolOptions, Postgres};
use sqlx::{ConnectOptions, Connection};

use crate::client::{Client, TemplateDatabase, TestDatabase, mask_password};
use crate::error::{Error, Result};
use crate::template::{TestDb, ensure_template, get_database};

/// One fixture: its path as written in the attribute, and its SQL (embedded).
#[derive(Debug, Clone, Copy)]
pub struct TestFixture {
    /// The path (for messages and the key).
    pub path: &'static str,
    /// The SQL.
    pub contents: &'static str,
}

/// Where a test's migrations come from.
#[derive(Debug, Clone, Copy)]
pub enum Migrations {
    /// None: the template is an empty database (plus fixtures).
    None,
    /// A directory read at run time with sqlx's rules (absolute, or relative to the working directory).
    Dir(&'static str),
    /// A migrator (`sqlx::migrate!()`), embedded.
    Migrator(&'static Migrator),
}

/// What `#[pgfork::test]` passes to [`TestFn::run_test`].
#[derive(Debug, Clone)]
pub struct TestArgs {
    /// The test's path (module::name), for messages.
    pub name: &'static str,
    /// Its migrations.
    pub migrations: Migrations,
    /// Its fixtures, applied after the migrations into the template.
    pub fixtures: Vec<TestFixture>,
}

impl TestArgs {
    /// Args of test `name` with no migrations and no fixtures.
    pub fn new(name: &'static str) -> TestArgs {
        TestArgs {
            name,
            migrations: Migrations::None,
            fixtures: Vec::new(),
        }
    }

    /// Migrations from a directory (sqlx's file names), read at run time.
    pub fn migrations_dir(&mut self, dir: &'static str) {
        self.migrations = Migrations::Dir(dir);
    }

    /// Migrations from a migrator.
    pub fn migrator(&mut self, m: &'static Migrator) {
        self.migrations = Migrations::Migrator(m);
    }

    /// Fixtures, applied in this order.
    pub fn fixtures(&mut self, f: &[TestFixture]) {
        self.fixtures = f.to_vec();
    }
}

/// The migrator of a directory, resolved once per process.
async fn dir_migrator(dir: &'static str) -> Result<Arc<Migrator>> {
    type Cells = Mutex<HashMap<&'static str, Arc<tokio::sync::OnceCell<Arc<Migrator>>>>>;
    static DIRS: OnceLock<Cells> = OnceLock::new();
    let cell = DIRS
        .get_or_init(Default::default)
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .entry(dir)
        .or_default()
        .clone();
    let m = cell
        .get_or_try_init(|| async {
            let p = PathBuf::from(dir);
            if !p.is_dir() {
                return Err(Error::Config(format!(
                    "pgfork: migrations directory {dir} does not exist (migrations = \"…\" is relative to the crate's Cargo.toml)"
                )));
            }
            Migrator::new(p.as_path())
                .await
                .map(Arc::new)
                .map_err(|e| Error::Config(format!("pgfork: reading migrations in {dir}: {e}")))
        })
        .await?;
    Ok(m.clone())
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// The extra key of a template of `migrator` (None: no migrations) and
/// `fixtures` (see the module's doc); its hash is
/// `template_hash(None, &template_key(…))`.
pub fn template_key(migrator: Option<&Migrator>, fixtures: &[TestFixture]) -> String {
    let mut s = String::from("pgfork-rust-sqlx/1\n");
    for m in migrator.into_iter().flat_map(|m| m.iter()) {
        let t = match m.migration_type {
            MigrationType::Simple => "simple",
            MigrationType::ReversibleUp => "up",
            MigrationType::ReversibleDown => "down",
        };
        s += &format!("migration {} {t} {} {}\n", m.version, hex(&m.checksum), m.description);
    }
    for f in fixtures {
        s += &format!("fixture {} {}\n{}\n", f.contents.len(), f.path, f.contents);
    }
    s
}

/// sqlx's connect options for a database the server handed out.
pub fn connect_options(url: &str) -> Result<PgConnectOptions> {
    url.parse::<PgConnectOptions>().map_err(|source| Error::Database {
        what: format!("pgfork: parsing {}", mask_password(url)),
        source,
    })
}

async fn migrate(tpl: TemplateDatabase, migrator: Option<&Migrator>, fixtures: &[TestFixture]) -> Result<(), String> {
    let url = tpl.config.local_url();
    let opts = connect_options(&url)
        .map_err(|e| e.to_string())?
        .disable_statement_logging();
    let mut conn = PgConnection::connect_with(&opts)
        .await
        .map_err(|e| format!("connecting to the template {}: {e}", mask_password(&url)))?;
    let r = async {
        if let Some(m) = migrator {
            m.run(&mut conn).await.map_err(|e| match &e {
                MigrateError::Execute(inner) | MigrateError::ExecuteMigration(inner, _) => {
                    let version = match &e {
                        MigrateError::ExecuteMigration(_, v) => Some(*v),
                        _ => None,
                    };
                    let name = version
                        .and_then(|v| m.iter().find(|x| x.version == v && x.migration_type.is_up_migration()))
                        .map(|x| format!("migration {}_{}", x.version, x.description.replace(' ', "_")))
                        .unwrap_or_else(|| "a migration".into());
                    format!("{name} failed: {inner}")
                }
                other => format!("migrating: {other}"),
            })?;
        }
        for f in fixtures {
            sqlx::raw_sql(f.contents)
                .execute(&mut conn)
                .await
                .map_err(|e| format!("fixture {} failed: {e}", f.path))?;
        }
        Ok(())
    }
    .await;
    // Finalize needs the template without connections.
    let _ = conn.close().await;
    r
}

/// The template of `args`, built once per key (across threads and, by the
/// server, across processes), and the client of the server the environment names.
pub async fn template_for(args: &TestArgs) -> Result<crate::Template> {
    let client = Client::from_env()?;
    let dir;
    let migrator: Option<&Migrator> = match args.migrations {
        Migrations::None => None,
        Migrations::Migrator(m) => Some(m),
        Migrations::Dir(d) => {
            dir = dir_migrator(d).await?;
            Some(&dir)
        }
    };
    let hash = crate::template_hash(None, &template_key(migrator, &args.fixtures))?;
    ensure_template(&client, &hash, |tpl| migrate(tpl, migrator, &args.fixtures)).await
}

/// A database for test `args`: its template built (once), one test database handed out.
pub async fn test_db(args: &TestArgs) -> Result<TestDb> {
    let tpl = template_for(args).await?;
    let td: TestDatabase = get_database(&tpl.client, &tpl.hash).await?;
    Ok(TestDb::new(tpl.client, td, args.name))
}

/// What a test function returns: `()` or a `Result`; an `Err` is a failure
/// (its database is kept, as after a panic).
pub trait TestResult {
    /// False for an `Err`.
    fn is_success(&self) -> bool;
}

impl TestResult for () {
    fn is_success(&self) -> bool {
        true
    }
}

impl<T, E> TestResult for std::result::Result<T, E> {
    fn is_success(&self) -> bool {
        self.is_ok()
    }
}

/// A test function `#[pgfork::test]` can call.
#[diagnostic::on_unimplemented(
    message = "#[pgfork::test] cannot pass a database to a test function of type `{Self}`",
    label = "this test's parameters",
    note = "#[pgfork::test] (as #[sqlx::test]) takes an async fn with one of these parameter lists: \
            (PgPool), (PgConnection), (PoolConnection<Postgres>), (PgPoolOptions, PgConnectOptions), \
            or (PgConnectOptions); and returns () or a Result"
)]
pub trait TestFn {
    /// What the test returns.
    type Output;
    /// Runs the test on a runtime of its own with a database of the template `args` describes.
    fn run_test(self, args: TestArgs) -> Self::Output;
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("pgfork: cannot start a tokio runtime")
}

/// Gets a database for `args`, passes it to `f` through `make` (which opens what the test takes), gives
/// the database back after a success, keeps it (printing its URL, password masked) after a failure or panic.
fn run<P, Fut, Mk, MkFut>(args: TestArgs, make: Mk, f: impl FnOnce(P) -> Fut) -> Fut::Output
where
    Fut: Future,
    Fut::Output: TestResult,
    Mk: FnOnce(PgConnectOptions) -> MkFut,
    MkFut: Future<Output = Result<(P, Option<PgPool>)>>,
{
    let rt = runtime();
    let t0 = Instant::now();
    let db = rt
        .block_on(test_db(&args))
        .unwrap_or_else(|e| panic!("pgfork: test {}: {e}", args.name));
    let handed_out = t0.elapsed();
    // From here a failure or a panic keeps the database on the server and prints its URL.
    let opts = connect_options(&db.url()).unwrap_or_else(|e| panic!("{e}"));
    let (param, pool) = rt
        .block_on(make(opts))
        .unwrap_or_else(|e| panic!("pgfork: test {}: {e}", args.name));
    record_timing(t0.elapsed(), handed_out);
    // A panicking test (an assert) is caught here, so that its database is
    // kept on the server too, then the panic goes on.
    let out = match std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| rt.block_on(f(param)))) {
        Ok(out) => out,
        Err(panic) => {
            drop(pool);
            keep(&rt, db, args.name);
            std::panic::resume_unwind(panic)
        }
    };
    if out.is_success() {
        rt.block_on(async {
            if let Some(p) = pool {
                p.close().await;
            }
            db.recreate().await
        })
        .unwrap_or_else(|e| {
            panic!(
                "pgfork: test {} passed, but giving its database back failed: {e}",
                args.name
            )
        });
    } else {
        drop(pool);
        keep(&rt, db, args.name);
    }
    out
}

/// Keeps a failed test's database (printing its URL); a server that cannot
/// be told is only reported: the test's own failure is what matters.
fn keep(rt: &tokio::runtime::Runtime, db: TestDb, name: &str) {
    if let Err(e) = rt.block_on(db.keep()) {
        eprintln!("pgfork: test {name}: telling the server to keep its database failed: {e}");
    }
}

/// With `$PGFORK_TIMINGS` naming a file, appends a line per test: the
/// milliseconds it waited for its database (template, hand-out and
/// connecting), and of that the template and hand-out alone.
fn record_timing(acquire: Duration, hand_out: Duration) {
    let Some(path) = std::env::var_os("PGFORK_TIMINGS") else {
        return;
    };
    let line = format!(
        "{:.3} {:.3}\n",
        acquire.as_secs_f64() * 1e3,
        hand_out.as_secs_f64() * 1e3
    );
    let written = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&path)
        .and_then(|mut f| std::io::Write::write_all(&mut f, line.as_bytes()));
    if let Err(e) = written {
        eprintln!("pgfork: PGFORK_TIMINGS={}: {e}", path.to_string_lossy());
    }
}

fn db_err(what: &str, opts: &PgConnectOptions, source: sqlx::Error) -> Error {
    Error::Database {
        what: format!("pgfork: {what} test database {}", opts.get_database().unwrap_or("?")),
        source,
    }
}

fn pool_options() -> PgPoolOptions {
    // As #[sqlx::test]'s pools.
    PgPoolOptions::new().max_connections(5)
}

impl<Fut> TestFn for fn(PgPool) -> Fut
where
    Fut: Future,
    Fut::Output: TestResult,
{
    type Output = Fut::Output;
    fn run_test(self, args: TestArgs) -> Self::Output {
        run(
            args,
            |opts| async move {
                let pool = pool_options()
                    .connect_with(opts.clone())
                    .await
                    .map_err(|e| db_err("connecting to", &opts, e))?;
                Ok((pool.clone(), Some(pool)))
            },
            self,
        )
    }
}

impl<Fut> TestFn for fn(PoolConnection<Postgres>) -> Fut
where
    Fut: Future,
    Fut::Output: TestResult,
{
    type Output = Fut::Output;
    fn run_test(self, args: TestArgs) -> Self::Output {
        run(
            args,
            |opts| async move {
                let pool = pool_options()
                    .connect_with(opts.clone())
                    .await
                    .map_err(|e| db_err("connecting to", &opts, e))?;
                let conn = pool.acquire().await.map_err(|e| db_err("connecting to", &opts, e))?;
                Ok((conn, Some(pool)))
            },
            self,
        )
    }
}

impl<Fut> TestFn for fn(PgConnection) -> Fut
where
    Fut: Future,
    Fut::Output: TestResult,
{
    type Output = Fut::Output;
    fn run_test(self, args: TestArgs) -> Self::Output {
        run(
            args,
            |opts| async move {
                let conn = PgConnection::connect_with(&opts)
                    .await
                    .map_err(|e| db_err("connecting to", &opts, e))?;
                Ok((conn, None))
            },
            self,
        )
    }
}

impl<Fut> TestFn for fn(PgPoolOptions, PgConnectOptions) -> Fut
where
    Fut: Future,
    Fut::Output: TestResult,
{
    type Output = Fut::Output;
    fn run_test(self, args: TestArgs) -> Self::Output {
        let f = self;
        run(
            args,
            |opts| async move { Ok(((pool_options(), opts), None)) },
            move |(p, o)| f(p, o),
        )
    }
}

impl<Fut> TestFn for fn(PgConnectOptions) -> Fut
where
    Fut: Future,
    Fut::Output: TestResult,
{
    type Output = Fut::Output;
    fn run_test(self, args: TestArgs) -> Self::Output {
        run(args, |opts| async move { Ok((opts, None)) }, self)
    }
}
