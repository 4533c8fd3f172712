"""The Alembic adapter (pgfork.alembic) and the plugin's pgfork_migrator = alembic,
against a real server, with the small project in tests/alembic_project
(3 revisions: accounts, notes, seed)."""

from __future__ import annotations

import logging
import os
import secrets
import shutil
import sys
from pathlib import Path
from typing import Any

import psycopg
import pytest

from pgfork import Client, TemplateDiscarded
from pgfork.alembic import AlembicMigrator, AlembicUpgradeError, sqlalchemy_url

PROJECT = Path(__file__).resolve().parent / "alembic_project"
RUNS_ENV = "PGFORK_TEST_ALEMBIC_RUNS"  # the test project's env.py appends a line per run

BROKEN = '''"""break things

Revision ID: 0004
Revises: 0003
"""
from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute("CREATE TABLE fine (n int)")
    op.execute("THIS IS NOT SQL")


def downgrade() -> None:
    pass
'''


def copy_project(dest: Path) -> Path:
    """A copy of the test project at dest (without bytecode); its alembic.ini."""
    shutil.copytree(PROJECT, dest, ignore=shutil.ignore_patterns("__pycache__"))
    return dest / "alembic.ini"


def unique(name: str) -> str:
    return f"{name}-{secrets.token_hex(8)}"


def runs(path: Path) -> int:
    return len(path.read_text().splitlines()) if path.exists() else 0


def test_template_key(tmp_path: Path) -> None:
    """The key covers env.py, the version files and the options that change
    the upgrade; it ignores bytecode, the URL, the logging sections and
    options only `alembic revision` reads, and where the checkout is."""
    ini = copy_project(tmp_path / "a")
    m = AlembicMigrator(ini)
    path = list(sys.path)
    base = m.template_hash("k")
    assert len(base) == 32 and m.template_hash("k") == base
    assert [name for name, _ in m.files()] == [
        "env.py", "versions/0001_accounts.py", "versions/0002_notes.py", "versions/0003_seed.py"]
    assert AlembicMigrator(copy_project(tmp_path / "b")).template_hash("k") == base, "depends on the checkout's path"
    assert m.template_hash("other") != base
    assert sys.path == path, "hashing left Alembic's prepend_sys_path in sys.path"

    versions = tmp_path / "a" / "migrations" / "versions"
    (versions / "__pycache__").mkdir()
    (versions / "__pycache__" / "0001_accounts.cpython-311.pyc").write_bytes(b"\0bytecode")
    (versions / "0002_notes.pyc").write_bytes(b"\0bytecode")
    text = ini.read_text()
    ini.write_text(text.replace("postgresql+psycopg://user:pass@localhost/dbname", "postgresql://other/db")
                   .replace("file_template = %%(rev)s_%%(slug)s", "file_template = %%(slug)s")
                   .replace("level = WARNING\nhandlers = console", "level = INFO\nhandlers = console"))
    assert m.template_hash("k") == base, "bytecode, sqlalchemy.url, file_template or logging changed the key"

    seen = {base}

    def changed(what: str) -> None:
        h = m.template_hash("k")
        assert h not in seen, what + " did not change the key"
        seen.add(h)

    seed = versions / "0003_seed.py"
    seed.write_text(seed.read_text().replace('"cents": 500', '"cents": 501'))
    changed("a revision's content")
    (versions / "0004_more.py").write_text(BROKEN)
    changed("a new revision")
    env = tmp_path / "a" / "migrations" / "env.py"
    env.write_text(env.read_text() + "\n# changed\n")
    changed("env.py")
    ini.write_text(ini.read_text().replace("[alembic]\n", "[alembic]\ntenant_schema = app\n"))
    changed("an option env.py may read")
    for other in (AlembicMigrator(ini, revision="heads"), AlembicMigrator(ini, x_arguments=["tenant=b"])):
        h = other.template_hash("k")
        assert h not in seen, f"{other!r} has the same key"
        seen.add(h)


