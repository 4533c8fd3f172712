"""The pytest plugin used as a user would: each test gets its own fresh database."""

import re
import secrets

import psycopg
import pytest

from pgfork import Client
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
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider")
    result.assert_outcomes(passed=1, failed=1)
    lines = [ln for ln in result.outlines if "keeping test database" in ln]
    assert len(lines) == 1, result.stdout.str()
    url = lines[0].rsplit(" ", 1)[1]
    assert url.startswith("postgres://")
    with psycopg.connect(url) as conn:
        assert conn.execute("SELECT x FROM evidence").fetchone() == (42,)
    # Give the kept database back ourselves.
    m = re.search(r"template (\w+), id (\d+)", lines[0])
    assert m, lines[0]
    pgfork_client.recreate_test_database(m.group(1), int(m.group(2)))


def test_failing_migration_fails_clearly(pytester: pytest.Pytester, pgfork_client: Client) -> None:
    pytester.makeini(f"[pytest]\npgfork_migrations = m\npgfork_extra_key = broken-{secrets.token_hex(8)}\n")
    pytester.mkdir("m")
    (pytester.path / "m" / "001.sql").write_text("CREATE TABLE ok (id int);\nTHIS IS NOT SQL;\n")
    pytester.makepyfile("def test_a(pgfork_db):\n    pass\n\ndef test_b(pgfork_db):\n    pass\n")
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider")
    result.assert_outcomes(errors=2)
    result.stdout.fnmatch_lines(["*migrating template*failed*001.sql*"])


def test_starts_and_stops_its_own_server(pytester: pytest.Pytester, tmp_path_factory: pytest.TempPathFactory,
                                         request: pytest.FixtureRequest) -> None:
    """With no server at the URL and `pgfork` on PATH, the plugin starts one for
    the run (shared by two xdist workers) and stops it at the end."""
    import os
    import shutil
    import socket
    import tempfile

    binary = os.environ.get("PGFORK_BIN") or shutil.which("pgfork")
    if not binary:
        pytest.skip("no pgfork binary (clients/test.sh sets PGFORK_BIN)")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    url = f"http://127.0.0.1:{port}"
    # Not under pytest's tmp dirs (mode 0700): the managed PostgreSQL runs as
    # an unprivileged user when we are root and must reach its data directory.
    state = tempfile.mkdtemp(prefix="pgfork-serve-state-")
    os.chmod(state, 0o755)
    request.addfinalizer(lambda: shutil.rmtree(state, ignore_errors=True))
    bindir = tmp_path_factory.mktemp("bin")
    os.symlink(binary, bindir / "pgfork")
    pytester.makeini(f"[pytest]\npgfork_url = {url}\npgfork_extra_key = autostart\n")
    pytester.makepyfile(
        """
        import pytest

        @pytest.mark.parametrize("n", range(4))
        def test_db(pgfork_db, n):
            assert pgfork_db.conn.execute("SELECT 1").fetchone() == (1,)
        """
    )
    env = {
        "PATH": f"{bindir}{os.pathsep}{os.environ.get('PATH', '')}",
        "PGFORK_SERVE_ARGS": f"--state-dir {state}",
        "PGFORK_URL": "",
        "PGFORK_PYTEST_RUN_DIR": "",
    }
    with pytest.MonkeyPatch.context() as mp:
        for k, v in env.items():
            if v:
                mp.setenv(k, v)
            else:
                mp.delenv(k, raising=False)
        assert not Client(url).reachable(timeout=0.5)
        result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-n", "2", timeout=300)
    result.assert_outcomes(passed=4)
    assert not Client(url).reachable(timeout=0.5), "the plugin left its pgfork serve running"
