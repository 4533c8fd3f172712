"""Tests that rely on the project's runner (ownrunner/runner.py)."""

import os

from django.conf import settings
from django.contrib.auth.models import User
from django.core import mail
from django.db import connection
from django.test import TestCase


class RunnerTests(TestCase):
    def test_the_projects_runner_ran(self):
        self.assertEqual(getattr(settings, "OWN_RUNNER", None), os.environ.get("OWN_RUNNER", "ProjectRunner"))

    def test_fast_password_hasher(self):
        user = User.objects.create_user("ada", password="secret")
        self.assertTrue(user.password.startswith("md5$"), user.password)

    def test_mail_kept_in_memory(self):
        mail.send_mail("hello", "body", "a@example.com", ["b@example.com"])
        self.assertEqual(len(mail.outbox), 1)

    def test_database_from_pgfork(self):
        self.assertRegex(connection.settings_dict["NAME"], r"^pgfork_test_[0-9a-f]{32}_\d+$")
