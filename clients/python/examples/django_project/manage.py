#!/usr/bin/env python3
"""The example project's manage.py: `python manage.py test` runs its tests
on databases from pgfork serve (TEST_RUNNER in exampleproject/settings.py)."""
import os
import sys

if __name__ == "__main__":
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "exampleproject.settings")
    from django.core.management import execute_from_command_line

    execute_from_command_line(sys.argv)
