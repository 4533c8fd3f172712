"""The example project's tests, run by `python manage.py test` on pgfork
databases. pgfork's own tests (clients/python/tests/django) run them and
read what they record under $EXAMPLE_RECORD_DIR."""
import os

from django.db import connection, connections
from django.test import TestCase, TransactionTestCase

from audit.models import Entry
from shop.models import Color, Widget


def record(test, alias="default"):
    """Append "pid test alias database" to $EXAMPLE_RECORD_DIR/<pid> (if set)."""
    d = os.environ.get("EXAMPLE_RECORD_DIR")
    if d:
        with open(os.path.join(d, str(os.getpid())), "a") as f:
            f.write(f"{os.getpid()} {test.id()} {alias} {connections[alias].settings_dict['NAME']}\n")


class WidgetTests(TestCase):
    def test_migration_data(self):
        record(self)
        self.assertEqual(sorted(Color.objects.values_list("name", flat=True)), ["blue", "green", "red"])

    def test_create(self):
        record(self)
        Widget.objects.create(name="w", color=Color.objects.get(name="red"))
        self.assertEqual(Widget.objects.count(), 1)

    def test_rolled_back(self):
        record(self)
        self.assertEqual(Widget.objects.count(), 0)


class TransactionTests(TransactionTestCase):
    """Each test on a fresh database: the migration's colors are there for
    both tests (a flush after the first would have deleted them)."""

    def test_1_writes(self):
        record(self)
        self.assertEqual(Color.objects.count(), 3)
        self.assertEqual(Widget.objects.count(), 0)
        Widget.objects.create(name="committed")

    def test_2_sees_a_clean_database(self):
        record(self)
        self.assertEqual(Color.objects.count(), 3)
        self.assertEqual(Widget.objects.count(), 0)


class SerializedRollbackTests(TransactionTestCase):
    """serialized_rollback as in Django: Django's flush and reload
    (pgfork_fresh_db = False opts a class out of fresh databases)."""

    serialized_rollback = True
    pgfork_fresh_db = False

    def test_1_deletes(self):
        record(self)
        self.assertEqual(Color.objects.count(), 3)
        Color.objects.all().delete()

    def test_2_restored(self):
        record(self)
        self.assertEqual(Color.objects.count(), 3)


class SerializedRollbackFreshTests(TransactionTestCase):
    serialized_rollback = True

    def test_1_deletes(self):
        record(self)
        Color.objects.all().delete()

    def test_2_restored(self):
        record(self)
        self.assertEqual(Color.objects.count(), 3)


class MultiDatabaseTests(TestCase):
    databases = {"default", "other"}

    def test_each_alias_its_database(self):
        record(self)
        record(self, "other")
        Entry.objects.create(message="hello")
        Widget.objects.create(name="w")
        self.assertEqual(Entry.objects.using("other").count(), 1)
        self.assertNotEqual(connections["default"].settings_dict["NAME"], connections["other"].settings_dict["NAME"])
        # The router migrated audit into "other" only, shop into "default" only.
        self.assertIn("audit_entry", connections["other"].introspection.table_names())
        self.assertNotIn("audit_entry", connections["default"].introspection.table_names())
        self.assertNotIn("shop_widget", connections["other"].introspection.table_names())


class MirrorTests(TransactionTestCase):
    databases = {"default", "replica"}

    def test_replica_reads_default(self):
        record(self)
        record(self, "replica")
        Widget.objects.create(name="via default")
        self.assertEqual(Widget.objects.using("replica").get().name, "via default")


if os.environ.get("EXAMPLE_FAIL"):

    class FailingTests(TransactionTestCase):
        def test_fails(self):
            record(self)
            Widget.objects.create(name=os.environ["EXAMPLE_FAIL"])
            self.fail(f"failing on purpose in {connection.settings_dict['NAME']}")
