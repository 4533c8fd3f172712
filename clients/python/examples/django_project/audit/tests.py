from django.test import TestCase

from audit.models import Entry


class EntryTests(TestCase):
    databases = {"other"}

    def test_entry(self):
        Entry.objects.create(message="x")
        self.assertEqual(Entry.objects.count(), 1)
