"""The example project's pytest-django tests (pytest.ini activates
pgfork.django.pytest_plugin). They record "pid test alias database" under
$EXAMPLE_RECORD_DIR for pgfork's own tests."""
import os

import pytest
from django.db import connections

from audit.models import Entry
from shop.models import Color, Widget


def record(name, alias="default"):
    d = os.environ.get("EXAMPLE_RECORD_DIR")
    if d:
        with open(os.path.join(d, str(os.getpid())), "a") as f:
            f.write(f"{os.getpid()} {name} {alias} {connections[alias].settings_dict['NAME']}\n")


@pytest.mark.django_db
def test_migration_data():
    record("test_migration_data")
    assert Color.objects.count() == 3


@pytest.mark.django_db
def test_rolled_back():
    record("test_rolled_back")
    assert Widget.objects.count() == 0
    Widget.objects.create(name="w")


@pytest.mark.django_db(transaction=True)
def test_transactional_1():
    record("test_transactional_1")
    assert Color.objects.count() == 3  # a flush before would have deleted them
    Widget.objects.create(name="committed")


@pytest.mark.django_db(transaction=True)
def test_transactional_2():
    record("test_transactional_2")
    assert Color.objects.count() == 3
    assert Widget.objects.count() == 0


@pytest.mark.django_db(transaction=True, serialized_rollback=True)
def test_serialized_rollback_1():
    record("test_serialized_rollback_1")
    Color.objects.all().delete()


@pytest.mark.django_db(transaction=True, serialized_rollback=True)
def test_serialized_rollback_2():
    record("test_serialized_rollback_2")
    assert Color.objects.count() == 3


@pytest.mark.django_db(databases=["default", "other"])
def test_multi_db():
    record("test_multi_db")
    record("test_multi_db", "other")
    Entry.objects.create(message="hello")
    assert Entry.objects.using("other").count() == 1
    assert "audit_entry" not in connections["default"].introspection.table_names()


@pytest.mark.skipif(not os.environ.get("EXAMPLE_FAIL"), reason="KNOWN SKIP: fails only on purpose (EXAMPLE_FAIL)")
@pytest.mark.django_db(transaction=True)
def test_fails():
    record("test_fails")
    Widget.objects.create(name=os.environ["EXAMPLE_FAIL"])
    assert False, "failing on purpose"
