//! Rule 3 of docs/SECURITY.md in the crate's test glue (issue 57, G5, G6,
//! G10): with no server configured, a server is used only when proven to be
//! the `pgfork serve` holding the run's state directory; nothing that merely
//! answers on a port is sent a request. The fakes run as another user
//! (nobody), as an attacker on the same host would: this test binary runs
//! itself as a fake (test `fake`) and as a test process of a run (test
//! `child`, which asks for `Client::from_env`). Needs root on Linux.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdout, Command, Stdio};

const FAKE: &str = "PGFORK_TRUST_FAKE";
const CHILD: &str = "PGFORK_TRUST_CHILD";
const NOBODY: u32 = 65534;
const TOKEN: &str = "secret-token-of-the-run";

unsafe extern "C" {
    safe fn geteuid() -> u32;
    safe fn setgroups(n: usize, groups: *const u32) -> i32;
    safe fn setgid(gid: u32) -> i32;
    safe fn setuid(uid: u32) -> i32;
}

/// The fake server (`PGFORK_TRUST_FAKE=PORT[:LOCK[:UID]]`): takes the lock
/// file LOCK (if given), becomes UID (if given), listens on PORT, prints
/// "FAKE port=N", then "FAKE req=…" for every request, answering 200.
#[test]
fn fake() {
    let Ok(spec) = std::env::var(FAKE) else { return };
    let mut parts = spec.split(':');
    let port: u16 = parts.next().unwrap().parse().unwrap();
    let _lock = parts.next().filter(|l| !l.is_empty()).map(|l| {
        let f = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(l)
            .unwrap();
        f.lock().unwrap();
        f
    });
    if let Some(uid) = parts.next().map(|u| u.parse::<u32>().unwrap()) {
        assert_eq!(setgroups(0, std::ptr::null()), 0);
        assert_eq!(setgid(uid), 0);
        assert_eq!(setuid(uid), 0);
    }
    let l = match TcpListener::bind(("127.0.0.1", port)) {
        Ok(l) => l,
        Err(e) => {
            println!("FAKE error={e}");
            return;
        }
    };
    println!("FAKE port={}", l.local_addr().unwrap().port());
    for s in l.incoming() {
        let mut s = s.unwrap();
        let mut buf = [0u8; 4096];
        let n = s.read(&mut buf).unwrap_or(0);
        println!("FAKE req={:?}", String::from_utf8_lossy(&buf[..n]));
        let body = r#"{"status":"ok"}"#;
        let _ = write!(
            s,
            "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
            body.len()
        );
    }
}

/// A test process of a run with no server configured: prints the server
/// `Client::from_env` settles on, or its error.
#[test]
fn child() {
    if std::env::var_os(CHILD).is_none() {
        return;
    }
    match pgfork::Client::from_env() {
        Ok(c) => println!("CHILD url={}", c.base_url()),
        Err(e) => println!("CHILD error={e}"),
    }
}

struct Fake {
    proc: Child,
    out: BufReader<ChildStdout>,
    pid: u32,
    port: u16,
}

impl Fake {
    /// Starts a fake on port (0: any) holding lock, as user (None: as root).
    fn start(port: u16, lock: Option<&Path>, user: Option<u32>) -> Option<Fake> {
        let mut spec = format!("{port}:{}", lock.map(|l| l.display().to_string()).unwrap_or_default());
        if let Some(u) = user {
            spec += &format!(":{u}");
        }
        let mut proc = Command::new(std::env::current_exe().unwrap())
            .args(["--exact", "fake", "--nocapture", "--test-threads=1"])
            .env(FAKE, spec)
            .stdout(Stdio::piped())
            .stdin(Stdio::null())
            .spawn()
            .unwrap();
        let mut out = BufReader::new(proc.stdout.take().unwrap());
        let mut line = String::new();
        while out.read_line(&mut line).unwrap() > 0 {
            // After the harness's "test fake ... " on the same line.
            if let Some((_, p)) = line.trim().split_once("FAKE port=") {
                let pid = proc.id();
                return Some(Fake {
                    port: p.parse().unwrap(),
                    proc,
                    out,
                    pid,
                });
            }
            if line.contains("FAKE error=") {
                break;
            }
            line.clear();
        }
        let _ = proc.kill();
        let _ = proc.wait();
        None
    }

    fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// Stops the fake; the requests it got.
    fn requests(mut self) -> Vec<String> {
        let _ = self.proc.kill();
        let mut rest = String::new();
        let _ = self.out.read_to_string(&mut rest);
        let _ = self.proc.wait();
        rest.lines()
            .filter_map(|l| l.split_once("FAKE req=").map(|(_, r)| r.to_string()))
            .collect()
    }
}

/// What `Client::from_env` of a run with the state directory `state` said
/// (no server configured, no binary to start one).
fn run_child(state: &Path) -> String {
    let o = Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "child", "--nocapture", "--test-threads=1"])
        .env_remove("PGFORK_URL")
        .env_remove("INTEGRESQL_CLIENT_BASE_URL")
        .env_remove("PGFORK_TOKEN")
        .env("PGFORK_STATE_DIR", state)
        .env("PGFORK_BIN", "/nonexistent/pgfork-for-this-test")
        .env(CHILD, "1")
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let out = String::from_utf8_lossy(&o.stdout);
    out.lines()
        .find_map(|l| l.split_once("CHILD ").map(|(_, r)| r))
        .unwrap_or_else(|| panic!("no CHILD line:\n{out}\n{}", String::from_utf8_lossy(&o.stderr)))
        .to_string()
}

