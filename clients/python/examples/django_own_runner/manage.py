#!/usr/bin/env python
"""manage.py of a Django project with a test runner of its own (ownrunner/runner.py)."""
import os
import sys

if __name__ == "__main__":
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "ownrunner.settings")
    from django.core.management import execute_from_command_line

    execute_from_command_line(sys.argv)
