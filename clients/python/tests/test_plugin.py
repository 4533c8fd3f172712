"""The pytest plugin used as a user would: each test gets its own fresh database."""

import json
import os
import re
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.parse
from pathlib import Path
from typing import Any

import psycopg
import pytest

from pgfork import Client, DatabaseConfig, TestDatabase, TestDatabaseNotFound
from pgfork.client import DEFAULT_URL
from pgfork.pytest_plugin import PgforkDatabase


def check_fresh_then_write(db: PgforkDatabase, who: str) -> None:
    accounts, notes = db.conn.execute("SELECT (SELECT count(*) FROM accounts), (SELECT count(*) FROM notes)").fetchone() or (0, 0)
    assert (accounts, notes) == (2, 0), "database not fresh from the template"
    db.conn.execute("INSERT INTO notes VALUES (%s, 'hello')", (who,))
    db.conn.execute("UPDATE accounts SET cents = cents - 100 WHERE owner = 'alice'")
    owners = [r[0] for r in db.conn.execute("SELECT owner FROM notes")]
    assert owners == [who]
    row = db.conn.execute("SELECT cents FROM accounts WHERE owner = 'alice'").fetchone()
    assert row == (900,)


@pytest.mark.parametrize("n", range(12))
def test_isolated(pgfork_db: PgforkDatabase, n: int) -> None:
    check_fresh_then_write(pgfork_db, f"test{n}")


def test_conn_fixture(pgfork_conn: psycopg.Connection, pgfork_db: PgforkDatabase) -> None:
    assert pgfork_conn is pgfork_db.conn
    row = pgfork_conn.execute("SELECT current_database()").fetchone()
    assert row == (pgfork_db.name,)
    assert pgfork_db.url.startswith("postgres://")
    with psycopg.connect(pgfork_db.conninfo) as other:
        assert other.execute("SELECT count(*) FROM accounts").fetchone() == (2,)


@pytest.mark.pgfork_readonly
def test_readonly(pgfork_db: PgforkDatabase) -> None:
    assert pgfork_db.conn.execute("SELECT count(*) FROM notes").fetchone() == (0,)


def test_failed_test_keeps_database(pytester: pytest.Pytester, pgfork_client: Client) -> None:
    pytester.makeini("[pytest]\npgfork_extra_key = keep-on-failure\n")
    pytester.makepyfile(
        """
        def test_fails(pgfork_db):
            pgfork_db.conn.execute("CREATE TABLE evidence (x int); INSERT INTO evidence VALUES (42)")
            assert False, "on purpose"

        def test_passes(pgfork_db):
            pgfork_db.conn.execute("SELECT 1")
        """
    )
    # The password is shown only on request (see test_password_never_in_failure_report).
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "--pgfork-show-password")
    result.assert_outcomes(passed=1, failed=1)
    lines = [ln for ln in result.outlines if "keeping test database" in ln]
    assert len(lines) == 1, result.stdout.str()
    url = lines[0].rsplit(" ", 1)[1]
    assert url.startswith("postgres://")
    with psycopg.connect(url) as conn:
        assert conn.execute("SELECT x FROM evidence").fetchone() == (42,)
    # Give the kept database back ourselves, by its hand-out token.
    m = re.search(r"template (\w+), id (\d+), hand-out ([0-9a-f]{16,})", lines[0])
    assert m, lines[0]
    # The server was told: it counts the database as kept, outside the pool.
    tpl = [t for t in pgfork_client.list_templates()["templates"] if t["templateHash"] == m.group(1)]
    assert tpl and tpl[0]["kept"] >= 1, tpl
    kept = TestDatabase(m.group(1), int(m.group(2)), DatabaseConfig("", 0, "", "", ""), token=m.group(3))
    pgfork_client.recreate(kept)
    with pytest.raises(TestDatabaseNotFound):
        pgfork_client.recreate(kept)


