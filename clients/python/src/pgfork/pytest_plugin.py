"""pytest plugin: a fresh, migrated PostgreSQL database per test from `pgfork serve`.

Fixtures: ``pgfork_db`` (a :class:`PgforkDatabase` with ``.url`` and ``.conn``),
``pgfork_conn`` (its psycopg connection), ``pgfork_db_factory`` (more databases,
from any number of templates: ``pgfork_db_factory(migrations="other")``),
``pgfork_client`` and ``pgfork_template`` (session). The default template is
keyed and built by the session fixture ``pgfork_migrator``, a
:class:`pgfork.migrate.Migrator` chosen by ``pgfork_migrator``: ``sql`` (the
default: the *.sql files of ``pgfork_migrations``) or ``alembic``
(:class:`pgfork.alembic.AlembicMigrator` of ``pgfork_alembic_config``); override
it to return your own. Or override ``pgfork_migrate`` to return a callable
``(url) -> None`` that migrates the default template your way (keyed by
``pgfork_migrations``); it wins over ``pgfork_migrator``.

Settings, first found wins: command line (``--pgfork-url`` …), environment
($PGFORK_URL …), ini or pyproject ``[tool.pytest.ini_options]``:
``pgfork_url``, ``pgfork_token``, ``pgfork_migrations`` (relative to the ini
file; on the command line, to the current directory), ``pgfork_extra_key``,
``pgfork_serve_args`` (extra arguments for a server the plugin starts itself),
``pgfork_pg`` (the PostgreSQL major of a server the plugin starts, e.g. 17),
``pgfork_autocommit`` (``.conn``'s mode, default true), ``pgfork_migrator``
(``sql`` or ``alembic``), ``pgfork_alembic_config`` (default ``alembic.ini``,
relative to the ini file) and ``pgfork_alembic_url_env`` (an environment
variable env.py reads the URL from).

Passwords never appear in a failure report (``--pgfork-show-password`` shows
the kept database's URL in full).
"""

from __future__ import annotations

import contextlib
import os
import shlex
import sys
import urllib.parse
import warnings
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Dict, Generator, Iterator, List, Optional, Set

import pytest

from .client import (ApiError, Client, DatabaseConfig, PgforkError, TemplateAlreadyInitialized,
                     TemplateDiscarded, TestDatabase)
from .hashing import StrPath, template_hash
from .migrate import Migrator, SQLFiles, psycopg_module
from .server import pg_major, server_for_run

if TYPE_CHECKING:
    import psycopg

_dbs_key = pytest.StashKey[List["PgforkDatabase"]]()

Migrate = Callable[[str], None]

# Every password this process has seen in a database config; failure reports
# are scrubbed of them.
_passwords: Set[str] = set()


def _remember(config: DatabaseConfig) -> None:
    if config.password:
        _passwords.add(config.password)


def redact(text: str) -> str:
    """text with every database password pgfork handed out in this process
    (plain and URL-encoded) replaced by ``***``."""
    for pw in sorted(_passwords, key=len, reverse=True):
        for form in {pw, urllib.parse.quote(pw, safe=""), urllib.parse.quote_plus(pw)}:
            text = text.replace(form, "***")
    return text


class PgforkDatabase:
    """One test's database: ``url``, ``conninfo``, and a lazily opened
    psycopg connection ``conn`` (autocommit unless configured otherwise);
    ``connect()`` opens more, closed when the test ends."""

    def __init__(self, test_db: TestDatabase, autocommit: bool = True) -> None:
        self.test_database = test_db
        self.id = test_db.id
        self.template_hash = test_db.template_hash
        self.name = test_db.config.database
        self.url = test_db.config.url
        self.conninfo = test_db.config.conninfo
        self.autocommit = autocommit
        self.kept = False
        self._conn: Optional["psycopg.Connection[Any]"] = None
        self._others: List["psycopg.Connection[Any]"] = []
        _remember(test_db.config)

    @property
    def conn(self) -> "psycopg.Connection[Any]":
        """A psycopg connection, opened on first use, in autocommit mode
        unless ``pgfork_autocommit``/``autocommit=False`` says otherwise."""
        if self._conn is None or self._conn.closed:
            self._conn = psycopg_module().connect(self.url, autocommit=self.autocommit)
        return self._conn

    def connect(self, autocommit: Optional[bool] = None) -> "psycopg.Connection[Any]":
        """A new psycopg connection (autocommit as for ``conn`` unless given),
        closed when the test ends."""
        c = psycopg_module().connect(self.url, autocommit=self.autocommit if autocommit is None else autocommit)
        self._others.append(c)
        return c

    @property
    def safe_url(self) -> str:
        """``url`` with the password replaced by ``***``."""
        pw = self.test_database.config.password
        return self.url.replace(":" + urllib.parse.quote(pw, safe="") + "@", ":***@") if pw else self.url

    def close(self) -> None:
        for c in [self._conn, *self._others]:
            if c is not None and not c.closed:
                c.close()
        self._conn = None
        self._others = []

    def __repr__(self) -> str:
        return f"PgforkDatabase({self.name!r}, id={self.id})"


