"""pytest plugin: a fresh, migrated PostgreSQL database per test from `pgfork serve`.

Fixtures: ``pgfork_db`` (a :class:`PgforkDatabase` with ``.url`` and ``.conn``),
``pgfork_conn`` (its psycopg connection), ``pgfork_client`` and
``pgfork_template`` (session). Override the session fixture ``pgfork_migrate``
to return a callable ``(url) -> None`` that migrates the template your way.

Settings (ini or pyproject ``[tool.pytest.ini_options]``; environment first):
``pgfork_url`` ($PGFORK_URL), ``pgfork_token`` ($PGFORK_TOKEN),
``pgfork_migrations`` (relative to the ini file), ``pgfork_extra_key``,
``pgfork_serve_args`` ($PGFORK_SERVE_ARGS: extra arguments for a server the
plugin starts itself).
"""

from __future__ import annotations

import os
import shlex
import shutil
import tempfile
from pathlib import Path
from typing import Any, Callable, Generator, Iterator, Optional

import psycopg
import pytest

from .client import DEFAULT_URL, Client, TemplateAlreadyInitialized, TemplateDiscarded, TestDatabase
from .hashing import template_hash
from .migrate import run_sql_files
from .server import ensure_server, stop_server

RUN_DIR_ENV = "PGFORK_PYTEST_RUN_DIR"  # shared by the controller and its xdist workers
_owned_run_dir = pytest.StashKey[str]()
_db_key = pytest.StashKey["PgforkDatabase"]()

Migrate = Callable[[str], None]


class PgforkDatabase:
    """One test's database: ``url``, ``conninfo``, and a lazily opened
    autocommit psycopg connection ``conn``."""

    def __init__(self, test_db: TestDatabase) -> None:
        self.test_database = test_db
        self.id = test_db.id
        self.template_hash = test_db.template_hash
        self.name = test_db.config.database
        self.url = test_db.config.url
        self.conninfo = test_db.config.conninfo
        self.kept = False
        self._conn: Optional[psycopg.Connection] = None

    @property
    def conn(self) -> psycopg.Connection:
        if self._conn is None or self._conn.closed:
            self._conn = psycopg.connect(self.url, autocommit=True)
        return self._conn

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    def __repr__(self) -> str:
        return f"PgforkDatabase({self.name!r}, id={self.id})"


class Template:
    """The session's template: its hash and the client that built it."""

    def __init__(self, client: Client, hash: str) -> None:
        self.client = client
        self.hash = hash


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addini("pgfork_url", f"pgfork serve base URL ($PGFORK_URL wins; default {DEFAULT_URL})", default="")
    parser.addini("pgfork_token", "Bearer token for pgfork serve ($PGFORK_TOKEN wins)", default="")
    parser.addini("pgfork_migrations", "directory hashed into the template key; its *.sql files are run in name order",
                  default="")
    parser.addini("pgfork_serve_args", "extra arguments for a `pgfork serve` the plugin starts ($PGFORK_SERVE_ARGS wins)",
                  default="")
    parser.addini("pgfork_extra_key", "extra text hashed into the template key (bump to rebuild)", default="")


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "pgfork_readonly: the test does not write; unlock its database instead of "
                                       "recreating it")
    # The controller (or a run without xdist) owns a run directory that its
    # workers inherit through the environment; a server the plugin starts is
    # recorded there and stopped in pytest_unconfigure.
    if not hasattr(config, "workerinput") and RUN_DIR_ENV not in os.environ:
        d = tempfile.mkdtemp(prefix="pgfork-pytest-")
        os.environ[RUN_DIR_ENV] = d
        config.stash[_owned_run_dir] = d


def pytest_unconfigure(config: pytest.Config) -> None:
    d = config.stash.get(_owned_run_dir, None)
    if d:
        stop_server(Path(d))
        shutil.rmtree(d, ignore_errors=True)
        if os.environ.get(RUN_DIR_ENV) == d:
            del os.environ[RUN_DIR_ENV]


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Generator[None, Any, None]:
    outcome = yield
    report: pytest.TestReport = outcome.get_result()
    db = item.stash.get(_db_key, None)
    if db is not None and report.when == "call" and report.failed:
        db.kept = True
        report.sections.append(("pgfork", f"test failed: keeping test database {db.name} "
                                          f"(template {db.template_hash}, id {db.id}) for inspection: {db.url}"))


