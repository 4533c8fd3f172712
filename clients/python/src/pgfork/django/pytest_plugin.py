"""pytest-django with databases from `pgfork serve`.

Activate it with ``-p pgfork.django.pytest_plugin`` (e.g. in ``addopts``) or
``pytest_plugins = ["pgfork.django.pytest_plugin"]`` in the root
conftest.py. It overrides pytest-django's ``django_db_setup``: each test
database is a pgfork template (keyed as by :class:`pgfork.django.Runner`),
migrated once by whichever process gets there first, and every process
(each pytest-xdist worker) takes its databases from the pool.

- ``--reuse-db``: templates are always reused; with it, the session's
  databases are also kept at the end (as pytest-django keeps its database),
  their URLs printed with the password masked.
- ``--create-db``: rebuilds the templates (discards them first).
- ``transaction=True`` tests (and TransactionTestCase classes) get a fresh
  database per test instead of a flush: ``--pgfork-fresh-db=auto|yes|no``
  (default settings.PGFORK["FRESH_TRANSACTION_DB"], itself "auto").
- A failing session keeps its databases (settings.PGFORK["KEEP_ON_FAILURE"]);
  a failing transactional test keeps its fresh database.

The server: --pgfork-url/--pgfork-token (pgfork's pytest plugin's options),
else $PGFORK_URL/$PGFORK_TOKEN, else settings.PGFORK["URL"]/["TOKEN"].
"""

from __future__ import annotations

import types
from typing import Any, Dict, Generator, Optional, Set, Tuple

import pytest

from . import _core

_state: Dict[str, Any] = {"failed": False}


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("pgfork-django", "pgfork for pytest-django")
    group.addoption("--pgfork-fresh-db", dest="pgfork_fresh_db", default=None, choices=("auto", "yes", "no"),
                    help="a fresh database per transactional test instead of a flush "
                         "(default: settings.PGFORK['FRESH_TRANSACTION_DB'], 'auto')")


def pytest_configure(config: pytest.Config) -> None:
    _core.current_test_failed = lambda: bool(_state["failed"])
    # Fixtures of the plugin registered last win: after pytest-django's
    # (loaded from its entry point, after -p plugins).
    if not config.pluginmanager.has_plugin("pgfork-django-fixtures"):
        holder = types.ModuleType("pgfork_django_fixtures")
        holder.django_db_setup = pgfork_django_db_setup  # type: ignore[attr-defined]
        config.pluginmanager.register(holder, "pgfork-django-fixtures")


def pytest_runtest_setup(item: pytest.Item) -> None:
    _state["failed"] = False


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Generator[None, Any, None]:
    outcome = yield
    report = outcome.get_result()
    if report.when == "call" and report.failed:
        _state["failed"] = True


def _aliases(items: Any) -> Tuple[Optional[Set[str]], Optional[Set[str]]]:
    try:
        from pytest_django.fixtures import _get_databases_for_setup
    except ImportError:  # older pytest-django: every alias, as it does
        return None, None
    aliases, serialized = _get_databases_for_setup(items)
    return set(aliases), set(serialized)


def _client(config: pytest.Config) -> Any:
    def opt(name: str) -> str:
        try:
            return str(config.getoption(name) or "")
        except ValueError:  # pgfork's own plugin disabled (-p no:pgfork)
            return ""

    return _core.make_client(opt("pgfork_url"), opt("pgfork_token"))


def pytest_sessionstart(session: pytest.Session) -> None:
    """--create-db: discard the templates once, in the controller (before
    pytest-xdist starts its workers), so that the first process to need
    each builds it again and the others wait for it."""
    config = session.config
    if hasattr(config, "workerinput") or not config.getoption("create_db", default=False):
        return
    from django.conf import settings

    if not settings.configured:
        return
    from django.db import connections

    if config.getoption("nomigrations", default=False):
        from pytest_django.fixtures import _disable_migrations

        _disable_migrations()
    client = _client(config)
    for alias in connections:
        if connections[alias].settings_dict.get("TEST", {}).get("MIRROR"):
            continue
        h = _core.template_key(alias)
        try:
            client.discard_template(h)
            _core.log(f"pgfork: --create-db: discarded template {h} of alias {alias!r}")
        except _core.TemplateNotFound:
            pass


@pytest.fixture(scope="session", name="django_db_setup")
def pgfork_django_db_setup(request: pytest.FixtureRequest, django_test_environment: None, django_db_blocker: Any,
                    django_db_use_migrations: bool, django_db_keepdb: bool, django_db_createdb: bool,
                    django_db_modify_db_settings: None) -> Generator[None, None, None]:
    """pytest-django's django_db_setup with pgfork templates and databases."""
    if not django_db_use_migrations:
        from pytest_django.fixtures import _disable_migrations

        _disable_migrations()
    config = request.config
    aliases, serialized = _aliases(request.session.items)
    session = _core.Session(_client(config), verbosity=int(config.option.verbose) + 1)
    fresh = config.getoption("pgfork_fresh_db")
    if fresh:
        session.opts["FRESH_TRANSACTION_DB"] = {"yes": True, "no": False}.get(fresh, "auto")
    with django_db_blocker.unblock():
        try:
            session.setup(aliases=aliases, serialized_aliases=serialized)
        except BaseException:
            session.teardown(keep=False, reason="")
            raise
    if session.fresh:
        _core.install_fresh_transaction_db()
    try:
        yield
    finally:
        _core.uninstall_fresh_transaction_db()
        failed = request.session.testsfailed > 0
        with django_db_blocker.unblock():
            if django_db_keepdb and not django_db_createdb:
                session.teardown(keep=True, reason="--reuse-db")
            elif failed and session.opts["KEEP_ON_FAILURE"]:
                session.teardown(keep=True, reason="the session failed")
            else:
                session.teardown(keep=False, reason="")


