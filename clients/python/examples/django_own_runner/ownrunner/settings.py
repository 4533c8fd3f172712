"""Settings of a project with a test runner of its own, switched to pgfork
as clients/python/README.md shows (ownrunner/runner.py)."""
import os

SECRET_KEY = "example-only"
USE_TZ = True
INSTALLED_APPS = ["django.contrib.contenttypes", "django.contrib.auth", "accounts"]
DATABASES = {
    "default": {
        "ENGINE": "django.db.backends.postgresql",
        "HOST": "localhost",
        "NAME": "ownrunner",
    },
}
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
PASSWORD_HASHERS = ["django.contrib.auth.hashers.PBKDF2PasswordHasher"]
EMAIL_BACKEND = "django.core.mail.backends.smtp.EmailBackend"

# The project's runner, on pgfork.django.Runner; OWN_RUNNER picks another of
# ownrunner/runner.py (the tests of pgfork try each).
TEST_RUNNER = "ownrunner.runner." + os.environ.get("OWN_RUNNER", "ProjectRunner")
PGFORK = {"EXTRA_KEY": os.environ.get("OWN_EXTRA_KEY", "own-runner/1")}