def _setting(config: pytest.Config, env: str, ini: str) -> str:
    return os.environ.get(env) or str(config.getini(ini) or "")


@pytest.fixture(scope="session")
def pgfork_client(pytestconfig: pytest.Config) -> Client:
    """A client for the configured server, started in the background if none
    answers and a `pgfork` binary is on PATH."""
    url = _setting(pytestconfig, "PGFORK_URL", "pgfork_url") or os.environ.get("INTEGRESQL_CLIENT_BASE_URL", "")
    client = Client(url or DEFAULT_URL, token=_setting(pytestconfig, "PGFORK_TOKEN", "pgfork_token") or None)
    run_dir = Path(os.environ.get(RUN_DIR_ENV) or tempfile.mkdtemp(prefix="pgfork-pytest-"))
    extra = shlex.split(_setting(pytestconfig, "PGFORK_SERVE_ARGS", "pgfork_serve_args"))
    if not ensure_server(client, run_dir, extra_args=extra):
        msg = (f"no pgfork server answers at {client.base_url} and no `pgfork` binary is on PATH to start one; "
               "run `pgfork serve` or set PGFORK_URL / pgfork_url")
        if url:
            pytest.fail(msg, pytrace=False)
        pytest.skip(msg)
    return client


@pytest.fixture(scope="session")
def pgfork_migrate() -> Optional[Migrate]:
    """Override to return a callable that migrates the template at a URL; the
    default (None) runs the *.sql files of pgfork_migrations."""
    return None


@pytest.fixture(scope="session")
def pgfork_template(pytestconfig: pytest.Config, pgfork_client: Client,
                    pgfork_migrate: Optional[Migrate]) -> Template:
    """Build the template once across the run (423: another worker builds it)."""
    migrations = str(pytestconfig.getini("pgfork_migrations") or "")
    mdir: Optional[Path] = None
    if migrations:
        base = pytestconfig.inipath.parent if pytestconfig.inipath else pytestconfig.rootpath
        mdir = (base / migrations).resolve()
    hash = template_hash(mdir, str(pytestconfig.getini("pgfork_extra_key") or ""))
    try:
        tpl = pgfork_client.initialize_template(hash)
    except TemplateAlreadyInitialized:
        return Template(pgfork_client, hash)
    try:
        if pgfork_migrate is not None:
            pgfork_migrate(tpl.config.url)
        else:
            run_sql_files(tpl.config.url, mdir)
    except BaseException as e:
        pgfork_client.discard_template(hash)  # waiters fail at once instead of timing out
        pytest.fail(f"pgfork: migrating template {hash} failed: {e}", pytrace=False)
    pgfork_client.finalize_template(hash)
    return Template(pgfork_client, hash)


@pytest.fixture
def pgfork_db(request: pytest.FixtureRequest, pgfork_template: Template) -> Iterator[PgforkDatabase]:
    """A fresh database for this test. Recreated after a passing test (unlocked
    with the pgfork_readonly marker); kept, with its URL in the report, after a
    failing one."""
    client = pgfork_template.client
    try:
        td = client.get_test_database(pgfork_template.hash)
    except TemplateDiscarded as e:
        pytest.fail(f"pgfork: {e} (another worker's migrations probably failed)", pytrace=False)
    db = PgforkDatabase(td)
    request.node.stash[_db_key] = db
    try:
        yield db
    finally:
        db.close()
        if not db.kept:
            if request.node.get_closest_marker("pgfork_readonly"):
                client.unlock_test_database(db.template_hash, db.id)
            else:
                client.recreate_test_database(db.template_hash, db.id)


@pytest.fixture
def pgfork_conn(pgfork_db: PgforkDatabase) -> psycopg.Connection:
    """The autocommit psycopg connection of this test's pgfork_db."""
    return pgfork_db.conn