def test_url_forms() -> None:
    """pgfork's URL becomes a psycopg 3 SQLAlchemy URL, percent-encoding kept
    through Alembic's config (where % is interpolation)."""
    assert sqlalchemy_url("postgres://u:p%40ss@h:5/d?sslmode=disable") == \
        "postgresql+psycopg://u:p%40ss@h:5/d?sslmode=disable"
    assert sqlalchemy_url("postgresql://u@/d?host=%2Frun") == "postgresql+psycopg://u@/d?host=%2Frun"
    cfg = AlembicMigrator(PROJECT / "alembic.ini")._config("postgresql+psycopg://u:p%40ss%25@h/d")
    assert cfg.get_main_option("sqlalchemy.url") == "postgresql+psycopg://u:p%40ss%25@h/d"
    assert cfg.cmd_opts.x == ["url=postgresql+psycopg://u:p%40ss%25@h/d"]
    with pytest.raises(FileNotFoundError, match="no Alembic config"):
        AlembicMigrator(PROJECT / "missing.ini")


def test_tables_in_test_database(pgfork_db_factory: Any) -> None:
    """Each test database has the project's schema at head, and they are isolated."""
    migrator = AlembicMigrator(PROJECT / "alembic.ini")
    key = unique("alembic-tables")
    a = pgfork_db_factory(migrator=migrator, extra_key=key)
    b = pgfork_db_factory(migrator=migrator, extra_key=key)
    assert a.template_hash == b.template_hash == migrator.template_hash(key)
    assert a.conn.execute("SELECT owner, cents FROM accounts ORDER BY owner").fetchall() == \
        [("alice", 1000), ("bob", 500)]
    assert a.conn.execute("SELECT count(*) FROM notes").fetchone() == (0,)
    assert a.conn.execute("SELECT version_num FROM alembic_version").fetchall() == [("0003",)]
    a.conn.execute("INSERT INTO notes VALUES ('alice', 'hi')")
    assert b.conn.execute("SELECT count(*) FROM notes").fetchone() == (0,)
    with pytest.raises(TypeError):
        pgfork_db_factory(migrator=migrator, migrations="tests/migrations")


ENV_READS = {
    # How env.py gets the URL: from the config (alembic init's env.py), -x url, or an environment variable.
    "config": 'config.get_main_option("sqlalchemy.url")',
    "x": 'context.get_x_argument(as_dictionary=True)["url"]',
    "env": 'os.environ["DATABASE_URL"]',
}


def env_reading(project: Path, source: str) -> None:
    """Makes project's env.py connect to the URL it reads from source (ENV_READS)."""
    env = project / "migrations" / "env.py"
    text = env.read_text()
    old = 'connectable = engine_from_config(config.get_section(config.config_ini_section, {}), prefix="sqlalchemy.",\n' \
          '                                     poolclass=pool.NullPool)'
    assert old in text
    env.write_text(text.replace(old, "from sqlalchemy import create_engine\n"
                                     f"    url = {ENV_READS[source]}\n"
                                     "    assert url.startswith('postgresql+psycopg://'), url\n"
                                     "    assert config.attributes.get('pgfork') is True\n"
                                     "    connectable = create_engine(url, poolclass=pool.NullPool)"))


@pytest.mark.parametrize("source", sorted(ENV_READS))
def test_env_py_url_contract(pgfork_db_factory: Any, tmp_path: Path, source: str) -> None:
    """env.py finds the template's URL where the module documents it; the
    environment variable is set for the upgrade only."""
    ini = copy_project(tmp_path / "p")
    env_reading(tmp_path / "p", source)
    assert "DATABASE_URL" not in os.environ
    db = pgfork_db_factory(migrator=AlembicMigrator(ini, url_env="DATABASE_URL"), extra_key=unique(source))
    assert db.conn.execute("SELECT count(*) FROM accounts").fetchone() == (2,)
    assert "DATABASE_URL" not in os.environ, "the URL variable outlived the upgrade"


