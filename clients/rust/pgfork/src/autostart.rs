//! Starting `pgfork serve` for a test run when no server is configured, once
//! for all the run's test processes.
//!
//! `cargo test` runs one process per test binary, one after another, and has
//! no global teardown. So the processes share one server through files in the
//! state directory (`$PGFORK_STATE_DIR`, else `<target dir>/pgfork`):
//!
//! - `lease`: every process takes a shared `flock` on it before anything else
//!   and holds it until it exits; the server is started with `--lease` on it
//!   and stops once no process has held it for a second (the run is over, or
//!   was killed);
//! - `start.lock`: taken exclusively while a process looks for a running
//!   server or starts one, so only one process starts it;
//! - `serve.json`: the started server's token, pid and start time (0600), for
//!   the next processes; `serve.out` and `serve.log`: its stdout and stderr.
//!
//! The server keeps its state (managed PostgreSQL, templates) in the same
//! directory, so the next run reuses the templates.
//!
//! The PostgreSQL major is the project's: `$PGFORK_PG` (e.g. `17`, set in
//! `.cargo/config.toml`'s `[env]` for every `cargo test`) gives a started
//! server `--pg 17` (serve installs a missing major), and a running serve of
//! the state directory with another major, or one whose major this glue did
//! not record, is not used: the error says how to go on. Unset, serve takes
//! the newest PostgreSQL installed on the system.
//!
//! A server is found one way (docs/SECURITY.md, rule 3): `$PGFORK_URL` (or
//! `$INTEGRESQL_CLIENT_BASE_URL`) when set, with `$PGFORK_TOKEN`; else the
//! `pgfork serve` holding the state directory, proven as pgfork itself
//! proves it ([`serve_owner`]: its record `locks/serve.owner` names a pid
//! that runs as this user with the recorded start time, and it holds
//! `locks/serve.lock`); else a new one. Nothing is sent to a server because
//! it answers on a port: not the default URL, not a port an old record
//! names, which another user may hold by now. The state directory must be
//! this user's and writable by no one else ([`private_dir`]).

use std::fs::{File, OpenOptions};
use std::io::{Read, Seek, SeekFrom, Write};
use std::net::{SocketAddr, TcpStream, ToSocketAddrs};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use crate::env::EnvSettings;
use crate::error::{Error, Result};

/// `EnvSettings::from` of a server started (or joined) by this module.
pub(crate) const FROM_STARTED: &str = "pgfork serve started for this test run";

/// How long a started server may take to answer: its first start may
/// install PostgreSQL and runs initdb.
const START_TIMEOUT: Duration = Duration::from_secs(600);

/// How long to retry while a server that is stopping still holds the state
/// directory.
const BUSY_RETRY: Duration = Duration::from_secs(10);

/// The settings of the environment; when it names no server, those of the
/// `pgfork serve` of this test run: the one holding the state directory
/// ([`serve_owner`]), else one started now. Once per process.
pub(crate) fn env_settings() -> Result<EnvSettings> {
    let env = EnvSettings::read();
    if env.from != "default" {
        return Ok(env);
    }
    static STARTED: OnceLock<std::result::Result<(String, Option<String>), String>> = OnceLock::new();
    match STARTED.get_or_init(|| start_or_join(env.token.clone()).map_err(|e| e.to_string())) {
        Ok((url, token)) => Ok(EnvSettings {
            url: url.clone(),
            from: FROM_STARTED,
            token: token.clone(),
            api_version: None,
        }),
        Err(msg) => Err(Error::ServeStart(msg.clone())),
    }
}

/// What `serve.json` records.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct Record {
    url: String,
    token: String,
    pid: u32,
    /// The pid's start time ([`start_time`]): with it, one process.
    #[serde(default)]
    start: u64,
    /// The PostgreSQL it runs, as its `--json` line says (e.g. "17.11").
    #[serde(default)]
    pg_version: String,
}