class Template:
    """A built template: its hash and the client that built it."""

    def __init__(self, client: Client, hash: str) -> None:
        self.client = client
        self.hash = hash


class Templates:
    """The templates of this session, each built once (and by one worker
    across xdist workers: the others get 423 and wait on the server)."""

    def __init__(self, client: Client) -> None:
        self.client = client
        self._built: Dict[str, Template] = {}
        self._failed: Dict[str, str] = {}

    def get(self, migrations: Optional[StrPath], extra_key: str = "", migrate: Optional[Migrate] = None) -> Template:
        """The template of migrations + extra_key, built with migrate (default:
        run migrations' *.sql files) if no process has built it. A callable's
        code is not hashed: change extra_key when you change it."""
        if migrate is None:
            return self.get_migrator(SQLFiles(migrations), extra_key)
        return self._get(template_hash(migrations, extra_key), migrate)

    def get_migrator(self, migrator: Migrator, extra_key: str = "") -> Template:
        """The template of migrator + extra_key (migrator.template_hash), built
        with migrator.migrate if no process has built it."""
        try:
            hash = migrator.template_hash(extra_key)
        except Exception as e:
            pytest.fail(f"pgfork: the template key of {migrator!r}: {e}", pytrace=False)
        return self._get(hash, migrator.migrate)

    def _get(self, hash: str, migrate: Migrate) -> Template:
        if hash in self._built:
            return self._built[hash]
        if hash in self._failed:
            pytest.fail(self._failed[hash], pytrace=False)
        try:
            tpl = self.client.initialize_template(hash)
        except TemplateAlreadyInitialized:
            self._built[hash] = Template(self.client, hash)
            return self._built[hash]
        _remember(tpl.config)
        try:
            migrate(tpl.config.url)
        except BaseException as e:
            self.client.discard_template(hash)  # waiters fail at once instead of timing out
            self._failed[hash] = redact(f"pgfork: migrating template {hash} failed: {e}")
            pytest.fail(self._failed[hash], pytrace=False)
        self.client.finalize_template(hash)
        self._built[hash] = Template(self.client, hash)
        return self._built[hash]

    def database(self, request: pytest.FixtureRequest, template: Template, autocommit: bool,
                 readonly: bool) -> Iterator[PgforkDatabase]:
        """A test database from template, given back when the test ends
        (recreated, or unlocked if readonly; kept if the test failed)."""
        try:
            td = self.client.get_test_database(template.hash)
        except TemplateDiscarded as e:
            pytest.fail(f"pgfork: {e} (another worker's migrations probably failed)", pytrace=False)
        _warn_kept(td)
        db = PgforkDatabase(td, autocommit=autocommit)
        request.node.stash.setdefault(_dbs_key, []).append(db)
        try:
            yield db
        finally:
            db.close()
            if not db.kept:
                if readonly:
                    self.client.unlock(td)
                else:
                    self.client.recreate(td)
            else:
                try:  # out of the pool's count; IntegreSQL has no keep
                    self.client.keep(td)
                except ApiError:
                    pass


_kept_warned = False


def _warn_kept(td: TestDatabase) -> None:
    """Show the server's line saying that databases of failed tests pile up,
    once per process (in pytest's warnings summary)."""
    global _kept_warned
    if td.warning and not _kept_warned:
        _kept_warned = True
        warnings.warn(td.warning, UserWarning, stacklevel=2)