def test_failing_revision_names_it(pgfork_client: Client, tmp_path: Path) -> None:
    """A revision that fails: the error names it (id, message, file) and
    PostgreSQL's error; nothing of the upgrade is left (one transaction)."""
    ini = copy_project(tmp_path / "p")
    (tmp_path / "p" / "migrations" / "versions" / "0004_broken.py").write_text(BROKEN)
    m = AlembicMigrator(ini)
    h = m.template_hash(unique("alembic-broken"))
    tpl = pgfork_client.initialize_template(h)
    try:
        with pytest.raises(AlembicUpgradeError) as info:
            m.migrate(tpl.config.url)
        with psycopg.connect(tpl.config.url) as conn:
            assert conn.execute("SELECT to_regclass('accounts')").fetchone() == (None,)
    finally:
        pgfork_client.discard_template(h)
    e = info.value
    assert e.revision == "0004" and e.path == (tmp_path / "p" / "migrations" / "versions" / "0004_broken.py").resolve()
    msg = str(e)
    assert "failed in revision 0004 (migrations/versions/0004_broken.py, 'break things')" in msg, msg
    assert "THIS IS NOT SQL" in msg and "syntax error" in msg, msg


def test_revision_that_does_not_compile(pgfork_client: Client, tmp_path: Path) -> None:
    ini = copy_project(tmp_path / "p")
    bad = tmp_path / "p" / "migrations" / "versions" / "0004_typo.py"
    bad.write_text(BROKEN.replace("def upgrade() -> None:", "def upgrade() -> None"))
    m = AlembicMigrator(ini)
    h = m.template_hash(unique("alembic-typo"))
    tpl = pgfork_client.initialize_template(h)
    try:
        with pytest.raises(AlembicUpgradeError, match=r"failed in a revision \(migrations/versions/0004_typo.py\)"
                                                       r": SyntaxError") as info:
            m.migrate(tpl.config.url)
    finally:
        pgfork_client.discard_template(h)
    assert info.value.path == bad.resolve()


def _plugin_project(pytester: pytest.Pytester, key: str, extra_ini: str = "") -> Path:
    """The test project under db/ of a pytester directory whose ini selects
    the Alembic migrator; the file env.py counts its runs in."""
    copy_project(pytester.path / "db")
    pytester.makeini(f"[pytest]\npgfork_migrator = alembic\npgfork_alembic_config = db/alembic.ini\n"
                     f"pgfork_extra_key = {key}\n{extra_ini}")
    return pytester.path / "runs.txt"


