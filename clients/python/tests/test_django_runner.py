"""pgfork.django.Runner: `python manage.py test` of the example project
(examples/django_project) against the real server."""

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
    """The server the subprocesses use ($PGFORK_URL, as CI sets it)."""
    return pgfork_client


def test_manage_py_test_as_documented(server: Client) -> None:
    # Exactly what the README says: cd examples/django_project && python manage.py test
    p = run(["manage.py", "test"], cwd=EXAMPLE)
    assert p.returncode == 0, both(p)
    assert "pgfork: alias(es) 'default', 'replica' -> pgfork_test_" in p.stderr
    assert "Creating test database" not in p.stderr  # Django's own creation never ran
    assert re.search(r"Ran 1\d tests", p.stderr) and "\nOK" in p.stderr


def test_changed_migration_or_model_builds_a_new_template(server: Client, tmp_path: Path) -> None:
    proj = copy_example(tmp_path / "proj")
    first = run(["manage.py", "test"], cwd=proj)
    assert first.returncode == 0, both(first)
    built = re.findall(r"pgfork: built template ([0-9a-f]{32}) for alias 'default'", first.stderr)
    assert len(built) == 1, first.stderr
    h1 = built[0]

    again = run(["manage.py", "test"], cwd=proj)
    assert again.returncode == 0, both(again)
    assert f"pgfork: using template {h1} for alias 'default' (migrated before)" in again.stderr
    assert "building template" not in again.stderr

    # A new migration (and the model field it adds) and a test that needs the
    # column: a stale template (--keepdb's guess) would fail it.
    models = proj / "shop" / "models.py"
    models.write_text(models.read_text() + "    size = models.IntegerField(default=0)\n")
    (proj / "shop" / "migrations" / "0003_widget_size.py").write_text(
        "from django.db import migrations, models\n\n\n"
        "class Migration(migrations.Migration):\n"
        "    dependencies = [('shop', '0002_colors')]\n"
        "    operations = [migrations.AddField('widget', 'size', models.IntegerField(default=0))]\n")
    (proj / "shop" / "test_size.py").write_text(
        "from django.test import TestCase\n\nfrom shop.models import Widget\n\n\n"
        "class SizeTests(TestCase):\n"
        "    def test_size_column(self):\n"
        "        self.assertEqual(Widget.objects.create(name='big', size=3).size, 3)\n"
        "        self.assertEqual(Widget.objects.get(size=3).name, 'big')\n")
    changed = run(["manage.py", "test", "-v", "2"], cwd=proj)
    assert changed.returncode == 0, both(changed)
    h2 = re.findall(r"pgfork: built template ([0-9a-f]{32}) for alias 'default'", changed.stderr)
    assert h2 and h2[0] != h1, changed.stderr
    assert "test_size_column (shop.test_size.SizeTests.test_size_column) ... ok" in changed.stderr

    # A model change without a migration is a new template too (the models' state is in the key).
    models.write_text(models.read_text() + "    weight = models.IntegerField(null=True)\n")
    model_only = run(["manage.py", "test", "shop.test_size"], cwd=proj)
    h3 = re.findall(r"pgfork: building template ([0-9a-f]{32}) for alias 'default'", model_only.stderr)
    assert h3 and h3[0] not in (h1, h2[0]), both(model_only)


@pytest.mark.parametrize("start", ["fork", "spawn"])
def test_parallel_workers_take_databases_from_the_pool(server: Client, tmp_path: Path, start: str) -> None:
    # fork: Linux's default; spawn: macOS's (the settings travel to the workers pickled).
    rec = tmp_path / "rec"
    rec.mkdir()
    code = (f"import multiprocessing, runpy, sys; multiprocessing.set_start_method({start!r}); "
            "sys.argv = ['manage.py', 'test', '--parallel', '2']; runpy.run_path('manage.py', run_name='__main__')")
    p = run(["-c", code], cwd=EXAMPLE, env={"EXAMPLE_RECORD_DIR": str(rec)})
    assert p.returncode == 0, both(p)
    assert "Cloning test database" not in p.stderr
    workers = dict(re.findall(r"pgfork: worker (\d+): alias\(es\) 'default', 'replica' -> (\S+)", p.stderr))
    assert sorted(workers) == ["1", "2"], p.stderr
    assert len(set(workers.values())) == 2
    recs = records(rec)
    for _, name in [(r[1], r[3]) for r in recs]:
        assert DB_NAME.match(name), name  # never a Django clone (NAME_1)
    # TestCase tests run in a worker's database from the pool, one per worker.
    seen = {}
    for pid, test, alias, name in recs:
        if alias == "default" and (".WidgetTests." in test or ".MultiDatabaseTests." in test):
            assert name in workers.values(), (test, name, workers)
            seen.setdefault(pid, set()).add(name)
    assert all(len(names) == 1 for names in seen.values()), seen
    if len(seen) == 2:
        a, b = seen.values()
        assert a != b


