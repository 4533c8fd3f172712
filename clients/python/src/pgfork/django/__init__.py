"""pgfork for Django: ``TEST_RUNNER = "pgfork.django.Runner"`` (manage.py
test) and the pytest-django plugin ``pgfork.django.pytest_plugin``
(``-p pgfork.django.pytest_plugin``). Needs the ``django`` extra:
``pip install 'pgfork[django]'``."""

from typing import Any

__all__ = ["Runner", "template_key"]


def __getattr__(name: str) -> Any:
    # Lazily, so that importing the package (e.g. for the pytest plugin)
    # does not import django.test before Django's settings are configured.
    if name == "Runner":
        from .runner import Runner

        return Runner
    if name == "template_key":
        from ._core import template_key

        return template_key
    raise AttributeError(f"module 'pgfork.django' has no attribute {name!r}")
