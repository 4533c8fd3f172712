"""The project's test runners.

Its runner sets what its tests rely on (a fast password hasher, mail kept
in memory, a setting of its own). With pgfork it subclasses
pgfork.django.Runner instead of DiscoverRunner; a runner built on another
package's runner mixes in pgfork.django.PgforkRunnerMixin first."""

from django.conf import settings
from django.test.runner import DiscoverRunner

from pgfork.django import PgforkRunnerMixin, Runner


class ProjectRunner(Runner):  # was: class ProjectRunner(DiscoverRunner)
    def setup_test_environment(self, **kwargs):
        super().setup_test_environment(**kwargs)
        settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]
        settings.EMAIL_BACKEND = "django.core.mail.backends.locmem.EmailBackend"
        settings.OWN_RUNNER = type(self).__name__


class VendorRunner(DiscoverRunner):
    """Stands for another package's runner (a reporter, a profiler)."""

    def setup_test_environment(self, **kwargs):
        super().setup_test_environment(**kwargs)
        settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]
        settings.EMAIL_BACKEND = "django.core.mail.backends.locmem.EmailBackend"
        settings.OWN_RUNNER = type(self).__name__


class MixedRunner(PgforkRunnerMixin, VendorRunner):
    pass


class OneLinerRunner(Runner):
    """What TEST_RUNNER = "pgfork.django.Runner" gives: the project's runner dropped."""
