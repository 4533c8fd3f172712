"""Start `pgfork serve` for a test run when none answers, once for all the
run's processes (pytest-xdist workers, Django's --parallel workers).

The processes share one server through files in the state directory
(``default_state_dir``: ``$PGFORK_STATE_DIR``, ``$PGFORK_HOME``, else the
project's own ``.pgfork``, so the managed PostgreSQL and the templates
survive from run to run and no project shares them with another):

- ``lease``: every process that uses the server takes a shared ``flock`` on
  it before anything else and holds it until it exits; the server runs with
  ``--lease`` on it and stops once no process has held it for a second (the
  run ended, or was killed);
- ``start.lock``: taken exclusively while a process looks for the run's
  server or starts it, so only one process starts it;
- ``serve.json``: the token of the server started here, with its pid, start
  time and PostgreSQL version (0600), for the other processes;
  ``serve.out`` and ``serve.log``: its stdout and stderr.

The PostgreSQL major is the project's (``PGFORK_PG``, ``pg_major``): a
server started here gets ``--pg N`` (serve installs a missing major), and a
running one of another major is not used (``PgforkError`` says how to go on).

A server is found one way (docs/SECURITY.md, rule 3): an explicitly
configured URL, with its token; else the ``pgfork serve`` that holds the
state directory, proven as pgfork itself proves it (``serve_owner``): its
record ``locks/serve.owner`` names a pid that runs as this user with the
recorded start time, and it holds ``locks/serve.lock``. Nothing that merely
answers on a port (the default one, or one a record names) is ever sent a
request. The state directory must be this user's and writable by no one
else (``private_state_dir``).
"""

from __future__ import annotations

import fcntl
import json
import hashlib
import os
import re
import secrets
import shutil
import stat
import subprocess
import sys
import time
import urllib.parse
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Callable, Iterator, List, NamedTuple, Optional, Sequence, Tuple

from .client import Client, PgforkError

START_TIMEOUT = 600.0  # seconds: the first start may install PostgreSQL and runs initdb
BUSY_RETRY = 10.0  # seconds: a server that is stopping may still hold the state directory

Progress = Callable[[str], None]


class Started(NamedTuple):
    """A server started for the run: where it listens and its token."""

    url: str
    token: Optional[str]
    pid: int
    start: int = 0  # the pid's start time (``_start_time``): with pid, one process
    pg_version: str = ""  # the PostgreSQL it runs, e.g. "17.11" ("" when not known)

    @property
    def pg_major(self) -> int:
        """The major of pg_version (0 when not known)."""
        m = re.match(r"(\d+)", self.pg_version)
        return int(m.group(1)) if m else 0


class Owner(NamedTuple):
    """The pgfork serve holding a state directory, as it records itself
    (``locks/serve.owner``)."""

    pid: int
    start: int
    uid: int
    listen: str

    @property
    def url(self) -> str:
        """http://ADDRESS it listens on (an unspecified host as 127.0.0.1)."""
        host, _, port = self.listen.rpartition(":")
        if host in ("", "0.0.0.0", "[::]"):
            host = "127.0.0.1"
        return f"http://{host}:{port}"


def _stderr(line: str) -> None:
    sys.stderr.write(line + "\n")
    sys.stderr.flush()


#: Files that mark a project's root directory (``project_dir``).
PROJECT_MARKERS = ("pyproject.toml", "setup.cfg", "setup.py", "manage.py", "pytest.ini", "tox.ini")


def project_dir(start: Optional[Path] = None) -> Path:
    """The project a run belongs to: the nearest directory at or above start
    (default: the current one) holding one of PROJECT_MARKERS, else start."""
    start = (start or Path.cwd()).resolve()
    for d in (start, *start.parents):
        if any((d / m).is_file() for m in PROJECT_MARKERS):
            return d
    return start


def _user_base() -> Path:
    """pgfork's own per-user state directory, as the CLI picks it."""
    if os.geteuid() == 0:
        return Path("/var/lib/pgfork")
    if os.environ.get("XDG_STATE_HOME"):
        return Path(os.environ["XDG_STATE_HOME"]) / "pgfork"
    return Path.home() / ".local" / "state" / "pgfork"


def _reachable_by_others(path: Path) -> bool:
    """Whether every existing directory from / down to path lets others pass
    (o+x): as root, the managed PostgreSQL runs as the postgres OS user,
    which must reach its data directory below path."""
    for d in (path, *path.parents):
        try:
            if not os.stat(d).st_mode & 0o001:
                return False
        except OSError:
            continue  # not made yet: made 0755
    return True


