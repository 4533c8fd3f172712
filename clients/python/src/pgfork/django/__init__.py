"""pgfork for Django: ``TEST_RUNNER = "pgfork.django.Runner"`` (manage.py
test; a project with a runner of its own subclasses it, or mixes in
``pgfork.django.PgforkRunnerMixin``) and the pytest-django plugin ``pgfork.django.pytest_plugin``
(``-p pgfork.django.pytest_plugin``). Needs the ``django`` extra:
``pip install 'pgfork[django]'``."""

from typing import Any

__all__ = ["PgforkRunnerMixin", "Runner", "template_key"]


def __getattr__(name: str) -> Any:
    # Lazily, so that importing the package (e.g. for the pytest plugin)
    # does not import django.test before Django's settings are configured.
    if name in ("Runner", "PgforkRunnerMixin"):
        from . import runner

        return getattr(runner, name)
    if name == "template_key":
        from ._core import template_key

        return template_key
    raise AttributeError(f"module 'pgfork.django' has no attribute {name!r}")