@pytest.fixture(scope="module")
def example_run(tmp_path_factory: pytest.TempPathFactory, pgfork_client: Client):
    rec = tmp_path_factory.mktemp("rec")
    p = run(["manage.py", "test", "-v", "2"], cwd=EXAMPLE, env={"EXAMPLE_RECORD_DIR": str(rec)})
    assert p.returncode == 0, both(p)
    return p, records(rec)


def test_transaction_test_case_gets_a_fresh_database(example_run) -> None:
    p, recs = example_run
    names = by_test(recs)
    main = names[("WidgetTests.test_create", "default")]
    t1 = names[("TransactionTests.test_1_writes", "default")]
    t2 = names[("TransactionTests.test_2_sees_a_clean_database", "default")]
    # Not the run's database; t1 and t2 may share a name (t1's, given back,
    # is recreated under it and can be handed to t2): that t2 sees a clean
    # database is test_2_sees_a_clean_database's own assertion, and the run
    # passed.
    assert main not in {t1, t2}, names
    assert template_of(t1) == template_of(main)
    assert "each TransactionTestCase test gets a fresh database" in p.stderr


def test_flush_instead_of_fresh_database_loses_migration_data(server: Client, tmp_path: Path) -> None:
    # The other way (Django's flush) fails TransactionTests: the fresh
    # database is what keeps the data migration's rows for the second test.
    proj = copy_example(tmp_path / "proj")
    settings = proj / "exampleproject" / "settings.py"
    settings.write_text(settings.read_text().replace('PGFORK = {', 'PGFORK = {\n    "FRESH_TRANSACTION_DB": False,'))
    p = run(["manage.py", "test", "shop.tests.TransactionTests"], cwd=proj)
    assert p.returncode != 0, both(p)
    assert "FAIL: test_2_sees_a_clean_database" in p.stderr, p.stderr


def test_serialized_rollback(example_run) -> None:
    p, recs = example_run
    names = by_test(recs)
    main = names[("WidgetTests.test_create", "default")]
    # Opted out of fresh databases: Django's flush and reload on the run's database.
    assert names[("SerializedRollbackTests.test_1_deletes", "default")] == main
    assert names[("SerializedRollbackTests.test_2_restored", "default")] == main
    # Fresh databases: the deleted colors are back because the database is new.
    assert names[("SerializedRollbackFreshTests.test_2_restored", "default")] != main
    assert "test_2_restored (shop.tests.SerializedRollbackTests.test_2_restored) ... ok" in p.stderr
    assert "test_2_restored (shop.tests.SerializedRollbackFreshTests.test_2_restored) ... ok" in p.stderr


def test_several_databases_and_mirror(example_run) -> None:
    p, recs = example_run
    names = by_test(recs)
    default = names[("MultiDatabaseTests.test_each_alias_its_database", "default")]
    other = names[("MultiDatabaseTests.test_each_alias_its_database", "other")]
    assert DB_NAME.match(default) and DB_NAME.match(other)
    assert template_of(default) != template_of(other)  # a template per database (the router differs)
    # The mirror follows default, also onto a TransactionTestCase's fresh database.
    assert names[("MirrorTests.test_replica_reads_default", "replica")] == \
        names[("MirrorTests.test_replica_reads_default", "default")]
    assert "test_each_alias_its_database (shop.tests.MultiDatabaseTests.test_each_alias_its_database) ... ok" \
        in p.stderr
    assert "test_entry (audit.tests.EntryTests.test_entry) ... ok" in p.stderr


def test_failing_run_keeps_databases_with_the_password_masked(server: Client) -> None:
    marker = "kept-" + uuid.uuid4().hex
    p = run(["manage.py", "test"], cwd=EXAMPLE, env={"EXAMPLE_FAIL": marker})
    assert p.returncode != 0, both(p)
    kept = re.search(r"pgfork: shop\.tests\.FailingTests\.test_fails failed: keeping its fresh database "
                     r"for alias\(es\) 'default', 'replica': (postgres://\S+)", p.stderr)
    assert kept, p.stderr
    assert re.search(r"pgfork: the run failed: keeping the test database for alias\(es\) 'default', 'replica': "
                     r"postgres://[^:]+:\*\*\*@", p.stderr), p.stderr
    url = kept.group(1)
    assert ":***@" in url
    # The password itself is nowhere in the output.
    td = server.get_test_database(template_of(urllib.parse.urlsplit(url).path.lstrip("/")))
    password = td.config.password
    server.unlock(td)
    assert password and password not in both(p)
    # The kept database has what the failing test wrote.
    real = url.replace(":***@", ":" + urllib.parse.quote(password, safe="") + "@")
    with psycopg.connect(real) as conn:
        assert conn.execute("SELECT name FROM shop_widget").fetchall() == [(marker,)]