def test_plugin_builds_once_and_rebuilds_on_change(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> None:
    """pgfork_migrator = alembic: tests get the migrated schema; the template is
    built once (two xdist workers, then a second run: env.py does not run
    again); a changed revision builds a new one."""
    runs_file = _plugin_project(pytester, unique("alembic-plugin"))
    monkeypatch.setenv(RUNS_ENV, str(runs_file))
    pytester.makepyfile(
        """
        import os, pytest

        @pytest.mark.parametrize("n", range(4))
        def test_db(pgfork_db, n):
            rows = pgfork_db.conn.execute("SELECT owner, cents FROM accounts ORDER BY owner").fetchall()
            assert rows == [tuple(r.split(":")[0:1] + [int(r.split(":")[1])]) for r in os.environ["WANT"].split()]
            pgfork_db.conn.execute("DELETE FROM accounts WHERE owner = 'bob'")
        """
    )
    monkeypatch.setenv("WANT", "alice:1000 bob:500")
    for args in (["-n", "2"], []):  # two workers, then a second run
        result = pytester.runpytest_subprocess("-p", "no:cacheprovider", *args)
        result.assert_outcomes(passed=4)
    assert runs(runs_file) == 1, "the template was migrated more than once"

    seed = pytester.path / "db" / "migrations" / "versions" / "0003_seed.py"
    seed.write_text(seed.read_text().replace('"cents": 500', '"cents": 7'))
    monkeypatch.setenv("WANT", "alice:1000 bob:7")
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider")
    result.assert_outcomes(passed=4)
    assert runs(runs_file) == 2, "a changed revision did not build a new template"


def test_plugin_failing_revision(pytester: pytest.Pytester, pgfork_client: Client,
                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """A failing revision errors every test with the revision's name, once,
    and the template is discarded."""
    key = unique("alembic-plugin-broken")
    runs_file = _plugin_project(pytester, key)
    monkeypatch.setenv(RUNS_ENV, str(runs_file))
    (pytester.path / "db" / "migrations" / "versions" / "0004_broken.py").write_text(BROKEN)
    pytester.makepyfile("def test_a(pgfork_db):\n    pass\n\ndef test_b(pgfork_db):\n    pass\n")
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider")
    result.assert_outcomes(errors=2)
    result.stdout.fnmatch_lines(["*migrating template*failed: alembic upgrade head failed in revision 0004 "
                                 "(migrations/versions/0004_broken.py, 'break things'): ProgrammingError: *syntax error*"])
    assert runs(runs_file) == 1
    h = AlembicMigrator(pytester.path / "db" / "alembic.ini").template_hash(key)
    with pytest.raises(TemplateDiscarded):
        pgfork_client.get_test_database(h)


def test_plugin_keeps_logging(pytester: pytest.Pytester) -> None:
    """env.py's fileConfig (which disables existing loggers and replaces the
    root's handlers) is undone: the application's loggers still reach caplog.
    (With pgfork_alembic_url_env, to an env.py that reads $DATABASE_URL.)"""
    _plugin_project(pytester, unique("alembic-logging"), "pgfork_alembic_url_env = DATABASE_URL\n")
    env_reading(pytester.path / "db", "env")
    pytester.makepyfile(
        """
        import logging

        log = logging.getLogger("myapp.service")   # exists before the template is built
        handlers = list(logging.getLogger().handlers)

        def test_logs(pgfork_db, caplog):
            assert pgfork_db.conn.execute("SELECT count(*) FROM accounts").fetchone() == (2,)
            assert not log.disabled
            log.warning("still here")
            assert "still here" in caplog.text
            assert not any(type(h).__name__ == "StreamHandler" and h not in handlers
                           for h in logging.getLogger().handlers), logging.getLogger().handlers
        """
    )
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider")
    result.assert_outcomes(passed=1)


def test_plugin_settings(pytester: pytest.Pytester) -> None:
    """Usage errors for an unknown migrator and for pgfork_migrations beside
    alembic; a missing Alembic config fails the tests saying so; a conftest
    can override pgfork_migrator."""
    pytester.makeini("[pytest]\npgfork_migrator = flyway\n")
    pytester.makepyfile("def test_a(pgfork_db):\n    pass\n")
    bad = pytester.runpytest_subprocess("-p", "no:cacheprovider")
    assert bad.ret == pytest.ExitCode.USAGE_ERROR
    bad.stderr.fnmatch_lines(["*pgfork_migrator = 'flyway'*sql, alembic*"])

    pytester.makeini("[pytest]\npgfork_migrator = alembic\npgfork_migrations = m\n")
    both = pytester.runpytest_subprocess("-p", "no:cacheprovider")
    assert both.ret == pytest.ExitCode.USAGE_ERROR
    both.stderr.fnmatch_lines(["*pgfork_migrations is set too*"])

    pytester.makeini("[pytest]\npgfork_migrator = alembic\n")
    missing = pytester.runpytest_subprocess("-p", "no:cacheprovider")
    missing.assert_outcomes(errors=1)
    missing.stdout.fnmatch_lines(["*no Alembic config at*alembic.ini*"])

    copy_project(pytester.path / "elsewhere")
    pytester.makeini(f"[pytest]\npgfork_extra_key = {unique('alembic-override')}\n")
    pytester.makeconftest(
        """
        import pytest
        from pgfork.alembic import AlembicMigrator

        @pytest.fixture(scope="session")
        def pgfork_migrator():
            return AlembicMigrator("elsewhere/alembic.ini")
        """
    )
    pytester.makepyfile(
        "def test_a(pgfork_db):\n"
        "    assert pgfork_db.conn.execute('SELECT count(*) FROM accounts').fetchone() == (2,)\n"
    )
    pytester.runpytest_subprocess("-p", "no:cacheprovider").assert_outcomes(passed=1)


def test_process_state_after_upgrade(tmp_path: Path, pgfork_client: Client) -> None:
    """In this process: logging's levels, handlers and disabled flags as
    before; prepend_sys_path (".") added to sys.path as the project's absolute
    directory, not as "." (which would follow the working directory); the
    working directory unchanged."""
    ini = copy_project(tmp_path / "p")
    m = AlembicMigrator(ini)
    h = m.template_hash(unique("alembic-log"))
    app = logging.getLogger("pgfork-test-app")
    root = logging.getLogger()
    before = (list(root.handlers), root.level, app.disabled, logging.getLogger("alembic").level)
    path, cwd = list(sys.path), os.getcwd()
    tpl = pgfork_client.initialize_template(h)
    try:
        m.migrate(tpl.config.url)
    finally:
        pgfork_client.discard_template(h)
    assert (list(root.handlers), root.level, app.disabled, logging.getLogger("alembic").level) == before
    assert [p for p in sys.path if p not in path] == [str((tmp_path / "p").resolve())]
    assert os.getcwd() == cwd


ASYNC_ENV = """
import asyncio

from alembic import context
from sqlalchemy import pool
from sqlalchemy.ext.asyncio import async_engine_from_config

config = context.config


def migrate(connection):
    context.configure(connection=connection, target_metadata=None)
    with context.begin_transaction():
        context.run_migrations()


async def main():
    engine = async_engine_from_config(config.get_section(config.config_ini_section, {}), prefix="sqlalchemy.",
                                      poolclass=pool.NullPool)
    assert engine.dialect.is_async, engine.dialect
    async with engine.connect() as connection:
        await connection.run_sync(migrate)
    await engine.dispose()


asyncio.run(main())
"""


def test_async_env_py(pgfork_db_factory: Any, tmp_path: Path) -> None:
    """An async env.py (alembic init -t async): the same URL works with
    SQLAlchemy's async psycopg driver."""
    ini = copy_project(tmp_path / "p")
    (tmp_path / "p" / "migrations" / "env.py").write_text(ASYNC_ENV)
    db = pgfork_db_factory(migrator=AlembicMigrator(ini), extra_key=unique("alembic-async"))
    assert db.conn.execute("SELECT version_num FROM alembic_version").fetchall() == [("0003",)]


def test_pyproject_config(pgfork_db_factory: Any, tmp_path: Path) -> None:
    """The config in pyproject.toml's [tool.alembic] instead of alembic.ini;
    its options are hashed as alembic.ini's are."""
    copy_project(tmp_path / "p")
    (tmp_path / "p" / "alembic.ini").unlink()
    toml = tmp_path / "p" / "pyproject.toml"
    toml.write_text('[tool.alembic]\nscript_location = "%(here)s/migrations"\nprepend_sys_path = ["."]\n')
    m = AlembicMigrator(toml)
    key = unique("alembic-toml")
    db = pgfork_db_factory(migrator=m, extra_key=key)
    assert db.conn.execute("SELECT count(*) FROM accounts").fetchone() == (2,)
    before = m.template_hash(key)
    assert db.template_hash == before
    toml.write_text(toml.read_text() + 'tenant = "b"\n')
    assert m.template_hash(key) != before


def test_error_outside_revisions(pgfork_client: Client, tmp_path: Path) -> None:
    """An error in env.py is not blamed on a revision."""
    ini = copy_project(tmp_path / "p")
    env = tmp_path / "p" / "migrations" / "env.py"
    env.write_text("raise RuntimeError('settings module not found')\n")
    m = AlembicMigrator(ini)
    h = m.template_hash(unique("alembic-env"))
    tpl = pgfork_client.initialize_template(h)
    try:
        with pytest.raises(AlembicUpgradeError) as info:
            m.migrate(tpl.config.url)
    finally:
        pgfork_client.discard_template(h)
    assert info.value.revision is None and info.value.path is None
    assert str(info.value) == ("alembic upgrade head failed outside any revision's code (env.py, Alembic or the "
                               "commit): RuntimeError: settings module not found")
