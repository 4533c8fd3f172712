"""Settings of pgfork's example Django project.

The test databases come from `pgfork serve` ($PGFORK_URL, $PGFORK_TOKEN):
no PostgreSQL is needed at HOST below to run the tests, only to run the
project itself."""
import os

SECRET_KEY = "example-only"
DEBUG = False
USE_TZ = True
ROOT_URLCONF = "exampleproject.urls"
INSTALLED_APPS = [
    "django.contrib.contenttypes",
    "django.contrib.auth",
    "shop",
    "audit",
]

_db = {
    "ENGINE": "django.db.backends.postgresql",
    "HOST": os.environ.get("EXAMPLE_DB_HOST", "localhost"),
    "USER": os.environ.get("EXAMPLE_DB_USER", "example"),
    "PASSWORD": os.environ.get("EXAMPLE_DB_PASSWORD", ""),
}
DATABASES = {
    "default": {**_db, "NAME": "example"},
    # The audit app lives in a database of its own (exampleproject.routers).
    "other": {**_db, "NAME": "example_audit"},
    # A read replica of default; in tests a mirror of default.
    "replica": {**_db, "NAME": "example", "TEST": {"MIRROR": "default"}},
}
DATABASE_ROUTERS = ["exampleproject.routers.AuditRouter"]
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

TEST_RUNNER = "pgfork.django.Runner"
PGFORK = {
    # Hashed into the template key: change it to rebuild the templates.
    "EXTRA_KEY": "example/1",
}