def test_failed_migration_discards_the_template_and_the_next_run_rebuilds(server: Client, tmp_path: Path) -> None:
    proj = copy_example(tmp_path / "proj")
    mig = proj / "shop" / "migrations" / "0002_colors.py"
    mig.write_text(mig.read_text().replace(
        "def add_colors(apps, schema_editor):\n",
        "def add_colors(apps, schema_editor):\n    import os\n    if os.environ.get('EXAMPLE_BREAK'):\n"
        "        raise RuntimeError('broken data migration')\n"))
    broken = run(["manage.py", "test", "shop.tests.WidgetTests"], cwd=proj, env={"EXAMPLE_BREAK": "1"})
    assert broken.returncode != 0 and "RuntimeError: broken data migration" in broken.stderr, both(broken)
    h = re.findall(r"pgfork: building template ([0-9a-f]{32}) for alias 'default'", broken.stderr)
    assert h, broken.stderr
    # Same files, same key: the discarded template is built again, not waited for.
    fixed = run(["manage.py", "test", "shop.tests.WidgetTests"], cwd=proj)
    assert fixed.returncode == 0, both(fixed)
    assert f"pgfork: built template {h[0]} for alias 'default'" in fixed.stderr, fixed.stderr


OWN_RUNNER = EXAMPLE.parent / "django_own_runner"


@pytest.mark.parametrize("runner", ["ProjectRunner", "MixedRunner", "OneLinerRunner"])
def test_a_project_with_its_own_runner(server: Client, runner: str) -> None:
    # ProjectRunner subclasses pgfork.django.Runner (the README's first way),
    # MixedRunner mixes PgforkRunnerMixin into another runner; OneLinerRunner is
    # TEST_RUNNER = "pgfork.django.Runner", which drops the project's runner:
    # its tests that rely on it fail (the finding that made the README show
    # subclassing first).
    p = run(["manage.py", "test", "-v", "2"], cwd=OWN_RUNNER, env={"OWN_RUNNER": runner})
    assert "pgfork: alias(es) 'default' -> pgfork_test_" in p.stderr, both(p)
    assert "test_database_from_pgfork (accounts.tests.RunnerTests.test_database_from_pgfork) ... ok" in p.stderr
    if runner == "OneLinerRunner":
        assert p.returncode != 0, both(p)
        assert "FAIL: test_fast_password_hasher" in p.stderr and "FAIL: test_the_projects_runner_ran" in p.stderr
    else:
        assert p.returncode == 0, both(p)
        assert re.search(r"Ran 4 tests", p.stderr) and "\nOK" in p.stderr


def test_keepdb_reuses_the_template_and_gives_the_databases_back(server: Client) -> None:
    # --keepdb: what Django keeps to save time is the migrated schema, which
    # pgfork keeps as the template for every run anyway. The run's databases
    # are given back: kept ones would fill the pool, and the server may hand
    # one out again once nothing uses it, so no later run could count on it.
    key = f"own-runner/keepdb/{uuid.uuid4().hex}"
    first = run(["manage.py", "test", "--keepdb"], cwd=OWN_RUNNER, env={"OWN_EXTRA_KEY": key})
    assert first.returncode == 0, both(first)
    h = re.findall(r"pgfork: built template ([0-9a-f]{32}) for alias 'default'", first.stderr)
    assert h, first.stderr
    assert "pgfork: --keepdb: the template (the migrated schema) is kept and reused by the next run; " \
           "the test databases are given back" in first.stderr
    assert "keeping" not in first.stderr
    second = run(["manage.py", "test", "--keepdb"], cwd=OWN_RUNNER, env={"OWN_EXTRA_KEY": key})
    assert second.returncode == 0, both(second)
    assert f"pgfork: using template {h[0]} for alias 'default' (migrated before)" in second.stderr
    tpl = [t for t in server.list_templates()["templates"] if t["templateHash"] == h[0]]
    assert tpl and not tpl[0]["databases"].get("in_use"), tpl  # nothing kept in the pool
