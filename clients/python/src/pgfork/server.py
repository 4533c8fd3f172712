"""Start `pgfork serve` for a test run when none answers, once for all the
run's processes (pytest-xdist workers, Django's --parallel workers).

The processes share one server through files in the state directory
(``$PGFORK_STATE_DIR``, else pgfork's own default, so the managed
PostgreSQL and the templates survive from run to run):

- ``lease``: every process that uses the server takes a shared ``flock`` on
  it before anything else and holds it until it exits; the server runs with
  ``--lease`` on it and stops once no process has held it for a second (the
  run ended, or was killed);
- ``start.lock``: taken exclusively while a process looks for the run's
  server or starts it, so only one process starts it;
- ``serve.json``: the token of the server started here, with its pid and
  start time (0600), for the other processes; ``serve.out`` and
  ``serve.log``: its stdout and stderr.

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
import os
import secrets
import shutil
import stat
import subprocess
import sys
import time
import urllib.parse
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Callable, Iterator, List, NamedTuple, Optional, Sequence

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


def default_state_dir() -> Path:
    """Where a started server keeps its state: $PGFORK_STATE_DIR, else
    pgfork's default state directory ($PGFORK_HOME; /var/lib/pgfork as
    root; $XDG_STATE_HOME/pgfork; ~/.local/state/pgfork), the same for every
    run and project, so templates and the managed PostgreSQL are reused."""
    for var in ("PGFORK_STATE_DIR", "PGFORK_HOME"):
        if os.environ.get(var):
            return Path(os.environ[var])
    if os.geteuid() == 0:
        return Path("/var/lib/pgfork")
    if os.environ.get("XDG_STATE_HOME"):
        return Path(os.environ["XDG_STATE_HOME"]) / "pgfork"
    return Path.home() / ".local" / "state" / "pgfork"


def private_state_dir(path: Path) -> Path:
    """path, created if missing (0755: the managed PostgreSQL runs as
    another user when we are root), once it is proven to be this user's
    alone: owned by this user and writable by no one else. Another user's
    directory (say one made first under a shared /tmp) would let them plant
    the records this module trusts; PgforkError says so."""
    path.mkdir(mode=0o755, parents=True, exist_ok=True)  # not group-writable under umask 002
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
        return Started(str(d["url"]), d.get("token") or None, int(d.get("pid") or 0), int(d.get("start") or 0))
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _write_record(path: Path, s: Started) -> None:
    tmp = path.with_name(f"{path.name}.tmp-{os.getpid()}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        with os.fdopen(fd, "w") as f:
            json.dump({"url": s.url, "token": s.token, "pid": s.pid, "start": s.start}, f)
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
                   progress: Progress = _stderr) -> Started:
    """The server this run's tests use.

    With url configured: that server, started there (its host and port, the
    token given) if nothing answers. With none: the pgfork serve holding the
    state directory (``serve_owner``: another process of this run started
    it, or you did), else a new one on a free loopback port with a random
    token. Nothing answering at the default URL is used unless configured.
    A server started here runs ``pgfork serve --lease … --json --state-dir
    DIR [extra_args]`` and stops by itself once the run's processes have
    exited (the lease). progress gets a line when a server is started and
    serve's lines about installing PostgreSQL while it comes up.
    """
    configured = token
    if url:
        if _reachable(url, token):
            return Started(url, token, 0)
        u = urllib.parse.urlsplit(url)
        host = u.hostname or "127.0.0.1"
        listen = f"[{host}]:{u.port or 80}" if ":" in host else f"{host}:{u.port or 80}"
    else:
        listen, token = "127.0.0.1:0", None
    state = private_state_dir(default_state_dir())
    _hold_lease(state / "lease")  # before looking: the server then cannot stop under us
    record = state / "serve.json"
    with _locked(state / "start.lock"):
        own = serve_owner(state)
        if own and (not url or own.url == url.rstrip("/")):
            rec = _read_record(record)
            if rec and (rec.pid, rec.start) == (own.pid, own.start):
                return Started(own.url, rec.token, own.pid, own.start)  # this run's, with its token
            return _answering(own, configured)  # yours: with the token you configured
        exe = find_binary()
        started = _start(exe, state, listen, token or secrets.token_hex(16), extra_args, progress)
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
        progress(f"pgfork: pgfork serve answers at {s.url} ({time.monotonic() - t0:.1f} s)")
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
    url = ""
    deadline = time.monotonic() + START_TIMEOUT
    try:
        while True:
            seen = _relay(log_path, seen, progress, installing)
            if not url:
                url = _listen_url(out_path)
            if url and _healthy(url, token):
                return Started(url, token, proc.pid, _start_time(proc.pid))
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
    try:
        text = out_path.read_text()
    except OSError:
        return ""
    first = text.partition("\n")[0]
    for candidate in (first, text):
        try:
            return f"http://{json.loads(candidate)['listen']}"
        except (ValueError, KeyError, TypeError):
            pass
    return ""


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


__all__ = ["Started", "Owner", "server_for_run", "serve_owner", "private_state_dir", "default_state_dir", "find_binary",
           "PgforkError"]
