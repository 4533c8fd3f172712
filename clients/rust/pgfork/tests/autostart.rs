//! A `pgfork serve` started for the run when no server is configured: this
//! test binary runs itself as the run's test processes (test `child`, with
//! PGFORK_URL unset), two at once and then one more, as `cargo test` runs
//! test binaries, and checks that they share one server, that it stops when
//! they have exited (also when one is killed), and that the next run reuses
//! the template. Needs the pgfork binary: $PGFORK_BIN or PATH.

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use pgfork::{Client, ensure_template, template_hash};

const CHILD: &str = "PGFORK_AUTOSTART_CHILD";

/// One test process of a run: a template (its extra key from the parent) and a database.
#[test]
fn child() {
    let Ok(key) = std::env::var(CHILD) else { return };
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let client = Client::from_env().unwrap();
        let hash = template_hash(None, &key).unwrap();
        let tpl = ensure_template(&client, &hash, |_tpl| async { Ok::<_, String>(()) })
            .await
            .unwrap();
        let db = tpl.database().await.unwrap();
        if std::env::var_os("HANG").is_some() {
            println!("CHILD ready built={}", tpl.built);
            std::thread::sleep(Duration::from_secs(600));
        }
        db.recreate().await.unwrap();
        println!("CHILD url={} built={}", client.base_url(), tpl.built);
    });
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

fn child_cmd(state: &Path, bin: &Path, key: &str) -> Command {
    let mut c = Command::new(std::env::current_exe().unwrap());
    c.args(["--exact", "child", "--nocapture", "--test-threads=1"])
        .env_remove("PGFORK_URL")
        .env_remove("INTEGRESQL_CLIENT_BASE_URL")
        .env_remove("PGFORK_TOKEN")
        .env("PGFORK_STATE_DIR", state)
        .env("PGFORK_BIN", bin)
        .env(CHILD, key)
        .stdin(Stdio::null());
    c
}

/// (url, built) of a child's output.
fn parsed(o: &Output) -> (String, bool) {
    let out = String::from_utf8_lossy(&o.stdout);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "child failed: {}\n{out}\n{err}", o.status);
    let line = out
        .lines()
        .find_map(|l| l.split_once("CHILD url=").map(|(_, rest)| rest))
        .unwrap_or_else(|| panic!("no CHILD line in:\n{out}\n{err}"));
    let (url, built) = line.split_once(" built=").unwrap();
    (url.to_string(), built == "true")
}

#[derive(serde::Deserialize)]
struct Record {
    url: String,
    pid: u32,
}

fn record(state: &Path) -> Record {
    serde_json::from_slice(&std::fs::read(state.join("serve.json")).unwrap()).unwrap()
}

fn alive(pid: u32) -> bool {
    // Not our child: a zombie nobody reaps (PID 1 in a container may not) is gone too.
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(s) => s
            .rsplit_once(')')
            .is_some_and(|(_, rest)| !rest.trim_start().starts_with('Z')),
        Err(_) => false,
    }
}

/// Seconds until `pid` was gone; panics after `limit`.
fn gone_within(pid: u32, limit: Duration) -> f64 {
    let t0 = Instant::now();
    while alive(pid) {
        assert!(
            t0.elapsed() < limit,
            "pgfork serve (pid {pid}) still runs {limit:?} after the run's processes exited"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    t0.elapsed().as_secs_f64()
}

fn say(line: &str) {
    // Past the test harness's capture: shown in clients/test.sh's log.
    use std::io::Write;
    let _ = writeln!(std::io::stderr().lock(), "{line}");
}

#[test]
fn one_server_per_run_stopped_after_it() {
    if std::env::var_os(CHILD).is_some() {
        return;
    }
    let bin = binary();
    let help = Command::new(&bin).args(["serve", "--help"]).output().unwrap();
    if !String::from_utf8_lossy(&help.stdout).contains("--lease") {
        say(
            "test one_server_per_run_stopped_after_it: KNOWN SKIP: this pgfork serve has no --lease yet (helper servelife adds it)",
        );
        return;
    }
    // Not in the checkout (it may sit in a private home): as root the managed
    // PostgreSQL runs as an unprivileged user that must reach its state.
    let state = std::env::temp_dir().join(format!("pgfork-autostart-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&state);
    std::fs::create_dir_all(&state).unwrap();
    #[cfg(unix)]
    std::fs::set_permissions(&state, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let key = format!("autostart {} {:?}", std::process::id(), Instant::now());

    // A run: two test binaries at once (cargo runs them one after another;
    // at once is the harder case), one server.
    let a = child_cmd(&state, &bin, &key)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let b = child_cmd(&state, &bin, &key)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let (oa, ob) = (a.wait_with_output().unwrap(), b.wait_with_output().unwrap());
    let ((ua, ba), (ub, bb)) = (parsed(&oa), parsed(&ob));
    assert_eq!(ua, ub, "the two processes used different servers");
    assert!(ba != bb, "the template was built {} times", ba as u8 + bb as u8);
    let rec = record(&state);
    assert_eq!(rec.url, ua);
    assert_ne!(rec.url, pgfork::DEFAULT_URL);
    let starts = [&oa, &ob]
        .iter()
        .filter(|o| String::from_utf8_lossy(&o.stderr).contains("pgfork: starting "))
        .count();
    assert_eq!(starts, 1, "serve started {starts} times");
    say(&format!(
        "autostart: serve exited {:.2} s after the run",
        gone_within(rec.pid, Duration::from_secs(30))
    ));

    // The next run, killed while a test holds its database: the server goes
    // too. It found the template of the first run's server.
    let mut c = child_cmd(&state, &bin, &key)
        .env("HANG", "1")
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut out = c.stdout.take().unwrap();
    let mut seen = String::new();
    let t0 = Instant::now();
    while !seen.contains("CHILD ready built=") || !seen.ends_with('\n') {
        assert!(
            t0.elapsed() < Duration::from_secs(120),
            "the second run did not get a database"
        );
        let mut buf = [0u8; 256];
        let n = std::io::Read::read(&mut out, &mut buf).unwrap();
        assert!(n > 0, "the second run ended early: {seen}");
        seen += &String::from_utf8_lossy(&buf[..n]);
    }
    let second = record(&state);
    assert_ne!(second.pid, rec.pid, "the second run found the first run's server");
    c.kill().unwrap();
    c.wait().unwrap();
    assert!(
        seen.contains("CHILD ready built=false"),
        "the second run built the template again: {seen}"
    );
    say(&format!(
        "autostart: serve exited {:.2} s after the test process was killed",
        gone_within(second.pid, Duration::from_secs(30))
    ));
    let _ = std::fs::remove_dir_all(&state);
}