def default_state_dir(project: Optional[Path] = None) -> Path:
    """Where a started server keeps its state: $PGFORK_STATE_DIR, else
    $PGFORK_HOME, else ``.pgfork`` in the project (``project_dir``; given,
    or found from the current directory), so templates and the managed
    PostgreSQL are reused from run to run and never shared with another
    project. As root, when the postgres OS user cannot reach the project
    (a directory above it without o+x, as /root is), the project's own
    directory under pgfork's: /var/lib/pgfork/projects/NAME-HASH."""
    for var in ("PGFORK_STATE_DIR", "PGFORK_HOME"):
        if os.environ.get(var):
            return Path(os.environ[var])
    proj = project_dir(project)
    if os.geteuid() == 0 and not _reachable_by_others(proj):
        digest = hashlib.sha256(str(proj).encode()).hexdigest()[:12]
        return _user_base() / "projects" / f"{proj.name or 'root'}-{digest}"
    return proj / ".pgfork"


def pg_major(value: Optional[str] = None) -> str:
    """The PostgreSQL major a started server runs: value (a setting such as
    pytest's pgfork_pg), else $PGFORK_PG; "" when neither is set (serve's
    default: the newest PostgreSQL installed on the system, docs in the
    README). PgforkError for anything but a major number."""
    v = (value if value is not None and str(value).strip() else os.environ.get("PGFORK_PG", "")).strip()
    if v and not re.fullmatch(r"[1-9][0-9]?", v):
        raise PgforkError(f"PGFORK_PG (pgfork_pg) = {v!r} is not a PostgreSQL major version: give one such as 17")
    return v


def private_state_dir(path: Path) -> Path:
    """path, created if missing (0755: the managed PostgreSQL runs as
    another user when we are root), once it is proven to be this user's
    alone: owned by this user and writable by no one else. Another user's
    directory (say one made first under a shared /tmp) would let them plant
    the records this module trusts; PgforkError says so."""
    made = not path.exists()
    path.mkdir(mode=0o755, parents=True, exist_ok=True)  # not group-writable under umask 002
    if made and path.name == ".pgfork":  # a project's own: not for version control
        (path / ".gitignore").write_text("# pgfork's state for test runs (pgfork.server)\n*\n")
    st = os.stat(path)
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.geteuid() or st.st_mode & 0o022:
        raise PgforkError(f"the state directory {path} is not this user's alone (owner uid {st.st_uid}, mode "
                          f"{stat.S_IMODE(st.st_mode):o}): pgfork keeps records there it trusts; set "
                          f"PGFORK_STATE_DIR to a directory you own that others cannot write")
    return path


def _start_time(pid: int) -> int:
    """The start time of process pid (field 22 of /proc/PID/stat, clock
    ticks since boot), 0 when unknown (outside Linux: nothing is proven)."""
    try:
        data = Path(f"/proc/{pid}/stat").read_bytes()
        return int(data[data.rindex(b")") + 1:].split()[19])
    except (OSError, ValueError, IndexError):
        return 0


