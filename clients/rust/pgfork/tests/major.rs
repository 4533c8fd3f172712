//! The PostgreSQL major is the project's (issue 58): `PGFORK_PG` gives the
//! `pgfork serve` the glue starts that major, and a serve of the state
//! directory running another major is not used. This test binary runs
//! itself as a project's test processes (test `probe`, with no server
//! configured): real pgfork serve and PostgreSQL, 15 from the system and 17
//! from the test environment's installs (`PGFORK_TEST_PG_BINS`, see
//! scripts/test-env.sh env). Needs the sqlx feature (clients/rust/test.sh
//! tests with --all-features) and the pgfork binary ($PGFORK_BIN or PATH).
#![cfg(feature = "sqlx")]

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

use sqlx::Connection;

const PROBE: &str = "PGFORK_MAJOR_PROBE";

/// One test process of a project: prints `VERSION`, the server_version of
/// the run's server and `DB` and the template database's name, or `ERROR` and why;
/// with `HOLD` set it then keeps the run going (its lease) until its stdin ends.
#[test]
fn probe() {
    if std::env::var_os(PROBE).is_none() {
        return;
    }
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let line = rt.block_on(async {
        let client = match pgfork::Client::from_env() {
            Ok(c) => c,
            Err(e) => return format!("ERROR {e}"),
        };
        let hash = format!("rsmajor{}", std::process::id());
        let tpl = match client.initialize_template(&hash).await {
            Ok(t) => t,
            Err(e) => return format!("ERROR {e}"),
        };
        let mut conn = sqlx::PgConnection::connect(&tpl.url()).await.unwrap();
        let (v, db): (String, String) =
            sqlx::query_as("SELECT current_setting('server_version'), current_database()::text")
                .fetch_one(&mut conn)
                .await
                .unwrap();
        conn.close().await.unwrap();
        client.discard_template(&hash).await.unwrap();
        format!("VERSION {v} DB {db}")
    });
    println!("{line}");
    if std::env::var_os("HOLD").is_some() {
        let _ = std::io::stdin().lines().count();
    }
}

fn binary() -> PathBuf {
    if let Some(b) = std::env::var_os("PGFORK_BIN").filter(|b| !b.is_empty()) {
        return b.into();
    }
    std::env::split_paths(&std::env::var_os("PATH").unwrap_or_default())
        .map(|d| d.join("pgfork"))
        .find(|p| p.is_file())
        .expect("no pgfork binary: set PGFORK_BIN (clients/test.sh does) or put pgfork on PATH")
}

/// A new directory the postgres OS user can reach (as root the managed
/// PostgreSQL runs as that user), removed on drop.
struct Scratch(PathBuf);

impl Scratch {
    fn new(what: &str) -> Scratch {
        let d = std::env::temp_dir().join(format!(
            "pgfork-rs-{what}-{}-{}",
            std::process::id(),
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .as_nanos()
        ));
        std::fs::create_dir_all(&d).unwrap();
        #[cfg(unix)]
        std::fs::set_permissions(&d, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
        Scratch(d)
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A PGFORK_HOME whose installs/ holds the test environment's build of
/// `major` (a link), as `pgfork pg install` leaves one for a user.
fn home_with_major(major: u32) -> Scratch {
    let bins = std::env::var("PGFORK_TEST_PG_BINS").unwrap_or_default();
    for bin in bins.split(':') {
        let inst = Path::new(bin).parent().unwrap_or(Path::new(""));
        let name = inst.file_name().and_then(|n| n.to_str()).unwrap_or("");
        let in_installs = inst
            .parent()
            .and_then(|p| p.file_name())
            .is_some_and(|n| n == "installs");
        if in_installs && name.split('.').next() == Some(&major.to_string()) {
            let home = Scratch::new("home");
            std::fs::create_dir_all(home.0.join("installs")).unwrap();
            #[cfg(unix)]
            std::os::unix::fs::symlink(inst, home.0.join("installs").join(name)).unwrap();
            return home;
        }
    }
    panic!("no PostgreSQL {major} install in PGFORK_TEST_PG_BINS: run under eval \"$(scripts/test-env.sh env)\"");
}

/// A test process of a project with state directory `state`, PGFORK_HOME
/// `home` and PGFORK_PG `major`.
fn probe_cmd(state: &Path, home: &Path, major: &str) -> Command {
    let mut c = Command::new(std::env::current_exe().unwrap());
    c.args(["--exact", "probe", "--nocapture", "--test-threads=1"])
        .env_remove("PGFORK_URL")
        .env_remove("INTEGRESQL_CLIENT_BASE_URL")
        .env_remove("PGFORK_TOKEN")
        .env_remove("PGFORK_PG_BIN")
        .env("PGFORK_STATE_DIR", state)
        .env("PGFORK_HOME", home)
        .env("PGFORK_BIN", binary())
        .env("PGFORK_PG", major)
        .env(PROBE, "1");
    c
}

/// Its first VERSION or ERROR line, from that word on (the harness may have
/// written "test probe ... " before it); panics, with its output, if it has none.
fn result_line(child: &mut Child) -> String {
    let mut seen = String::new();
    for line in BufReader::new(child.stdout.as_mut().unwrap()).lines() {
        let line = line.unwrap();
        if let Some(i) = line.find("VERSION ").or_else(|| line.find("ERROR ")) {
            return line[i..].to_string();
        }
        seen.push_str(&line);
        seen.push('\n');
    }
    panic!("the test process printed no VERSION or ERROR line:\n{seen}");
}

fn run(mut c: Command) -> String {
    let mut child = c.stdin(Stdio::null()).stdout(Stdio::piped()).spawn().unwrap();
    let line = result_line(&mut child);
    child.wait().unwrap();
    line
}

#[test]
fn pgfork_pg_gives_that_major() {
    if std::env::var_os(PROBE).is_some() {
        return;
    }
    let home = home_with_major(17);
    let state = Scratch::new("state");
    // PGFORK_SERVE_ARGS reaches the started serve too (split as a shell does):
    // its databases are named with this prefix.
    let mut c = probe_cmd(&state.0, &home.0, "17");
    c.env("PGFORK_SERVE_ARGS", "--db-prefix 'rsargs'");
    let line = run(c);
    assert!(line.starts_with("VERSION 17."), "PGFORK_PG=17 gave: {line}");
    assert!(
        line.contains(" DB rsargs"),
        "PGFORK_SERVE_ARGS=--db-prefix rsargs gave: {line}"
    );
}

#[test]
fn serve_of_another_major_is_not_used() {
    if std::env::var_os(PROBE).is_some() {
        return;
    }
    let home = home_with_major(17);
    let state = Scratch::new("state");
    let mut first = probe_cmd(&state.0, &home.0, "15")
        .env("HOLD", "1")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let line = result_line(&mut first);
    let second = if line.starts_with("VERSION 15.") {
        Some(run(probe_cmd(&state.0, &home.0, "17")))
    } else {
        None
    };
    drop(first.stdin.take()); // its stdin ends: it exits, and its serve with it
    first.wait().unwrap();
    assert!(line.starts_with("VERSION 15."), "PGFORK_PG=15 gave: {line}");
    let second = second.unwrap();
    assert!(
        second.starts_with("ERROR ")
            && second.contains("runs PostgreSQL 15.")
            && second.contains("asks for 17")
            && second.contains("PGFORK_STATE_DIR"),
        "a process asking for 17 did not refuse the serve of 15: {second}"
    );
}
