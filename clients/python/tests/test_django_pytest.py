"""pgfork.django.pytest_plugin: pytest-django on the example project
(examples/django_project, whose pytest.ini activates the plugin) against the
real server."""

from __future__ import annotations

import re
import urllib.parse
import uuid
from pathlib import Path

import psycopg
import pytest

from django_support import EXAMPLE, DB_NAME, both, by_test, copy_example, pids, records, run, template_of
from pgfork import Client


@pytest.fixture
def server(pgfork_client: Client) -> Client:
    return pgfork_client


def pytest_run(cwd: Path, rec: Path, *args: str, env=None):
    return run(["-m", "pytest", "-p", "no:cacheprovider", "-s", *args], cwd=cwd,
               env={"EXAMPLE_RECORD_DIR": str(rec), **(env or {})})


def test_pytest_django_as_documented(server: Client, tmp_path: Path) -> None:
    # cd examples/django_project && pytest
    p = pytest_run(EXAMPLE, tmp_path)
    assert p.returncode == 0, both(p)
    assert "7 passed, 1 skipped" in p.stdout, both(p)
    names = by_test(records(tmp_path))
    main = names[("test_migration_data", "default")]
    assert DB_NAME.match(main)
    assert names[("test_rolled_back", "default")] == main
    # transaction=True: a fresh database per test, not the session's (a
    # flush would have deleted the migration's colors that
    # test_transactional_2 counts, and the widget test_transactional_1
    # committed would be there: the run passing is the proof). The two may
    # share a name: the first one's database, given back, is recreated
    # under its name and can be the next one handed out.
    fresh = {names[("test_transactional_1", "default")], names[("test_transactional_2", "default")]}
    assert main not in fresh, names
    # serialized_rollback on fresh databases: the deleted colors are back.
    assert names[("test_serialized_rollback_2", "default")] != main
    # Several databases: a template each.
    other = names[("test_multi_db", "other")]
    assert DB_NAME.match(other) and template_of(other) != template_of(main)


def test_pytest_django_flush_when_fresh_databases_are_off(server: Client, tmp_path: Path) -> None:
    p = pytest_run(EXAMPLE, tmp_path, "--pgfork-fresh-db=no")
    assert p.returncode != 0, both(p)
    assert re.search(r"FAILED pytest_tests/test_shop_pytest.py::test_transactional_2", p.stdout), p.stdout
    names = by_test(records(tmp_path))
    assert names[("test_transactional_1", "default")] == names[("test_migration_data", "default")]


def test_pytest_django_xdist_workers_take_databases_from_the_pool(server: Client, tmp_path: Path) -> None:
    p = pytest_run(EXAMPLE, tmp_path, "-n", "2")
    assert p.returncode == 0, both(p)
    recs = records(tmp_path)
    for _, _, _, name in recs:
        assert DB_NAME.match(name), name  # never pytest-django's test_<name>_gw0
    main = {}
    for pid, test, alias, name in recs:
        if alias == "default" and test in ("test_migration_data", "test_rolled_back", "test_multi_db"):
            main.setdefault(pid, set()).add(name)
    assert len(pids(recs)) == 2, recs
    assert all(len(v) == 1 for v in main.values()), main
    if len(main) == 2:
        a, b = main.values()
        assert a != b


def test_pytest_django_create_db_rebuilds_and_reuse_db_keeps(server: Client, tmp_path: Path) -> None:
    proj = copy_example(tmp_path / "proj")
    rec = tmp_path / "rec"
    rec.mkdir()
    first = pytest_run(proj, rec)
    assert first.returncode == 0, both(first)
    h = re.findall(r"pgfork: built template ([0-9a-f]{32}) for alias 'default'", first.stderr)
    assert len(h) == 1, first.stderr
    reused = pytest_run(proj, rec)
    assert f"pgfork: using template {h[0]} for alias 'default'" in reused.stderr, reused.stderr

    created = pytest_run(proj, rec, "--create-db")
    assert created.returncode == 0, both(created)
    assert f"pgfork: --create-db: discarded template {h[0]} of alias 'default'" in created.stderr
    assert f"pgfork: built template {h[0]} for alias 'default'" in created.stderr, created.stderr

    kept = pytest_run(proj, rec, "--reuse-db")
    assert kept.returncode == 0, both(kept)
    m = re.search(r"pgfork: --reuse-db: keeping the test database for alias\(es\) 'default', 'replica': "
                  r"(postgres://\S+)", kept.stderr)
    assert m and ":***@" in m.group(1), kept.stderr


def test_pytest_django_failure_keeps_the_fresh_database(server: Client, tmp_path: Path) -> None:
    marker = "kept-" + uuid.uuid4().hex
    p = pytest_run(EXAMPLE, tmp_path, env={"EXAMPLE_FAIL": marker})
    assert p.returncode == 1, both(p)
    kept = re.search(r"failed: keeping its fresh database for alias\(es\) 'default', 'replica': (postgres://\S+)",
                     both(p))
    assert kept, both(p)
    assert "pgfork: the session failed: keeping the test database" in both(p)
    url = kept.group(1)
    td = server.get_test_database(template_of(urllib.parse.urlsplit(url).path.lstrip("/")))
    password = td.config.password
    server.unlock(td)
    assert password and password not in both(p)
    with psycopg.connect(url.replace(":***@", ":" + urllib.parse.quote(password, safe="") + "@")) as conn:
        assert conn.execute("SELECT name FROM shop_widget").fetchall() == [(marker,)]
