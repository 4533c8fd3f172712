"""Find the `pgfork` binary: the one in this package's wheel, then $PGFORK_BIN, then PATH.

A platform wheel (``pip install pgfork`` on Linux or macOS, x86-64 or arm64)
carries the binary at ``pgfork/_bin/pgfork``; the pure-Python fallback wheel
does not, and then $PGFORK_BIN or a ``pgfork`` on PATH is used. The
``pgfork`` console script this package installs is never taken for the
binary (it only runs the binary found here).
"""

from __future__ import annotations

import os
import shutil
from importlib import resources
from typing import Optional

from .client import PgforkError

ENV = "PGFORK_BIN"

# The marker in the console script pip writes for ``pgfork = "pgfork._cli:main"``.
_OWN_SCRIPT_MARK = b"pgfork._cli"


class BinaryNotFound(PgforkError):
    """No pgfork binary: none bundled, $PGFORK_BIN unset, none on PATH."""


def bundled() -> Optional[str]:
    """The path of the binary inside this package (platform wheels), or None."""
    try:
        p = resources.files(__package__) / "_bin" / "pgfork"
        if p.is_file():
            path = os.fspath(p)  # a real file: wheels are installed unpacked
            if os.access(path, os.X_OK):
                return path
    except (OSError, TypeError, ValueError):
        pass
    return None


def _own_script(path: str) -> bool:
    """True if path is a `pgfork` console script of this package (any venv's):
    running it as the binary would only look for the binary again."""
    try:
        with open(path, "rb") as f:
            head = f.read(4096)
    except OSError:
        return False
    return head.startswith(b"#!") and _OWN_SCRIPT_MARK in head


def find_binary() -> Optional[str]:
    """The pgfork binary to run, or None: the one bundled in this package
    (pgfork/_bin/pgfork), else $PGFORK_BIN (which must be an executable),
    else the first `pgfork` on PATH that is not this package's console script.

    Raises BinaryNotFound when $PGFORK_BIN is set but names no executable.
    """
    b = bundled()
    if b:
        return b
    env = os.environ.get(ENV, "")
    if env:
        if os.path.isfile(env) and os.access(env, os.X_OK):
            return env
        raise BinaryNotFound(f"{ENV}={env} is not an executable file: point it at the pgfork binary, or unset it")
    for d in os.environ.get("PATH", os.defpath).split(os.pathsep):
        p = shutil.which("pgfork", path=d or ".")
        if p and not _own_script(p):
            return p
    return None


def not_found_message() -> str:
    """What to do when find_binary() finds none: names the one install command."""
    return ("no pgfork binary: this pgfork package has none for this platform, PGFORK_BIN is not set and "
            "no `pgfork` is on PATH. Install it with `pip install pgfork` (wheels with the binary exist for "
            "Linux and macOS on x86-64 and arm64); elsewhere put the binary from the release tarball "
            "pgfork-<version>-<os>-<arch>.tar.gz on PATH or set PGFORK_BIN to it")


def require_binary() -> str:
    """find_binary(), or BinaryNotFound naming how to install one."""
    p = find_binary()
    if p is None:
        raise BinaryNotFound(not_found_message())
    return p


__all__ = ["BinaryNotFound", "ENV", "bundled", "find_binary", "not_found_message", "require_binary"]