def test_kept_databases_pile_up_one_line(pytester: pytest.Pytester, pgfork_client: Client) -> None:
    """Databases of failed tests are kept outside the pool; once more than
    half the server's cap (10) pile up, the run says so in one line; a
    passing run of another template says nothing."""
    key = f"pile-{secrets.token_hex(8)}"
    pytester.makeini(f"[pytest]\npgfork_extra_key = {key}\n")
    pytester.makepyfile("\n".join(f"def test_fails_{i}(pgfork_db):\n    assert False\n" for i in range(6)))
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider")
    result.assert_outcomes(failed=6)
    assert "databases of failed tests are kept" not in result.stdout.str()
    pytester.makepyfile("def test_passes(pgfork_db):\n    pass\n")
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider")
    result.assert_outcomes(passed=1, warnings=1)
    lines = [ln for ln in result.outlines if "6 databases of failed tests are kept" in ln]
    assert len(lines) == 1, result.stdout.str()
    pytester.makeini(f"[pytest]\npgfork_extra_key = {key}-clean\n")
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider")
    result.assert_outcomes(passed=1)
    assert "databases of failed tests" not in result.stdout.str()


def test_failing_migration_fails_clearly(pytester: pytest.Pytester, pgfork_client: Client) -> None:
    pytester.makeini(f"[pytest]\npgfork_migrations = m\npgfork_extra_key = broken-{secrets.token_hex(8)}\n")
    pytester.mkdir("m")
    (pytester.path / "m" / "001.sql").write_text("CREATE TABLE ok (id int);\nTHIS IS NOT SQL;\n")
    pytester.makepyfile("def test_a(pgfork_db):\n    pass\n\ndef test_b(pgfork_db):\n    pass\n")
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider")
    result.assert_outcomes(errors=2)
    result.stdout.fnmatch_lines(["*migrating template*failed*001.sql*"])


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie nobody reaps (PID 1 in a container may not) is gone too
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return True


def _gone_within(pid: int, seconds: float) -> float:
    """Seconds until pid was gone; fails after `seconds`."""
    t0 = time.monotonic()
    while _alive(pid):
        assert time.monotonic() - t0 < seconds, f"pgfork serve (pid {pid}) still runs {seconds} s after the run ended"
        time.sleep(0.05)
    return time.monotonic() - t0


