"""Start `pgfork serve` in the background when none answers, once per test run."""

from __future__ import annotations

import fcntl
import os
import shutil
import signal
import subprocess
import time
import urllib.parse
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator, Optional, Sequence

from .client import Client, PgforkError

START_TIMEOUT = 180.0  # seconds: the first start may initdb a managed cluster


@contextmanager
def _locked(path: Path) -> Iterator[None]:
    with open(path, "a+") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def ensure_server(client: Client, run_dir: Path, binary: Optional[str] = None,
                  extra_args: Sequence[str] = ()) -> bool:
    """Make sure a server answers at client.base_url.

    If none does and a `pgfork` binary is found (binary, else PATH), start
    `pgfork serve --listen HOST:PORT [extra_args]` in the background, recording its pid in
    run_dir/serve.pid; a file lock in run_dir makes parallel workers start it
    only once. Returns False if no server answers and none could be started.
    Raises PgforkError if the started server does not come up.
    """
    if client.reachable():
        return True
    exe = binary or shutil.which("pgfork")
    if not exe:
        return False
    run_dir.mkdir(parents=True, exist_ok=True)
    with _locked(run_dir / "serve.lock"):
        if client.reachable():  # another worker started it meanwhile
            return True
        u = urllib.parse.urlsplit(client.base_url)
        listen = f"{u.hostname or '127.0.0.1'}:{u.port or 80}"
        if ":" in (u.hostname or ""):
            listen = f"[{u.hostname}]:{u.port or 80}"
        args = [exe, "serve", "--listen", listen]
        if client.token:
            args += ["--token", client.token]
        args += list(extra_args)
        log_path = run_dir / "serve.log"
        with open(log_path, "ab") as log:
            proc = subprocess.Popen(args, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                    start_new_session=True)
        (run_dir / "serve.pid").write_text(str(proc.pid))
        deadline = time.monotonic() + START_TIMEOUT
        while time.monotonic() < deadline:
            if client.healthy(timeout=1.0):
                return True
            if proc.poll() is not None:
                break
            time.sleep(0.1)
        tail = log_path.read_text(errors="replace")[-2000:]
        stop_server(run_dir)
        shown = " ".join("***" if client.token and a == client.token else a for a in args)
        raise PgforkError(f"`{shown}` did not come up at {client.masked_base_url}; its output:\n{tail}")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie nobody reaps (PID 1 in a container may not) is dead too
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return True


def stop_server(run_dir: Path, timeout: float = 60.0) -> None:
    """Stop the server ensure_server started in run_dir, if any (SIGTERM, then SIGKILL)."""
    pid_file = run_dir / "serve.pid"
    try:
        pid = int(pid_file.read_text())
    except (OSError, ValueError):
        return
    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        pid_file.unlink(missing_ok=True)
        return
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            done, _ = os.waitpid(pid, os.WNOHANG)  # our child: reap it
            if done == pid:
                break
        except ChildProcessError:  # started by another process (an xdist worker)
            if not _alive(pid):
                break
        time.sleep(0.1)
    else:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    pid_file.unlink(missing_ok=True)


__all__ = ["ensure_server", "stop_server", "PgforkError"]