const NO_BINARY: &str = "error=pgfork: PGFORK_BIN=/nonexistent/pgfork-for-this-test is not a file";

fn start_time(pid: u32) -> u64 {
    let s = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    s.rsplit_once(')')
        .unwrap()
        .1
        .split_whitespace()
        .nth(19)
        .unwrap()
        .parse()
        .unwrap()
}

/// A fresh state directory, this user's, 0755.
fn state_dir(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("pgfork-trust-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(d.join("locks")).unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&d, std::fs::Permissions::from_mode(0o755)).unwrap();
    d
}

/// What a serve started by the glue leaves: its owner record (as pgfork
/// serve writes it, user `uid`) and the glue's serve.json, naming pid and port.
fn record(state: &Path, pid: u32, port: u16, uid: u32) {
    let start = start_time(pid);
    let owner = format!(r#"{{"pid":{pid},"start":{start},"uid":{uid},"listen":"127.0.0.1:{port}"}}"#);
    std::fs::write(state.join("locks").join("serve.owner"), owner).unwrap();
    let rec = format!(r#"{{"url":"http://127.0.0.1:{port}","token":"{TOKEN}","pid":{pid},"start":{start}}}"#);
    std::fs::write(state.join("serve.json"), rec).unwrap();
}

fn root() -> bool {
    if cfg!(target_os = "linux") && geteuid() == 0 {
        return true;
    }
    let _ = writeln!(
        std::io::stderr(),
        "tests/trust.rs: KNOWN SKIP: the fake servers run as another user (nobody), which takes root on Linux"
    );
    false
}

/// G5: another user's fake at the default URL answers /healthz; the glue
/// must not send it anything (before, it used it as the run's server).
#[test]
fn default_port_never_adopted() {
    if std::env::var_os(FAKE).is_some() || std::env::var_os(CHILD).is_some() || !root() {
        return;
    }
    let Some(fake) = Fake::start(5000, None, Some(NOBODY)) else {
        // Something of this host's holds it: what it is cannot be watched.
        let _ = writeln!(
            std::io::stderr(),
            "default_port_never_adopted: KNOWN SKIP: 127.0.0.1:5000 is taken here"
        );
        return;
    };
    let state = state_dir("default");
    let said = run_child(&state);
    let got = fake.requests();
    let _ = std::fs::remove_dir_all(&state);
    assert!(got.is_empty(), "the glue sent the fake at the default URL: {got:?}");
    assert!(said.starts_with(NO_BINARY), "the glue settled on {said}");
}

/// G10: the records of a serve that is gone name a pid and a port that
/// another user's process holds now (the state directory's lock too): the
/// glue must send it nothing, its token least of all.
#[test]
fn stale_record_never_trusted() {
    if std::env::var_os(FAKE).is_some() || std::env::var_os(CHILD).is_some() || !root() {
        return;
    }
    let state = state_dir("stale");
    let fake = Fake::start(0, Some(&state.join("locks").join("serve.lock")), Some(NOBODY)).unwrap();
    record(&state, fake.pid, fake.port, 0);
    let said = run_child(&state);
    let got = fake.requests();
    let _ = std::fs::remove_dir_all(&state);
    assert!(got.is_empty(), "the glue sent a stale record's port: {got:?}");
    assert!(said.starts_with(NO_BINARY), "the glue settled on {said}");
}

/// The glue's own serve (ours, alive with its start time, holding the lock)
/// is found through its record.
#[test]
fn proven_serve_is_used() {
    if std::env::var_os(FAKE).is_some() || std::env::var_os(CHILD).is_some() || !root() {
        return;
    }
    let state = state_dir("proven");
    let own = Fake::start(0, Some(&state.join("locks").join("serve.lock")), None).unwrap();
    record(&state, own.pid, own.port, 0);
    let url = own.url();
    let said = run_child(&state);
    own.requests();
    let _ = std::fs::remove_dir_all(&state);
    assert_eq!(said, format!("url={url}"));
}

/// G6: a state directory another user owns (made first under a shared
/// directory) or others can write is refused before anything in it is read.
#[test]
fn state_dir_must_be_private() {
    if std::env::var_os(FAKE).is_some() || std::env::var_os(CHILD).is_some() || !root() {
        return;
    }
    use std::os::unix::fs::PermissionsExt;
    for how in ["another user's", "writable by others"] {
        let state = state_dir("private");
        let fake = Fake::start(0, None, Some(NOBODY)).unwrap();
        record(&state, fake.pid, fake.port, 0);
        if how == "another user's" {
            std::os::unix::fs::chown(&state, Some(NOBODY), Some(NOBODY)).unwrap();
        } else {
            std::fs::set_permissions(&state, std::fs::Permissions::from_mode(0o777)).unwrap();
        }
        let said = run_child(&state);
        let got = fake.requests();
        let _ = std::fs::remove_dir_all(&state);
        assert!(got.is_empty(), "{how}: the glue sent a port named there: {got:?}");
        assert!(
            said.contains("is not this user's alone"),
            "{how}: the glue settled on {said}"
        );
    }
}