_OPTIONS = [
    # (option, ini, environment, help)
    ("--pgfork-url", "pgfork_url", "PGFORK_URL", "pgfork serve base URL (default: a pgfork serve started for the run)"),
    ("--pgfork-token", "pgfork_token", "PGFORK_TOKEN", "Bearer token for pgfork serve"),
    ("--pgfork-migrations", "pgfork_migrations", "",
     "directory hashed into the template key; its *.sql files are run in name order"),
    ("--pgfork-extra-key", "pgfork_extra_key", "", "extra text hashed into the template key (change to rebuild)"),
    ("--pgfork-serve-args", "pgfork_serve_args", "PGFORK_SERVE_ARGS",
     "extra arguments for a `pgfork serve` the plugin starts"),
    ("--pgfork-pg", "pgfork_pg", "PGFORK_PG",
     "PostgreSQL major of a `pgfork serve` the plugin starts, installed if missing (default: the newest on the system)"),
    ("--pgfork-autocommit", "pgfork_autocommit", "", "true (default) or false: the mode of pgfork_db.conn"),
    ("--pgfork-migrator", "pgfork_migrator", "",
     "sql (default: the *.sql files of pgfork_migrations) or alembic (alembic upgrade head)"),
    ("--pgfork-alembic-config", "pgfork_alembic_config", "",
     "with pgfork_migrator = alembic: alembic.ini or a pyproject.toml with [tool.alembic] (default alembic.ini)"),
    ("--pgfork-alembic-url-env", "pgfork_alembic_url_env", "",
     "with pgfork_migrator = alembic: an environment variable env.py reads the database URL from"),
]

_MIGRATORS = ("sql", "alembic")


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("pgfork", "pgfork: a fresh, migrated PostgreSQL database per test")
    for opt, ini, env, help in _OPTIONS:
        where = f" (env {env}; ini {ini})" if env else f" (ini {ini})"
        group.addoption(opt, dest=ini, default=None, help=help + where)
        parser.addini(ini, help + (f" (${env} and {opt} win)" if env else f" ({opt} wins)"), default="")
    group.addoption("--pgfork-show-password", dest="pgfork_show_password", action="store_true", default=False,
                    help="show a kept database's URL with its password in the failure report (default: ***)")


def _setting(config: pytest.Config, ini: str, env: str = "") -> str:
    v = config.getoption(ini, default=None)
    if v:
        return str(v)
    if env and os.environ.get(env):
        return os.environ[env]
    return str(config.getini(ini) or "")


def _bool_setting(config: pytest.Config, ini: str, default: bool) -> bool:
    v = _setting(config, ini).strip().lower()
    if not v:
        return default
    if v in ("1", "true", "yes", "on"):
        return True
    if v in ("0", "false", "no", "off"):
        return False
    raise pytest.UsageError(f"pgfork: {ini} = {v!r}: want true or false")


def _path_setting(config: pytest.Config, ini: str, default: str = "") -> Optional[Path]:
    """A path from the command line (relative to the current directory) or
    the ini file (relative to it)."""
    if config.getoption(ini, default=None):
        return Path(config.getoption(ini)).resolve()
    value = str(config.getini(ini) or "") or default
    if not value:
        return None
    base = config.inipath.parent if config.inipath else config.rootpath
    return (base / value).resolve()


def _migrations_dir(config: pytest.Config) -> Optional[Path]:
    return _path_setting(config, "pgfork_migrations")


