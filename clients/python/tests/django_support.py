"""Helpers of the Django tests: run the example project (examples/django_project)
in a subprocess, as a user runs it, against the server in $PGFORK_URL."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import uuid
from collections import defaultdict
from pathlib import Path
from typing import Dict, List, Optional, Tuple

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "django_project"
DB_NAME = re.compile(r"^pgfork_test_[0-9a-f]{32}_\d+$")


def run(args: List[str], cwd: Path, env: Optional[Dict[str, str]] = None) -> subprocess.CompletedProcess:
    """python ARGS in cwd with the test's server settings (and without the
    outer pytest's variables), output captured."""
    e = {k: v for k, v in os.environ.items()
         if not k.startswith(("PYTEST_", "PGFORK_PYTEST_")) and k != "DJANGO_SETTINGS_MODULE"}
    e["PYTHONDONTWRITEBYTECODE"] = "1"
    e.update(env or {})
    return subprocess.run([sys.executable, *args], cwd=cwd, env=e, capture_output=True, text=True, timeout=600)


def copy_example(dst: Path, extra_key: bool = True) -> Path:
    """A copy of the example project; with extra_key, a unique EXTRA_KEY so
    that its templates are its own."""
    shutil.copytree(EXAMPLE, dst, ignore=shutil.ignore_patterns("__pycache__"))
    if extra_key:
        settings = dst / "exampleproject" / "settings.py"
        text = settings.read_text()
        assert '"EXTRA_KEY": "example/1"' in text
        settings.write_text(text.replace('"EXTRA_KEY": "example/1"', f'"EXTRA_KEY": "example/1/{uuid.uuid4().hex}"'))
    return dst


def records(d: Path) -> List[Tuple[int, str, str, str]]:
    """The (pid, test, alias, database) lines the example's tests wrote."""
    out = []
    for f in d.iterdir():
        for line in f.read_text().splitlines():
            pid, test, alias, name = line.split()
            out.append((int(pid), test, alias, name))
    return out


def by_test(recs: List[Tuple[int, str, str, str]]) -> Dict[Tuple[str, str], str]:
    """{(test suffix, alias): database}: the test id's last two parts for
    unittest ids (Class.method), the name for pytest."""
    out = {}
    for _, test, alias, name in recs:
        out[(".".join(test.split(".")[-2:]), alias)] = name
    return out


def pids(recs: List[Tuple[int, str, str, str]]) -> Dict[int, set]:
    out: Dict[int, set] = defaultdict(set)
    for pid, _, _, name in recs:
        out[pid].add(name)
    return out


def template_of(name: str) -> str:
    return name.split("_")[2]


def both(p: subprocess.CompletedProcess) -> str:
    return p.stdout + p.stderr
