"""``TEST_RUNNER = "pgfork.django.Runner"``: Django's DiscoverRunner with
test databases from `pgfork serve`."""

from __future__ import annotations

from typing import Any, List, Optional

from django.db import connections
from django.test.runner import DiscoverRunner, ParallelTestSuite, _init_worker

from . import _core


def _setup_worker_connection(creation: Any, worker_id: int) -> None:
    """A --parallel worker's databases: the one the runner took from the pool
    for this worker (recorded in the settings), instead of Django's clone
    named NAME_<worker>."""
    sd = creation.connection.settings_dict
    workers = sd.get(_WORKERS)
    if not workers:
        return _django_setup_worker_connection(creation, worker_id)
    values = workers[worker_id - 1]
    creation.connection.close()
    sd.update(values)
    return None


_WORKERS = "PGFORK_DJANGO_WORKERS"
_django_setup_worker_connection: Any = None


def _pgfork_init_worker(*args: Any, **kwargs: Any) -> None:
    """Django's _init_worker with _setup_worker_connection; also (for the
    spawn start method) the fresh-database patch in the new process."""
    global _django_setup_worker_connection
    from django.db.backends.base.creation import BaseDatabaseCreation

    if _django_setup_worker_connection is None:
        _django_setup_worker_connection = BaseDatabaseCreation.setup_worker_connection
        BaseDatabaseCreation.setup_worker_connection = _setup_worker_connection  # type: ignore[method-assign]
    _init_worker(*args, **kwargs)
    if any((connections[a].settings_dict.get(_core.INFO) or {}).get("fresh") for a in connections):
        _core.install_fresh_transaction_db()


class PgforkParallelTestSuite(ParallelTestSuite):
    """ParallelTestSuite whose workers take the databases the runner got from
    the pgfork pool."""

    init_worker = _pgfork_init_worker


class PgforkRunnerMixin:
    """The test databases of a Django test runner from `pgfork serve`, mixed
    into a runner of your own (one that derives from DiscoverRunner, maybe
    through another package's runner)::

        class ProjectRunner(PgforkRunnerMixin, XMLTestRunner):
            ...

    It must come before the runner in the bases. It overrides
    ``setup_databases``, ``run_suite`` and ``teardown_databases`` (calling
    ``super().run_suite``) and sets ``parallel_test_suite``; override those
    in your class only to call ``super()``. :class:`Runner` is this mixin on
    DiscoverRunner.
    """

    parallel_test_suite = PgforkParallelTestSuite

    _pgfork: Optional[_core.Session] = None
    _pgfork_result: Any = None
    # DiscoverRunner's, for the type checker.
    verbosity: int
    parallel: int
    keepdb: bool
    debug_sql: bool
    time_keeper: Any

    def setup_databases(self, **kwargs: Any) -> List[Any]:
        session = _core.Session(verbosity=self.verbosity)
        self._pgfork = session
        try:
            workers = session.setup(aliases=kwargs.get("aliases"), serialized_aliases=kwargs.get("serialized_aliases"),
                                    parallel=self.parallel, timed=self.time_keeper.timed)
        except BaseException:
            session.teardown(keep=False, reason="")
            raise
        for alias, values in workers.items():
            connections[alias].settings_dict[_WORKERS] = values
        if session.fresh:
            _core.install_fresh_transaction_db()
        if self.debug_sql:
            for alias in connections:
                connections[alias].force_debug_cursor = True
        return []

    def run_suite(self, suite: Any, **kwargs: Any) -> Any:
        self._pgfork_result = super().run_suite(suite, **kwargs)  # type: ignore[misc]
        return self._pgfork_result

    def teardown_databases(self, old_config: Any, **kwargs: Any) -> None:
        session = self._pgfork
        if session is None:
            return
        self._pgfork = None
        _core.uninstall_fresh_transaction_db()
        for alias in connections:
            connections[alias].settings_dict.pop(_WORKERS, None)
        result = self._pgfork_result
        failed = result is None or not result.wasSuccessful()
        if failed and session.opts["KEEP_ON_FAILURE"]:
            session.teardown(keep=True, reason="the run failed")
        else:
            if self.keepdb and self.verbosity >= 1:
                # Keeping them would fill the pool, and the server may hand a
                # database out again once nothing uses it: a later run could
                # not rely on finding it as this one left it.
                _core.log("pgfork: --keepdb: the template (the migrated schema) is kept and reused by the next run; "
                          "the test databases are given back")
            session.teardown(keep=False, reason="")

class Runner(PgforkRunnerMixin, DiscoverRunner):
    """DiscoverRunner with the test databases from `pgfork serve`:

    - one pgfork template per distinct test database, keyed by the migration
      files of every installed app, the models' state, the settings that
      shape the schema and ``settings.PGFORK["EXTRA_KEY"]``; built with
      `migrate` by the first run that needs it, reused by later runs and
      other checkouts; a changed migration or model is a new template;
    - the run's databases (and, with --parallel N, one per worker) come from
      the pool, in milliseconds, instead of CREATE DATABASE and clones;
    - TransactionTestCase tests get a fresh database each instead of a
      flush (``settings.PGFORK["FRESH_TRANSACTION_DB"]``, default "auto");
    - after a passing run the databases are given back to be recreated;
      after a failing run (``KEEP_ON_FAILURE``) they are kept and their URLs
      printed with the password masked. ``--keepdb`` keeps what Django's
      keeps to save time, the migrated schema: the template, which every run
      reuses anyway; the run's databases are given back as without it.

    Settings: ``PGFORK = {"URL", "TOKEN", "EXTRA_KEY", "FRESH_TRANSACTION_DB",
    "FRESH_MIN_TABLES", "KEEP_ON_FAILURE"}``; $PGFORK_URL and $PGFORK_TOKEN
    win over URL and TOKEN; with none, a `pgfork serve` is started for the
    run (pgfork.server).

    A project with a runner of its own subclasses this one (or, when its
    runner derives from another package's, mixes in
    :class:`PgforkRunnerMixin`).
    """