def _migrator_name(config: pytest.Config) -> str:
    name = _setting(config, "pgfork_migrator").strip().lower() or "sql"
    if name not in _MIGRATORS:
        raise pytest.UsageError(f"pgfork: pgfork_migrator = {name!r}: want one of {', '.join(_MIGRATORS)}")
    if name == "alembic" and _setting(config, "pgfork_migrations"):
        raise pytest.UsageError("pgfork: pgfork_migrator = alembic takes its migrations from the Alembic config "
                                "(pgfork_alembic_config); pgfork_migrations is set too: remove one")
    return name


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "pgfork_readonly: the test does not write; unlock its database instead of "
                                       "recreating it")
    _bool_setting(config, "pgfork_autocommit", True)  # a bad value is a usage error at once
    try:
        pg_major(_setting(config, "pgfork_pg", "PGFORK_PG"))
    except PgforkError as e:
        raise pytest.UsageError(f"pgfork: {e}") from None
    _migrator_name(config)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Generator[None, Any, None]:
    outcome = yield
    report: pytest.TestReport = outcome.get_result()
    dbs = item.stash.get(_dbs_key, [])
    if report.when == "call" and report.failed:
        show = bool(item.config.getoption("pgfork_show_password", default=False))
        for db in dbs:
            db.kept = True
            report.sections.append(("pgfork", f"test failed: keeping test database {db.name} "
                                              f"(template {db.template_hash}, id {db.id}, "
                                              f"hand-out {db.test_database.token or '-'}) for inspection: "
                                              f"{db.url if show else db.safe_url}"))
    if report.failed and _passwords:
        # The test's own output, assertion values and tracebacks may hold a
        # URL or conninfo: never show the password.
        if report.longrepr is not None:
            text = str(report.longrepr)
            if redact(text) != text:
                report.longrepr = redact(text)
        shown = [db.url for db in dbs] if item.config.getoption("pgfork_show_password", default=False) else []
        report.sections = [(k, v if k == "pgfork" and any(u in v for u in shown) else redact(v))
                           for k, v in report.sections]


def _progress(config: pytest.Config) -> Callable[[str], None]:
    """Writes a line to the terminal past pytest's capture (the wait for a
    server that installs PostgreSQL should not look like a hang)."""
    capman = config.pluginmanager.getplugin("capturemanager")

    def write(line: str) -> None:
        with capman.global_and_fixture_disabled() if capman else contextlib.nullcontext():
            sys.stderr.write(line + "\n")
            sys.stderr.flush()

    return write


@pytest.fixture(scope="session")
def pgfork_client(pytestconfig: pytest.Config) -> Client:
    """A client for the configured server. When none answers, a `pgfork
    serve` is started for the run (shared by xdist workers, stopped when the
    run's processes exit; see pgfork.server)."""
    url = _setting(pytestconfig, "pgfork_url", "PGFORK_URL")
    api_version = None
    if not url:
        url = os.environ.get("INTEGRESQL_CLIENT_BASE_URL", "")
        if url and not url.rstrip("/").endswith("/api/v2"):
            api_version = 1  # IntegreSQL's clients' variable: the server may be IntegreSQL itself
    token = _setting(pytestconfig, "pgfork_token", "PGFORK_TOKEN") or None
    extra = shlex.split(_setting(pytestconfig, "pgfork_serve_args", "PGFORK_SERVE_ARGS"))
    try:
        s = server_for_run(url, token, extra_args=extra, progress=_progress(pytestconfig),
                           major=_setting(pytestconfig, "pgfork_pg", "PGFORK_PG"), project=pytestconfig.rootpath)
    except PgforkError as e:
        pytest.fail(f"pgfork: {e}", pytrace=False)
    return Client(s.url, token=s.token, api_version=api_version)


@pytest.fixture(scope="session")
def pgfork_templates(pgfork_client: Client) -> Templates:
    """This session's templates (see pgfork_db_factory)."""
    return Templates(pgfork_client)


@pytest.fixture(scope="session")
def pgfork_migrate() -> Optional[Migrate]:
    """Override to return a callable that migrates the default template at a
    URL (keyed by pgfork_migrations, not by the callable's code); the default
    (None) lets pgfork_migrator build it."""
    return None


@pytest.fixture(scope="session")
def pgfork_migrator(pytestconfig: pytest.Config) -> Migrator:
    """The Migrator that keys and builds the default template, per the
    pgfork_migrator setting: SQLFiles(pgfork_migrations) (sql, the default)
    or AlembicMigrator(pgfork_alembic_config, url_env=pgfork_alembic_url_env)
    (alembic). Override to return another, e.g.
    ``AlembicMigrator("db/alembic.ini", x_arguments=["tenant=test"])``."""
    if _migrator_name(pytestconfig) == "alembic":
        from .alembic import AlembicMigrator

        path = _path_setting(pytestconfig, "pgfork_alembic_config", "alembic.ini")
        assert path is not None
        try:
            return AlembicMigrator(path, url_env=_setting(pytestconfig, "pgfork_alembic_url_env"))
        except (ImportError, FileNotFoundError) as e:
            pytest.fail(f"pgfork: pgfork_migrator = alembic: {e}", pytrace=False)
    return SQLFiles(_migrations_dir(pytestconfig))


