"""Rule 3 of docs/SECURITY.md in the Python glue (issue 57, G5, G6, G10): a
server is used only when configured (PGFORK_URL) or proven to be the pgfork
serve holding the run's state directory; nothing that merely answers on a
port is sent a request. The fakes run as another user (nobody), as an
attacker on the same host would."""

from __future__ import annotations

import fcntl
import json
import os
import socket
import subprocess
import sys
from pathlib import Path
from typing import Iterator, List, Optional, Tuple

import pytest

import pgfork.client
import pgfork.server
from pgfork.server import PgforkError, server_for_run

pytestmark = pytest.mark.skipif(
    sys.platform != "linux" or os.geteuid() != 0,
    reason="KNOWN SKIP: the fake servers run as another user (nobody), which takes root on Linux")

NOBODY = 65534

# A fake server: becomes the user argv[2] (if given; its interpreter may sit
# where that user cannot read, so it is started as root and drops), prints its
# port, then every request it gets (as JSON), and answers each 200, as
# pgfork serve's /healthz does.
FAKE = r"""
import json, os, socket, sys
if len(sys.argv) > 2:
    os.setgroups([])
    os.setgid(int(sys.argv[2]))
    os.setuid(int(sys.argv[2]))
s = socket.socket()
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("127.0.0.1", int(sys.argv[1])))
s.listen(16)
print(s.getsockname()[1], flush=True)
while True:
    c, _ = s.accept()
    c.settimeout(10)
    data = b""
    try:
        while b"\r\n\r\n" not in data:
            chunk = c.recv(4096)
            if not chunk:
                break
            data += chunk
    except OSError:
        pass
    print(json.dumps(data.decode(errors="replace")), flush=True)
    body = b'{"status":"ok"}'
    c.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n"
              b"Connection: close\r\n\r\n%s" % (len(body), body))
    c.close()
"""


class Fake:
    """A fake server process: its pid, port, and what it was sent."""

    def __init__(self, port: int = 0, user: Optional[int] = NOBODY, lock: Optional[Path] = None) -> None:
        fds: Tuple[int, ...] = ()
        if lock is not None:  # taken here, held by the fake (the same open file)
            lock.parent.mkdir(parents=True, exist_ok=True)
            fd = os.open(lock, os.O_RDONLY | os.O_CREAT, 0o644)
            fcntl.flock(fd, fcntl.LOCK_EX)
            fds = (fd,)
        args = [sys.executable, "-I", "-S", "-c", FAKE, str(port)] + ([str(user)] if user is not None else [])
        self.proc = subprocess.Popen(args, stdout=subprocess.PIPE, stdin=subprocess.DEVNULL, cwd="/", pass_fds=fds,
                                     text=True)
        for fd in fds:
            os.close(fd)
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if not line.strip():
            self.proc.kill()
            self.proc.wait()
            raise OSError(f"the fake server did not start on port {port}")
        self.port = int(line)
        self.pid = self.proc.pid
        self.url = f"http://127.0.0.1:{self.port}"

    def requests(self) -> List[str]:
        """Stops the fake; what it was sent."""
        self.proc.kill()
        assert self.proc.stdout is not None
        out = self.proc.stdout.read()
        self.proc.wait()
        return [json.loads(line) for line in out.splitlines() if line.strip()]


@pytest.fixture
def glue(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """No server configured, the state directory tmp_path/state (this
    user's, 0755), and no binary: where the glue would start a server of
    its own, it fails with "no binary in this test" instead."""
    state = tmp_path / "state"
    state.mkdir(mode=0o755)
    for k in ("PGFORK_URL", "INTEGRESQL_CLIENT_BASE_URL", "PGFORK_TOKEN", "PGFORK_HOME"):
        monkeypatch.delenv(k, raising=False)
    monkeypatch.setenv("PGFORK_STATE_DIR", str(state))

    def no_binary() -> str:
        raise PgforkError("no binary in this test")

    monkeypatch.setattr(pgfork.server, "find_binary", no_binary)
    yield state


def _start_time(pid: int) -> int:
    data = Path(f"/proc/{pid}/stat").read_bytes()
    return int(data[data.rindex(b")") + 1:].split()[19])


def _record(state: Path, pid: int, port: int, token: str, uid: int = 0) -> None:
    """What a serve started by the glue leaves: its owner record (as pgfork
    serve writes it) and the glue's serve.json, naming pid and port."""
    (state / "locks").mkdir(exist_ok=True)
    (state / "locks" / "serve.owner").write_text(json.dumps(
        {"pid": pid, "start": _start_time(pid), "uid": uid, "listen": f"127.0.0.1:{port}"}))
    rec = {"url": f"http://127.0.0.1:{port}", "token": token, "pid": pid, "start": _start_time(pid)}
    (state / "serve.json").write_text(json.dumps(rec))
    os.chmod(state / "serve.json", 0o600)


def test_default_port_never_adopted(glue: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """G5: another user's fake at the default URL answers /healthz; the glue
    must not send it anything (before, it used it as the run's server)."""
    try:
        fake = Fake(5000)
    except OSError:  # the default port is taken here: the same fake on another, as the default
        fake = Fake(0)
        monkeypatch.setattr(pgfork.client, "DEFAULT_URL", fake.url)
        monkeypatch.setattr(pgfork.server, "DEFAULT_URL", fake.url, raising=False)
    try:
        with pytest.raises(PgforkError, match="no binary in this test"):
            server_for_run("", None, progress=lambda _: None)
    finally:
        got = fake.requests()
    assert got == [], f"the glue sent the fake at the default URL: {got}"


def test_stale_record_never_trusted(glue: Path) -> None:
    """G10: the records of a serve that is gone name a pid and a port that
    another user's process now holds (it even holds the state directory's
    lock): the glue must not send it anything, its token least of all."""
    fake = Fake(0, lock=glue / "locks" / "serve.lock")
    _record(glue, fake.pid, fake.port, "secret-token-of-the-run")
    try:
        with pytest.raises(PgforkError, match="no binary in this test"):
            server_for_run("", None, progress=lambda _: None)
    finally:
        got = fake.requests()
    assert got == [], f"the glue sent a stale record's port: {got}"


def test_proven_serve_is_used(glue: Path) -> None:
    """The glue's own serve (ours, alive with its start time, holding the
    lock) is found through its record, with the token recorded."""
    own = Fake(0, user=None, lock=glue / "locks" / "serve.lock")
    _record(glue, own.pid, own.port, "secret-token-of-the-run")
    try:
        s = server_for_run("", None, progress=lambda _: None)
    finally:
        own.requests()
    assert (s.url, s.token, s.pid) == (own.url, "secret-token-of-the-run", own.pid)


@pytest.mark.parametrize("how", ["another user's", "writable by others"])
def test_state_dir_must_be_private(glue: Path, how: str) -> None:
    """G6: a state directory another user owns (made first under a shared
    directory) or others can write is refused before anything in it is
    read: its records would be theirs."""
    fake = Fake(0)
    _record(glue, fake.pid, fake.port, "secret-token-of-the-run", uid=os.geteuid())
    if how == "another user's":
        os.chown(glue, NOBODY, NOBODY)
    else:
        os.chmod(glue, 0o777)
    try:
        with pytest.raises(PgforkError, match="not this user's alone"):
            server_for_run("", None, progress=lambda _: None)
    finally:
        got = fake.requests()
    assert got == [], f"the glue sent a port named in another user's directory: {got}"