/// The PostgreSQL major a started server runs: `$PGFORK_PG`, "" when unset
/// (serve's default: the newest PostgreSQL installed on the system). An
/// error for anything but a major number.
pub(crate) fn pg_major() -> Result<String> {
    let v = std::env::var("PGFORK_PG").unwrap_or_default();
    let v = v.trim();
    let ok = v.is_empty() || (v.len() <= 2 && !v.starts_with('0') && v.bytes().all(|b| b.is_ascii_digit()));
    if !ok {
        return Err(Error::ServeStart(format!(
            "pgfork: PGFORK_PG = {v:?} is not a PostgreSQL major version: give one such as 17"
        )));
    }
    Ok(v.to_string())
}

/// The major of a PostgreSQL version such as "17.11" ("" when unknown).
fn major_of(version: &str) -> &str {
    let end = version.find(|c: char| !c.is_ascii_digit()).unwrap_or(version.len());
    &version[..end]
}

/// What `pgfork serve` records of itself in `<state>/locks/serve.owner`.
#[derive(Debug, Clone, Deserialize)]
pub(crate) struct Owner {
    pid: u32,
    start: u64,
    uid: u32,
    listen: String,
}

impl Owner {
    /// `http://ADDRESS` it listens on (an unspecified host as 127.0.0.1).
    fn url(&self) -> String {
        match self.listen.rsplit_once(':') {
            Some(("" | "0.0.0.0" | "[::]", port)) => format!("http://127.0.0.1:{port}"),
            _ => format!("http://{}", self.listen),
        }
    }
}

/// The run's server and its token: the `pgfork serve` holding the state
/// directory (this run's, with the token it was started with; or yours,
/// with `token`, `$PGFORK_TOKEN`), else one started now.
fn start_or_join(token: Option<String>) -> Result<(String, Option<String>)> {
    let want = pg_major()?;
    let dir = private_dir(&state_dir())?;
    hold_lease(&dir)?;
    let lock_path = dir.join("start.lock");
    let lock = open_rw(&lock_path)?;
    lock.lock()
        .map_err(|e| Error::ServeStart(format!("pgfork: cannot lock {}: {e}", lock_path.display())))?;
    let record_path = dir.join("serve.json");
    if let Some(o) = serve_owner(&dir) {
        let ours = read_record(&record_path).filter(|r| (r.pid, r.start) == (o.pid, o.start));
        if !want.is_empty() && ours.as_ref().is_none_or(|r| major_of(&r.pg_version) != want) {
            let runs = match &ours {
                Some(r) if !r.pg_version.is_empty() => format!("runs PostgreSQL {}", r.pg_version),
                _ => "was not started by this glue, so its PostgreSQL major is not known".to_string(),
            };
            return Err(Error::ServeStart(format!(
                "pgfork: the pgfork serve holding the state directory {} (pid {}) {runs}, and PGFORK_PG asks for \
                 {want}: let the test run that started it end (its serve stops with it), or stop it (kill {}); or \
                 give this run a state directory of its own (PGFORK_STATE_DIR); or set PGFORK_URL to use that server \
                 as it is",
                dir.display(),
                o.pid,
                o.pid
            )));
        }
        if let Some(r) = ours {
            return Ok((o.url(), Some(r.token)));
        }
        return answering(&o).map(|url| (url, token));
    }
    let bin = crate::binary::find(&dir)?;
    let r = start(&bin, &dir, &want)?;
    write_record(&record_path, &r)?;
    drop(lock);
    Ok((r.url, Some(r.token)))
}