@pytest.fixture(scope="session")
def pgfork_template(pytestconfig: pytest.Config, pgfork_templates: Templates,
                    pgfork_migrate: Optional[Migrate], pgfork_migrator: Migrator) -> Template:
    """The default template (pgfork_migrator, or pgfork_migrate if
    overridden, and pgfork_extra_key), built once across the run (423:
    another worker builds it)."""
    extra = _setting(pytestconfig, "pgfork_extra_key")
    if pgfork_migrate is not None:
        return pgfork_templates.get(_migrations_dir(pytestconfig), extra, pgfork_migrate)
    return pgfork_templates.get_migrator(pgfork_migrator, extra)


@pytest.fixture
def pgfork_db(request: pytest.FixtureRequest, pytestconfig: pytest.Config, pgfork_templates: Templates,
              pgfork_template: Template) -> Iterator[PgforkDatabase]:
    """A fresh database for this test. Recreated after a passing test (unlocked
    with the pgfork_readonly marker); kept, with its URL in the report, after a
    failing one."""
    yield from pgfork_templates.database(request, pgfork_template,
                                         _bool_setting(pytestconfig, "pgfork_autocommit", True),
                                         request.node.get_closest_marker("pgfork_readonly") is not None)


@pytest.fixture
def pgfork_db_factory(request: pytest.FixtureRequest, pytestconfig: pytest.Config,
                      pgfork_templates: Templates) -> Iterator[Callable[..., PgforkDatabase]]:
    """A function that returns a fresh database per call, from the template of
    its arguments (built once per session, like pgfork_db's):

        def test_two(pgfork_db_factory):
            a = pgfork_db_factory(migrations="migrations/app")
            b = pgfork_db_factory(migrations="migrations/audit", autocommit=False)

    Arguments (all keywords but migrations): migrations (a directory, relative
    to the ini file; default pgfork_migrations), extra_key (default
    pgfork_extra_key), migrate (a callable (url) -> None instead of running the
    *.sql files; not hashed), migrator (a Migrator, e.g.
    pgfork.alembic.AlembicMigrator("alembic.ini"), instead of migrations and
    migrate), autocommit (default pgfork_autocommit), readonly (unlock instead
    of recreate after a passing test). With none of migrations, migrate and
    migrator, the template is pgfork_migrator's (as pgfork_db's, unless
    pgfork_migrate is overridden: the factory does not use that).
    Every database is given back, or kept if the test failed, when the test
    ends."""
    gens: List[Iterator[PgforkDatabase]] = []
    base = pytestconfig.inipath.parent if pytestconfig.inipath else pytestconfig.rootpath
    default_autocommit = _bool_setting(pytestconfig, "pgfork_autocommit", True)

    def factory(migrations: Optional[StrPath] = None, *, extra_key: Optional[str] = None,
                migrate: Optional[Migrate] = None, migrator: Optional[Migrator] = None,
                autocommit: Optional[bool] = None, readonly: bool = False) -> PgforkDatabase:
        key = _setting(pytestconfig, "pgfork_extra_key") if extra_key is None else extra_key
        if migrator is not None:
            if migrations is not None or migrate is not None:
                raise TypeError("pgfork_db_factory: give migrator, or migrations and migrate, not both")
        elif migrations is None and migrate is None:
            migrator = request.getfixturevalue("pgfork_migrator")
        if migrator is not None:
            tpl = pgfork_templates.get_migrator(migrator, key)
        else:
            mdir = _migrations_dir(pytestconfig) if migrations is None else (base / Path(migrations)).resolve()
            tpl = pgfork_templates.get(mdir, key, migrate)
        gen = pgfork_templates.database(request, tpl, default_autocommit if autocommit is None else autocommit,
                                        readonly)
        db = next(gen)
        gens.append(gen)
        return db

    try:
        yield factory
    finally:
        for gen in reversed(gens):
            for _ in gen:  # runs its finally: close and give back
                pass


@pytest.fixture
def pgfork_conn(pgfork_db: PgforkDatabase) -> "psycopg.Connection[Any]":
    """The psycopg connection of this test's pgfork_db (autocommit unless
    pgfork_autocommit is false)."""
    return pgfork_db.conn
