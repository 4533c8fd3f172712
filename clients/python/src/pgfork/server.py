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
- ``serve.json``: the started server's URL and token (0600), for the other
  processes; ``serve.out`` and ``serve.log``: its stdout and stderr.
"""

from __future__ import annotations

import fcntl
import json
import os
import secrets
import shutil
import subprocess
import sys
import time
import urllib.parse
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Callable, Iterator, List, NamedTuple, Optional, Sequence

from .client import DEFAULT_URL, Client, PgforkError

START_TIMEOUT = 600.0  # seconds: the first start may install PostgreSQL and runs initdb
BUSY_RETRY = 10.0  # seconds: a server that is stopping may still hold the state directory

Progress = Callable[[str], None]


class Started(NamedTuple):
    """A server started for the run: where it listens and its token."""

    url: str
    token: Optional[str]
    pid: int


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
        return Started(str(d["url"]), d.get("token") or None, int(d.get("pid") or 0))
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _write_record(path: Path, s: Started) -> None:
    tmp = path.with_name(f"{path.name}.tmp-{os.getpid()}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        with os.fdopen(fd, "w") as f:
            json.dump({"url": s.url, "token": s.token, "pid": s.pid}, f)
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
    token given) if nothing answers. With none: the server answering at
    DEFAULT_URL, else the one another process of this run started, else a
    new one on a free loopback port with a random token. A server started
    here runs ``pgfork serve --lease … --json --state-dir DIR [extra_args]``
    and stops by itself once the run's processes have exited (the lease).
    progress gets a line when a server is started and serve's lines about
    installing PostgreSQL while it comes up.
    """
    if url:
        if _reachable(url, token):
            return Started(url, token, 0)
        u = urllib.parse.urlsplit(url)
        host = u.hostname or "127.0.0.1"
        listen = f"[{host}]:{u.port or 80}" if ":" in host else f"{host}:{u.port or 80}"
    else:
        if _healthy(DEFAULT_URL, token):
            return Started(DEFAULT_URL, token, 0)
        listen, token = "127.0.0.1:0", None
    state = default_state_dir()
    state.mkdir(parents=True, exist_ok=True)
    _hold_lease(state / "lease")  # before looking: the server then cannot stop under us
    record = state / "serve.json"
    with _locked(state / "start.lock"):
        rec = _read_record(record)
        if rec and (not url or rec.url == url) and _healthy(rec.url, rec.token):
            return rec
        exe = find_binary()
        started = _start(exe, state, listen, token or secrets.token_hex(16), extra_args, progress)
        _write_record(record, started)
        return started


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
                return Started(url, token, proc.pid)
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


__all__ = ["Started", "server_for_run", "default_state_dir", "find_binary", "PgforkError"]