/// The URL of `o` (proven yours) once it answers: a serve holds the state
/// directory a moment before it listens.
fn answering(o: &Owner) -> Result<String> {
    let deadline = Instant::now() + START_TIMEOUT;
    let url = o.url();
    while !healthy(&url) {
        if Instant::now() > deadline {
            return Err(Error::ServeStart(format!(
                "pgfork: the pgfork serve holding the state directory (pid {}) does not answer at {url}: \
                 stop it, or set PGFORK_URL (and PGFORK_TOKEN) to a server to use",
                o.pid
            )));
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    Ok(url)
}

/// The `pgfork serve` holding the state directory `dir`, proven as pgfork's
/// `servelock.Find` proves it: its record names a pid that runs as this
/// user (the owner of `/proc/PID`) with the recorded start time, and the
/// state directory's lock is held. None for anything else: no record, a
/// serve killed with -9 (its record stays), a pid another process or user
/// holds now; and outside Linux, where nothing can be proven.
pub(crate) fn serve_owner(dir: &Path) -> Option<Owner> {
    let mut b = Vec::new();
    File::open(dir.join("locks").join("serve.owner"))
        .ok()?
        .take(4096)
        .read_to_end(&mut b)
        .ok()?;
    let o: Owner = serde_json::from_slice(&b).ok()?;
    if o.pid == 0 || o.start == 0 || o.listen.is_empty() || Some(o.uid) != euid() {
        return None;
    }
    // The user first, then the start time: the same process both times.
    if proc_uid(o.pid)? != o.uid || start_time(o.pid)? != o.start {
        return None;
    }
    // Last: the probe takes a free lock for a moment.
    lock_held(&dir.join("locks").join("serve.lock")).then_some(o)
}

#[cfg(unix)]
unsafe extern "C" {
    safe fn geteuid() -> u32;
}

/// This process's effective user id (None outside Unix).
fn euid() -> Option<u32> {
    #[cfg(unix)]
    {
        Some(geteuid())
    }
    #[cfg(not(unix))]
    {
        None
    }
}

/// The user process `pid` runs as: the owner of the directory `/proc/PID`
/// (its effective user id, also when it is not dumpable).
fn proc_uid(pid: u32) -> Option<u32> {
    #[cfg(unix)]
    {
        use std::os::unix::fs::MetadataExt;
        std::fs::metadata(format!("/proc/{pid}")).ok().map(|m| m.uid())
    }
    #[cfg(not(unix))]
    {
        let _ = pid;
        None
    }
}

/// The start time of process `pid` (field 22 of `/proc/PID/stat`, clock
/// ticks since boot); None when unknown (outside Linux).
fn start_time(pid: u32) -> Option<u64> {
    let stat = std::fs::read(format!("/proc/{pid}/stat")).ok()?;
    let after = &stat[stat.iter().rposition(|&c| c == b')')? + 1..];
    std::str::from_utf8(after)
        .ok()?
        .split_whitespace()
        .nth(19)?
        .parse()
        .ok()
}

/// Whether a process holds a lock on `path` (a non-blocking try that fails
/// busy; a free lock is taken and let go at once).
fn lock_held(path: &Path) -> bool {
    let Ok(f) = File::open(path) else { return false };
    matches!(f.try_lock(), Err(std::fs::TryLockError::WouldBlock))
}

/// `dir`, created if missing, once it is proven to be this user's alone:
/// owned by this user and writable by no one else. Another user's directory
/// (one made first under a shared temp directory) would let them plant the
/// records this module trusts.
pub(crate) fn private_dir(dir: &Path) -> Result<PathBuf> {
    let mut b = std::fs::DirBuilder::new();
    b.recursive(true);
    // 0755, not group-writable under a umask of 002.
    #[cfg(unix)]
    std::os::unix::fs::DirBuilderExt::mode(&mut b, 0o755);
    b.create(dir).map_err(|e| {
        Error::ServeStart(format!(
            "pgfork: cannot create the state directory {}: {e}",
            dir.display()
        ))
    })?;
    #[cfg(unix)]
    {
        use std::os::unix::fs::MetadataExt;
        let m = std::fs::metadata(dir).map_err(|e| {
            Error::ServeStart(format!(
                "pgfork: cannot read the state directory {}: {e}",
                dir.display()
            ))
        })?;
        if !m.is_dir() || Some(m.uid()) != euid() || m.mode() & 0o022 != 0 {
            return Err(Error::ServeStart(format!(
                "pgfork: the state directory {} is not this user's alone (owner uid {}, mode {:o}): pgfork keeps \
                 records there it trusts; set PGFORK_STATE_DIR to a directory you own that others cannot write",
                dir.display(),
                m.uid(),
                m.mode() & 0o7777
            )));
        }
    }
    Ok(dir.to_path_buf())
}

/// The state directory: `$PGFORK_STATE_DIR`, else `pgfork` in the cargo
/// target directory the test binary was built in (the ancestor of the
/// executable holding cargo's `CACHEDIR.TAG`), else `pgfork-rust-tests-UID`
/// in the temp directory (per user; [`private_dir`] refuses it if another
/// user made it first).
pub(crate) fn state_dir() -> PathBuf {
    if let Some(d) = std::env::var_os("PGFORK_STATE_DIR").filter(|d| !d.is_empty()) {
        return PathBuf::from(d);
    }
    if let Ok(exe) = std::env::current_exe() {
        for dir in exe.ancestors().skip(1) {
            if dir.join("CACHEDIR.TAG").is_file() {
                return dir.join("pgfork");
            }
        }
    }
    temp_state_dir()
}

/// `pgfork-rust-tests-UID` in the temp directory: one per user, never one
/// another user made first and shares (issue 57, G6).
fn temp_state_dir() -> PathBuf {
    let uid = euid().map(|u| format!("-{u}")).unwrap_or_default();
    std::env::temp_dir().join(format!("pgfork-rust-tests{uid}"))
}

fn open_rw(path: &Path) -> Result<File> {
    let mut o = OpenOptions::new();
    o.read(true).write(true).create(true).truncate(false);
    o.open(path)
        .map_err(|e| Error::ServeStart(format!("pgfork: cannot open {}: {e}", path.display())))
}

/// Takes a shared lock on `dir/lease`, held until the process exits.
fn hold_lease(dir: &Path) -> Result<()> {
    static LEASE: OnceLock<File> = OnceLock::new();
    let path = dir.join("lease");
    let f = open_rw(&path)?;
    f.lock_shared()
        .map_err(|e| Error::ServeStart(format!("pgfork: cannot lock {}: {e}", path.display())))?;
    // Never dropped: the lock goes when the process does.
    let _ = LEASE.set(f);
    Ok(())
}

fn read_record(path: &Path) -> Option<Record> {
    serde_json::from_slice(&std::fs::read(path).ok()?).ok()
}

/// Writes the record beside its place and renames it there (readers never
/// see half of it), readable by this user only: it holds the token.
fn write_record(path: &Path, r: &Record) -> Result<()> {
    let tmp = path.with_extension(format!("json.tmp-{}", std::process::id()));
    let err = |e: std::io::Error| Error::ServeStart(format!("pgfork: cannot write {}: {e}", path.display()));
    let mut o = OpenOptions::new();
    o.write(true).create(true).truncate(true);
    #[cfg(unix)]
    std::os::unix::fs::OpenOptionsExt::mode(&mut o, 0o600);
    let mut f = o.open(&tmp).map_err(err)?;
    let written = f
        .write_all(&serde_json::to_vec(r).expect("a record serializes"))
        .and_then(|_| std::fs::rename(&tmp, path));
    if let Err(e) = written {
        let _ = std::fs::remove_file(&tmp);
        return Err(err(e));
    }
    Ok(())
}

/// 32 hex digits from the system's random source.
fn random_token() -> Result<String> {
    let mut b = [0u8; 16];
    File::open("/dev/urandom")
        .and_then(|mut f| f.read_exact(&mut b))
        .map_err(|e| Error::ServeStart(format!("pgfork: cannot read /dev/urandom for a token: {e}")))?;
    Ok(b.iter().map(|x| format!("{x:02x}")).collect())
}

fn to_stderr(line: &str) {
    // Not eprintln!: the test harness captures that; this is for the person
    // waiting on `cargo test`.
    let _ = writeln!(std::io::stderr().lock(), "{line}");
}

/// Starts `bin serve` on a free loopback port with a new token and waits
/// until it answers. Retried while a server that is stopping still holds
/// the state directory.
fn start(bin: &Path, dir: &Path, major: &str) -> Result<Record> {
    let t0 = Instant::now();
    to_stderr(&format!(
        "pgfork: starting {} serve for this test run (state in {}; it stops when the run's last test process exits)",
        bin.display(),
        dir.display()
    ));
    loop {
        match start_once(bin, dir, major) {
            Err(Busy(_)) if t0.elapsed() < BUSY_RETRY => std::thread::sleep(Duration::from_millis(200)),
            Err(Busy(msg)) | Err(Failed(msg)) => return Err(Error::ServeStart(msg)),
            Ok(r) => {
                let pg = if r.pg_version.is_empty() {
                    String::new()
                } else {
                    format!("PostgreSQL {}, ", r.pg_version)
                };
                to_stderr(&format!(
                    "pgfork: pgfork serve answers at {} ({pg}{:.1} s)",
                    r.url,
                    t0.elapsed().as_secs_f64()
                ));
                return Ok(r);
            }
        }
    }
}

/// The extra arguments for the server the glue starts: `$PGFORK_SERVE_ARGS`
/// split into words as a POSIX shell splits them (quotes and backslashes, no
/// expansions), as the Python, JS and Go glue read it. No secrets there:
/// every local user reads a command line; a password or token goes in the
/// environment, which serve inherits (`PGFORK_PG_URL`, …). The error does
/// not show the value.
fn serve_args() -> std::result::Result<Vec<String>, String> {
    split_serve_args(&std::env::var("PGFORK_SERVE_ARGS").unwrap_or_default())
}

fn split_serve_args(s: &str) -> std::result::Result<Vec<String>, String> {
    shlex::split(s).ok_or_else(|| {
        "pgfork: PGFORK_SERVE_ARGS cannot be split into words (an unclosed quote or a trailing backslash): \
         quote it as for a POSIX shell"
            .to_string()
    })
}

enum StartError {
    /// Another server (stopping) holds the state directory.
    Busy(String),
    Failed(String),
}
use StartError::{Busy, Failed};

fn start_once(bin: &Path, dir: &Path, major: &str) -> std::result::Result<Record, StartError> {
    let out_path = dir.join("serve.out");
    let log_path = dir.join("serve.log");
    let failed = |what: &str, e: std::io::Error| Failed(format!("pgfork: {what}: {e}"));
    let out = File::create(&out_path).map_err(|e| failed(&format!("cannot create {}", out_path.display()), e))?;
    let log = File::create(&log_path).map_err(|e| failed(&format!("cannot create {}", log_path.display()), e))?;
    let token = random_token().map_err(|e| Failed(e.to_string()))?;
    let lease = dir.join("lease");
    let extra = serve_args().map_err(Failed)?;
    let mut cmd = Command::new(bin);
    cmd.arg("serve")
        .arg("--lease")
        .arg(&lease)
        .args(["--listen", "127.0.0.1:0", "--json", "--state-dir"])
        .arg(dir)
        .args(if major.is_empty() { vec![] } else { vec!["--pg", major] })
        .args(&extra)
        // The token through the environment, not the command line (ps shows that).
        .env("PGFORK_TOKEN", &token)
        .stdin(Stdio::null())
        // Files, not pipes: the server outlives this process, and a Go
        // program writing to a closed pipe on stdout or stderr dies of SIGPIPE.
        .stdout(out)
        .stderr(log);
    #[cfg(unix)]
    // A process group of its own: Ctrl-C on one `cargo test` must not stop
    // a server another run in the same target directory shares.
    std::os::unix::process::CommandExt::process_group(&mut cmd, 0);
    let shown = format!(
        "{} serve --lease {} --listen 127.0.0.1:0 --json --state-dir {}{}",
        bin.display(),
        lease.display(),
        dir.display(),
        if major.is_empty() {
            String::new()
        } else {
            format!(" --pg {major}")
        }
    ) + &extra.iter().map(|a| format!(" {a}")).collect::<String>();
    let mut child = cmd.spawn().map_err(|e| failed(&format!("cannot run `{shown}`"), e))?;
    let r = wait_until_answering(&mut child, &shown, &token, &out_path, &log_path);
    if r.is_err() {
        let _ = child.kill();
        let _ = child.wait();
    }
    r
}

/// Waits for the server's JSON line and its /healthz, relaying its lines
/// about installing PostgreSQL to stderr meanwhile.
fn wait_until_answering(
    child: &mut Child,
    shown: &str,
    token: &str,
    out_path: &Path,
    log_path: &Path,
) -> std::result::Result<Record, StartError> {
    let deadline = Instant::now() + START_TIMEOUT;
    let mut log_seen = 0u64;
    let mut installing = false;
    let mut line: Option<(String, String)> = None;
    loop {
        relay_progress(log_path, &mut log_seen, &mut installing);
        if line.is_none() {
            line = serve_line(out_path);
        }
        if let Some((u, pg_version)) = &line
            && healthy(u)
        {
            return Ok(Record {
                url: u.clone(),
                token: token.to_string(),
                pid: child.id(),
                start: start_time(child.id()).unwrap_or(0),
                pg_version: pg_version.clone(),
            });
        }
        if let Ok(Some(status)) = child.try_wait() {
            relay_progress(log_path, &mut log_seen, &mut installing);
            let tail = tail(log_path);
            let msg = format!("pgfork: `{shown}` exited ({status}) before it answered:\n{tail}");
            return Err(if tail.contains("already uses the state directory") {
                Busy(msg)
            } else {
                Failed(msg)
            });
        }
        if Instant::now() > deadline {
            return Err(Failed(format!(
                "pgfork: `{shown}` did not answer within {START_TIMEOUT:?}:\n{}",
                tail(log_path)
            )));
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// The URL of the address serve printed with --json (one line, or one
/// indented object).
#[cfg(test)]
fn listen_url(out_path: &Path) -> Option<String> {
    serve_line(out_path).map(|(url, _)| url)
}

/// `http://ADDRESS` and the PostgreSQL version ("" when serve does not say:
/// an external server, an older pgfork) from serve's `--json` line.
fn serve_line(out_path: &Path) -> Option<(String, String)> {
    #[derive(Deserialize)]
    struct Line {
        listen: String,
        #[serde(default)]
        pg_version: String,
    }
    let text = std::fs::read_to_string(out_path).ok()?;
    let first = text.split_once('\n').map(|(f, _)| f)?;
    let l: Line = serde_json::from_str(first)
        .or_else(|_| serde_json::from_str(&text))
        .ok()?;
    Some((format!("http://{}", l.listen), l.pg_version))
}

/// Writes the server's new log lines about installing PostgreSQL to stderr:
/// from its first line naming an install or a download on, every line (the
/// install's steps: fetching, unpacking, checking).
fn relay_progress(log_path: &Path, seen: &mut u64, installing: &mut bool) {
    let Ok(mut f) = File::open(log_path) else { return };
    if f.seek(SeekFrom::Start(*seen)).is_err() {
        return;
    }
    let mut buf = String::new();
    if f.read_to_string(&mut buf).is_err() {
        return;
    }
    // Only whole lines; a partial one is read again next time.
    let Some(end) = buf.rfind('\n') else { return };
    for line in buf[..end].lines() {
        let l = line.to_lowercase();
        *installing |= l.contains("install") || l.contains("download");
        if *installing {
            to_stderr(&format!("pgfork serve: {}", line.trim_end()));
        }
    }
    *seen += end as u64 + 1;
}

/// The last 2,000 bytes of the server's log.
fn tail(log_path: &Path) -> String {
    let text = std::fs::read_to_string(log_path).unwrap_or_default();
    let mut start = text.len().saturating_sub(2000);
    while !text.is_char_boundary(start) {
        start += 1;
    }
    text[start..].trim().to_string()
}

/// Whether `GET /healthz` at `base_url` (http://host:port) answers 200
/// within a second. Blocking, with no runtime: it runs before any test's.
pub(crate) fn healthy(base_url: &str) -> bool {
    let Ok(u) = reqwest::Url::parse(base_url) else {
        return false;
    };
    let (Some(host), Some(port)) = (u.host_str(), u.port_or_known_default()) else {
        return false;
    };
    if u.scheme() != "http" {
        return false;
    }
    let host = host.trim_start_matches('[').trim_end_matches(']');
    let Some(addr): Option<SocketAddr> = (host, port).to_socket_addrs().ok().and_then(|mut a| a.next()) else {
        return false;
    };
    let timeout = Duration::from_secs(1);
    let Ok(mut s) = TcpStream::connect_timeout(&addr, timeout) else {
        return false;
    };
    let _ = s.set_read_timeout(Some(timeout));
    let _ = s.set_write_timeout(Some(timeout));
    let path = format!("{}/healthz", u.path().trim_end_matches('/'));
    let req = format!("GET {path} HTTP/1.0\r\nHost: {host}:{port}\r\nConnection: close\r\n\r\n");
    if s.write_all(req.as_bytes()).is_err() {
        return false;
    }
    let mut head = [0u8; 16];
    let mut n = 0;
    while n < head.len() {
        match s.read(&mut head[n..]) {
            Ok(0) | Err(_) => break,
            Ok(k) => n += k,
        }
    }
    let status = String::from_utf8_lossy(&head[..n]);
    status.starts_with("HTTP/1.") && status.get(9..12) == Some("200")
}

#[cfg(test)]
mod tests {
    #[test]
    fn serve_args_split_as_a_shell_splits_them() {
        assert_eq!(
            super::split_serve_args(r#"--pool-max 16 --db-prefix "a b" --x='c d'"#).unwrap(),
            ["--pool-max", "16", "--db-prefix", "a b", "--x=c d"]
        );
        assert!(super::split_serve_args("").unwrap().is_empty());
        let err = super::split_serve_args("--db-prefix 'unclosed").unwrap_err();
        assert!(err.contains("PGFORK_SERVE_ARGS") && !err.contains("unclosed'"), "{err}");
    }

    use super::*;

    #[test]
    fn state_dirs_are_per_user_and_private() {
        let uid = euid().unwrap();
        assert!(temp_state_dir().ends_with(format!("pgfork-rust-tests-{uid}")));
        let dir = std::env::temp_dir().join(format!("pgfork-private-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        assert_eq!(private_dir(&dir).unwrap(), dir);
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o757)).unwrap();
        let e = private_dir(&dir).unwrap_err().to_string();
        assert!(e.contains("is not this user's alone") && e.contains("mode 757"), "{e}");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn nothing_listening_is_not_healthy() {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap();
        drop(l);
        assert!(!healthy(&format!("http://{addr}")));
        assert!(!healthy("not a url"));
    }

    #[test]
    fn healthy_wants_a_200_from_healthz() {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap();
        let t = std::thread::spawn(move || {
            let mut seen = Vec::new();
            for answer in ["HTTP/1.1 200 OK\r\n\r\nok", "HTTP/1.1 404 Not Found\r\n\r\n"] {
                let (mut s, _) = l.accept().unwrap();
                let mut buf = [0u8; 512];
                let n = s.read(&mut buf).unwrap();
                seen.push(
                    String::from_utf8_lossy(&buf[..n])
                        .lines()
                        .next()
                        .unwrap_or("")
                        .to_string(),
                );
                s.write_all(answer.as_bytes()).unwrap();
            }
            seen
        });
        assert!(healthy(&format!("http://{addr}")));
        assert!(!healthy(&format!("http://{addr}/")));
        assert_eq!(t.join().unwrap(), ["GET /healthz HTTP/1.0", "GET /healthz HTTP/1.0"]);
    }

    #[test]
    fn progress_lines_about_installing_only_whole_lines() {
        let dir = std::env::temp_dir().join(format!("pgfork-relay-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let log = dir.join("serve.log");
        std::fs::write(&log, "starting\ninstalling PostgreSQL 18.1 (12 MiB)\npartial").unwrap();
        let (mut seen, mut installing) = (0, false);
        relay_progress(&log, &mut seen, &mut installing);
        assert!(installing);
        assert_eq!(seen, "starting\ninstalling PostgreSQL 18.1 (12 MiB)\n".len() as u64);
        let mut f = OpenOptions::new().append(true).open(&log).unwrap();
        f.write_all(b" line\n").unwrap();
        relay_progress(&log, &mut seen, &mut installing);
        assert_eq!(seen, std::fs::metadata(&log).unwrap().len());
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn listen_url_from_the_first_json_line() {
        let dir = std::env::temp_dir().join(format!("pgfork-listen-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let out = dir.join("serve.out");
        std::fs::write(&out, "{\"listen\": \"127.0.0.1:4").unwrap();
        assert_eq!(listen_url(&out), None);
        std::fs::write(&out, "{\"listen\": \"127.0.0.1:41234\", \"socket\": \"\"}\n").unwrap();
        assert_eq!(listen_url(&out).as_deref(), Some("http://127.0.0.1:41234"));
        std::fs::write(&out, "{\n  \"listen\": \"127.0.0.1:41235\"\n}\n").unwrap();
        assert_eq!(listen_url(&out).as_deref(), Some("http://127.0.0.1:41235"));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