def test_starts_a_server_for_the_run_that_stops_with_it(pytester: pytest.Pytester,
                                                         request: pytest.FixtureRequest) -> None:
    """With no URL configured (whatever answers at the default one), the plugin
    starts `pgfork serve` once for the run (two xdist workers share it), in
    a state directory that outlives the run; the server stops when the run
    ends, and also when pytest is killed; the next run reuses the template."""
    binary = os.environ.get("PGFORK_BIN") or shutil.which("pgfork")
    assert binary, "no pgfork binary: set PGFORK_BIN (clients/test.sh does)"
    helptext = subprocess.run([binary, "serve", "--help"], capture_output=True, text=True).stdout
    if "--lease" not in helptext:
        pytest.skip("KNOWN SKIP: this pgfork serve has no --lease yet (helper servelife adds it)")
    # Not under pytest's tmp dirs (mode 0700): the managed PostgreSQL runs as
    # an unprivileged user when we are root and must reach its data directory.
    state = Path(tempfile.mkdtemp(prefix="pgfork-serve-state-"))
    os.chmod(state, 0o755)
    request.addfinalizer(lambda: shutil.rmtree(state, ignore_errors=True))
    built = pytester.path / "built"
    pytester.makeini(f"[pytest]\npgfork_extra_key = autostart-{secrets.token_hex(8)}\n")
    pytester.makeconftest(
        f"""
        import pytest

        @pytest.fixture(scope="session")
        def pgfork_migrate():
            def migrate(url):
                with open({str(built)!r}, "a") as f:
                    f.write("built\\n")
            return migrate
        """
    )
    pytester.makepyfile(
        """
        import os, time
        import pytest

        @pytest.mark.parametrize("n", range(4))
        def test_db(pgfork_db, n):
            assert pgfork_db.conn.execute("SELECT 1").fetchone() == (1,)
            if os.environ.get("HANG_FILE"):
                open(os.environ["HANG_FILE"], "w").close()
                time.sleep(600)
        """
    )
    env = {"PGFORK_STATE_DIR": str(state), "PGFORK_BIN": binary}
    unset = ["PGFORK_URL", "INTEGRESQL_CLIENT_BASE_URL", "PGFORK_TOKEN", "PGFORK_SERVE_ARGS"]
    with pytest.MonkeyPatch.context() as mp:
        for k, v in env.items():
            mp.setenv(k, v)
        for k in unset:
            mp.delenv(k, raising=False)
        result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-n", "2", timeout=600)
        result.assert_outcomes(passed=4)
        assert "pgfork: starting " in result.stderr.str() + result.stdout.str()
        rec = json.loads((state / "serve.json").read_text())
        assert rec["url"].startswith("http://127.0.0.1:") and rec["url"] != DEFAULT_URL and rec["token"]
        assert oct((state / "serve.json").stat().st_mode & 0o777) == "0o600"
        assert built.read_text() == "built\n"
        took = _gone_within(rec["pid"], 30.0)
        print(f"serve exited {took:.2f} s after the run")

        # Killed in the middle: the server goes too. The template survived.
        hang = pytester.path / "hang"
        p = subprocess.Popen([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-x"], cwd=pytester.path,
                             env={**os.environ, "HANG_FILE": str(hang)}, stdout=subprocess.DEVNULL,
                             stderr=subprocess.DEVNULL, start_new_session=True)
        try:
            t0 = time.monotonic()
            while not hang.exists():
                assert p.poll() is None and time.monotonic() - t0 < 120, "the second run did not get a database"
                time.sleep(0.05)
            second = json.loads((state / "serve.json").read_text())
            assert second["pid"] != rec["pid"]
        finally:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()
        took = _gone_within(second["pid"], 30.0)
        print(f"serve exited {took:.2f} s after pytest was killed")
    assert built.read_text() == "built\n", "the second run built the template again"


def _run_dir(name: str) -> str:
    return f"{name}-{secrets.token_hex(8)}"


def test_password_never_in_failure_report(pytester: pytest.Pytester, pgfork_db: PgforkDatabase) -> None:
    """A failing test that prints, asserts on and raises with its database's
    URL and conninfo, and a migration whose error holds the URL: the report
    shows *** where the password was, never the password."""
    password = pgfork_db.test_database.config.password
    assert password, "the server handed out a database without a password: nothing to check"
    pytester.makeini(f"[pytest]\npgfork_extra_key = {_run_dir('pw')}\n")
    pytester.makeconftest(
        """
        import subprocess, pytest

        @pytest.fixture(scope="session")
        def pgfork_migrate():
            def migrate(url):
                subprocess.run(["false", f"--url={url}"], check=True)   # fails, its command in the error
            return migrate
        """
    )
    pytester.makepyfile(
        test_a="""
        import pytest

        def test_prints_and_fails(pgfork_db_factory):
            db = pgfork_db_factory(extra_key="pw-ok")
            print("url:", db.url, "conninfo:", db.conninfo)
            cfg = db.test_database.config
            assert db.url == "something else", (cfg, db.conninfo)
        """,
        test_b="""
        def test_migration_fails(pgfork_db):
            pass
        """,
    )
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-rA", "-l")
    result.assert_outcomes(failed=1, errors=1)
    out = result.stdout.str() + result.stderr.str()
    assert "keeping test database" in out and "***" in out
    assert "--url=postgres://" in out, "the migration's error is in the report"
    assert password not in out, "a failure report shows the database password"
    assert urllib.parse.quote(password, safe="") not in out


def test_factory_several_templates(pgfork_db_factory: Any, tmp_path: Path) -> None:
    """pgfork_db_factory gives databases of different templates in one test;
    each template is built once per session."""
    key = _run_dir("factory")
    for name, table in (("a", "apples"), ("b", "bananas")):
        (tmp_path / name).mkdir()
        (tmp_path / name / "001.sql").write_text(f"CREATE TABLE {table} (n int); INSERT INTO {table} VALUES (1);")
    a = pgfork_db_factory(tmp_path / "a", extra_key=key)
    b = pgfork_db_factory(tmp_path / "b", extra_key=key)
    assert a.template_hash != b.template_hash
    assert a.conn.execute("SELECT count(*) FROM apples").fetchone() == (1,)
    assert b.conn.execute("SELECT count(*) FROM bananas").fetchone() == (1,)
    a2 = pgfork_db_factory(tmp_path / "a", extra_key=key)
    assert a2.template_hash == a.template_hash and a2.name != a.name
    a.conn.execute("INSERT INTO apples VALUES (2)")
    assert a2.conn.execute("SELECT count(*) FROM apples").fetchone() == (1,), "databases are isolated"

    calls = []

    def migrate(url: str) -> None:
        calls.append(url)
        with psycopg.connect(url, autocommit=True) as c:
            c.execute("CREATE TABLE custom (n int)")

    for _ in range(3):
        db = pgfork_db_factory(extra_key=key + "-custom", migrate=migrate)
        assert db.conn.execute("SELECT count(*) FROM custom").fetchone() == (0,)
    assert len(calls) == 1, "a template is migrated once per session"


def test_non_autocommit(pgfork_db_factory: Any) -> None:
    """autocommit=False: .conn runs in transactions; a rollback undoes."""
    db = pgfork_db_factory(autocommit=False)
    assert db.conn.autocommit is False
    db.conn.execute("CREATE TABLE t (n int)")
    db.conn.rollback()
    other = db.connect(autocommit=True)
    assert other.execute("SELECT to_regclass('t')").fetchone() == (None,)


def test_command_line_options(pytester: pytest.Pytester, pgfork_client: Client) -> None:
    """--pgfork-url, --pgfork-token, --pgfork-migrations, --pgfork-extra-key and
    --pgfork-autocommit configure the run, over the ini file; a bad
    --pgfork-autocommit is a usage error."""
    import os

    pytester.makeini("[pytest]\npgfork_migrations = wrong\npgfork_url = http://127.0.0.1:1\n")
    pytester.mkdir("m")
    (pytester.path / "m" / "001.sql").write_text("CREATE TABLE from_cli (n int);")
    pytester.makepyfile(
        """
        def test_cli(pgfork_db):
            assert pgfork_db.conn.autocommit is False
            assert pgfork_db.conn.execute("SELECT count(*) FROM from_cli").fetchone() == (0,)
        """
    )
    args = ["-p", "no:cacheprovider", f"--pgfork-url={pgfork_client.base_url}", "--pgfork-migrations=m",
            f"--pgfork-extra-key={_run_dir('cli')}", "--pgfork-autocommit=false"]
    token = os.environ.get("PGFORK_TOKEN", "")
    with pytest.MonkeyPatch.context() as mp:
        mp.delenv("PGFORK_URL", raising=False)
        mp.delenv("PGFORK_TOKEN", raising=False)
        if token:
            args.append(f"--pgfork-token={token}")
        result = pytester.runpytest_subprocess(*args)
        result.assert_outcomes(passed=1)
        bad = pytester.runpytest_subprocess("-p", "no:cacheprovider", "--pgfork-autocommit=maybe")
    assert bad.ret == pytest.ExitCode.USAGE_ERROR
    bad.stderr.fnmatch_lines(["*pgfork_autocommit*maybe*true or false*"])


def test_serve_install_progress_is_relayed(tmp_path: Path) -> None:
    """While a started server comes up, its lines from the first about an
    install on are shown (whole lines only), the others not."""
    from pgfork.server import _listen_url, _relay

    log = tmp_path / "serve.log"
    log.write_text("level=INFO msg=starting\nno PostgreSQL build found: installing the newest into /x\n"
                   "unpacking PostgreSQL 18.1 (40 MB archive)\npartial")
    shown: list = []
    installing = [False]
    seen = _relay(log, 0, shown.append, installing)
    assert shown == ["pgfork serve: no PostgreSQL build found: installing the newest into /x",
                     "pgfork serve: unpacking PostgreSQL 18.1 (40 MB archive)"]
    assert seen == len(log.read_bytes()) - len("partial")
    out = tmp_path / "serve.out"
    out.write_text('{"listen":"127.0.0.1:4')
    assert _listen_url(out) == ""
    out.write_text('{"listen":"127.0.0.1:41234","socket":""}\n')
    assert _listen_url(out) == "http://127.0.0.1:41234"