def _lock_held(path: Path) -> bool:
    """Whether a process holds a flock on path (a non-blocking try that
    fails busy; a free lock is taken and let go at once)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    except OSError:
        return False
    finally:
        os.close(fd)
    return False


def serve_owner(state: Path) -> Optional[Owner]:
    """The pgfork serve that holds the state directory, proven as pgfork's
    servelock.Find proves it: its record names a pid that runs as this user
    (the owner of /proc/PID) with the recorded start time, and the state
    directory's lock is held. None for anything else: no record, a serve
    killed with -9 (its record stays), a pid another process or user holds
    now; and outside Linux, where nothing can be proven."""
    try:
        with open(state / "locks" / "serve.owner", "rb") as f:
            d = json.loads(f.read(4096))
        o = Owner(int(d["pid"]), int(d["start"]), int(d["uid"]), str(d["listen"]))
    except (OSError, ValueError, KeyError, TypeError):
        return None
    if o.pid < 1 or o.start == 0 or not o.listen or o.uid != os.geteuid():
        return None
    try:
        if os.stat(f"/proc/{o.pid}").st_uid != o.uid:
            return None
    except OSError:
        return None
    # The user first, then the start time: the same process both times.
    if _start_time(o.pid) != o.start:
        return None
    # Last: the probe takes a free lock for a moment.
    return o if _lock_held(state / "locks" / "serve.lock") else None


def find_binary() -> str:
    """The pgfork binary (pgfork.binary's order: the one in this package's
    wheel, $PGFORK_BIN, PATH); PgforkError saying how to get one if none."""
    try:
        from . import binary
    except ImportError:  # a package without pgfork.binary: $PGFORK_BIN, then PATH
        exe = os.environ.get("PGFORK_BIN") or shutil.which("pgfork")
        if not exe:
            raise PgforkError("no pgfork binary: PGFORK_BIN is not set and no `pgfork` is on PATH; "
                              "install it with `pip install pgfork`") from None
        return exe
    exe = binary.find_binary()
    if not exe:
        raise PgforkError(binary.not_found_message())
    return exe


_lease: List[IO[str]] = []  # the lease files this process holds, until it exits


def _hold_lease(path: Path) -> None:
    """A shared flock on path, held until this process exits (and by the
    children it forks: they share the open file)."""
    for f in _lease:
        if f.name == str(path):
            return
    f = open(path, "a+")
    fcntl.flock(f, fcntl.LOCK_SH)
    _lease.append(f)


@contextmanager
def _locked(path: Path) -> Iterator[None]:
    with open(path, "a+") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def _read_record(path: Path) -> Optional[Started]:
    try:
        d = json.loads(path.read_text())
        return Started(str(d["url"]), d.get("token") or None, int(d.get("pid") or 0), int(d.get("start") or 0),
                       str(d.get("pg_version") or ""))
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _write_record(path: Path, s: Started) -> None:
    tmp = path.with_name(f"{path.name}.tmp-{os.getpid()}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        with os.fdopen(fd, "w") as f:
            json.dump({"url": s.url, "token": s.token, "pid": s.pid, "start": s.start, "pg_version": s.pg_version}, f)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def _healthy(url: str, token: Optional[str] = None) -> bool:
    try:
        return Client(url, token=token).healthy(timeout=1.0)
    except PgforkError:
        return False


def _reachable(url: str, token: Optional[str]) -> bool:
    """Anything answers HTTP at url (IntegreSQL has no /healthz)."""
    try:
        return Client(url, token=token).reachable(timeout=1.0)
    except PgforkError:
        return False


def server_for_run(url: str = "", token: Optional[str] = None, extra_args: Sequence[str] = (),
                   progress: Progress = _stderr, major: Optional[str] = None,
                   project: Optional[Path] = None) -> Started:
    """The server this run's tests use.

    With url configured: that server as it is if it answers, else one
    started there (its host and port, the token given). With none: the
    pgfork serve holding the state directory (``default_state_dir`` of
    project: ``serve_owner``, another process of this run started it, or
    you did), else a new one on a free loopback port with a random token.
    Nothing answering at the default URL is used unless configured. A
    server started here runs ``pgfork serve --lease … --json --state-dir DIR
    [--pg MAJOR] [extra_args]`` and stops by itself once the run's
    processes have exited (the lease). major (``pg_major``: else
    $PGFORK_PG) is the PostgreSQL major it runs, installed by serve when
    missing; a running serve of another major, or one whose major this glue
    did not record, is not used: PgforkError says how to go on. progress
    gets a line when a server is started (with its PostgreSQL) and serve's
    lines about installing PostgreSQL while it comes up.
    """
    want = pg_major(major)
    configured = token
    if url:
        if _reachable(url, token):
            return Started(url, token, 0)
        u = urllib.parse.urlsplit(url)
        host = u.hostname or "127.0.0.1"
        listen = f"[{host}]:{u.port or 80}" if ":" in host else f"{host}:{u.port or 80}"
    else:
        listen, token = "127.0.0.1:0", None
    state = private_state_dir(default_state_dir(project))
    _hold_lease(state / "lease")  # before looking: the server then cannot stop under us
    record = state / "serve.json"
    with _locked(state / "start.lock"):
        own = serve_owner(state)
        if own and (not url or own.url == url.rstrip("/")):
            rec = _read_record(record)
            ours = rec is not None and (rec.pid, rec.start) == (own.pid, own.start)
            if want and not (ours and rec is not None and str(rec.pg_major) == want):
                got = f"runs PostgreSQL {rec.pg_version}" if ours and rec and rec.pg_version else \
                    "was not started by this glue, so its PostgreSQL major is not known"
                raise PgforkError(
                    f"the pgfork serve holding the state directory {state} (pid {own.pid}) {got}, and PGFORK_PG "
                    f"(pgfork_pg) asks for {want}: let the test run that started it end (its serve stops with "
                    f"it), or stop it (kill {own.pid}); or give this run a state directory of its own "
                    f"(PGFORK_STATE_DIR); or set PGFORK_URL to use that server as it is")
            if ours and rec is not None:
                return Started(own.url, rec.token, own.pid, own.start, rec.pg_version)  # this run's, with its token
            return _answering(own, configured)  # yours: with the token you configured
        exe = find_binary()
        args = [*(["--pg", want] if want else []), *extra_args]
        started = _start(exe, state, listen, token or secrets.token_hex(16), args, progress)
        _write_record(record, started)
        return started


def _answering(own: Owner, token: Optional[str]) -> Started:
    """own (proven yours) once it answers: a serve may hold the state
    directory a moment before it listens."""
    deadline = time.monotonic() + START_TIMEOUT
    while not _healthy(own.url, token):
        if time.monotonic() > deadline:
            raise PgforkError(f"the pgfork serve holding the state directory (pid {own.pid}) does not answer at "
                              f"{own.url}: stop it, or set PGFORK_URL (and PGFORK_TOKEN) to a server to use")
        time.sleep(0.1)
    return Started(own.url, token, own.pid, own.start)


class _Busy(PgforkError):
    """Another server (stopping) still holds the state directory."""


def _start(exe: str, state: Path, listen: str, token: str, extra_args: Sequence[str],
           progress: Progress) -> Started:
    t0 = time.monotonic()
    progress(f"pgfork: starting {exe} serve for this test run (state in {state}; it stops when the run ends)")
    while True:
        try:
            s = _start_once(exe, state, listen, token, extra_args, progress)
        except _Busy:
            if time.monotonic() - t0 < BUSY_RETRY:
                time.sleep(0.2)
                continue
            raise
        pg = f"PostgreSQL {s.pg_version}, " if s.pg_version else ""
        progress(f"pgfork: pgfork serve answers at {s.url} ({pg}{time.monotonic() - t0:.1f} s)")
        return s


def _start_once(exe: str, state: Path, listen: str, token: str, extra_args: Sequence[str],
                progress: Progress) -> Started:
    lease = state / "lease"
    args = [exe, "serve", "--lease", str(lease), "--listen", listen, "--json", "--state-dir", str(state),
            *extra_args]
    out_path, log_path = state / "serve.out", state / "serve.log"
    env = {**os.environ, "PGFORK_TOKEN": token}  # not on the command line, which ps shows
    # Files, not pipes: the server outlives this process, and a Go program
    # writing to a closed pipe on stdout or stderr dies of SIGPIPE. A session
    # of its own: Ctrl-C reaches the run's processes, and the lease stops it.
    with open(out_path, "wb") as out, open(log_path, "wb") as log:
        proc = subprocess.Popen(args, stdin=subprocess.DEVNULL, stdout=out, stderr=log, env=env,
                                start_new_session=True)
    shown = " ".join(args)
    seen = 0
    installing = [False]
    url, version = "", ""
    deadline = time.monotonic() + START_TIMEOUT
    try:
        while True:
            seen = _relay(log_path, seen, progress, installing)
            if not url:
                url, version = _listen_line(out_path)
            if url and _healthy(url, token):
                return Started(url, token, proc.pid, _start_time(proc.pid), version)
            if proc.poll() is not None:
                _relay(log_path, seen, progress, installing)
                tail = log_path.read_text(errors="replace")[-2000:].strip()
                err = _Busy if "already uses the state directory" in tail else PgforkError
                raise err(f"`{shown}` exited ({proc.returncode}) before it answered; its output:\n{tail}")
            if time.monotonic() > deadline:
                tail = log_path.read_text(errors="replace")[-2000:].strip()
                raise PgforkError(f"`{shown}` did not answer within {START_TIMEOUT:.0f} s; its output:\n{tail}")
            time.sleep(0.05)
    except BaseException:
        if proc.poll() is None:
            proc.kill()
        proc.wait()
        raise


def _listen_url(out_path: Path) -> str:
    """http://ADDRESS from the JSON serve printed with --json (one line, or
    one indented object)."""
    return _listen_line(out_path)[0]


def _listen_line(out_path: Path) -> Tuple[str, str]:
    """(http://ADDRESS, PostgreSQL version) from the JSON serve printed with
    --json (one line, or one indented object); the version is "" when serve
    does not say (an external server, an older pgfork)."""
    try:
        text = out_path.read_text()
    except OSError:
        return "", ""
    first = text.partition("\n")[0]
    for candidate in (first, text):
        try:
            d = json.loads(candidate)
            return f"http://{d['listen']}", str(d.get("pg_version") or "")
        except (ValueError, KeyError, TypeError, AttributeError):
            pass
    return "", ""


def _relay(log_path: Path, seen: int, progress: Progress, installing: List[bool]) -> int:
    """Passes serve's new whole lines about installing PostgreSQL to progress:
    from its first line naming an install or a download on, every line (the
    install's steps). Returns the offset read up to."""
    try:
        with open(log_path, "rb") as f:
            f.seek(seen)
            data = f.read()
    except OSError:
        return seen
    end = data.rfind(b"\n")
    if end < 0:
        return seen
    for line in data[:end].decode(errors="replace").splitlines():
        low = line.lower()
        if "install" in low or "download" in low:
            installing[0] = True
        if installing[0]:
            progress(f"pgfork serve: {line.rstrip()}")
    return seen + end + 1


__all__ = ["Started", "Owner", "server_for_run", "serve_owner", "private_state_dir", "default_state_dir", "project_dir",
           "pg_major", "find_binary", "PgforkError"]
