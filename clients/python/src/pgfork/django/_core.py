"""What the Django runner and the pytest-django plugin share: template keys,
building a template with `migrate`, pointing connections at pgfork databases,
giving them back (or keeping them), and fresh databases per
TransactionTestCase."""

from __future__ import annotations

import hashlib
import os
import re
import sys
import time
from importlib import import_module
from pathlib import Path
from typing import Any, Callable, Dict, Iterable, List, Optional, Tuple

import django
from django.apps import apps
from django.conf import settings
from django.db import connections

from ..client import Client, PgforkError, DatabaseConfig, TemplateAlreadyInitialized, TemplateNotFound, TestDatabase
from ..hashing import template_hash

#: Key in a connection's settings dict under which the runner records the
#: pgfork server, template and hand-out of the database it points at. It
#: travels to --parallel workers with the settings (fork and spawn).
INFO = "PGFORK_DJANGO"

_CONN_KEYS = ("NAME", "HOST", "PORT", "USER", "PASSWORD", "OPTIONS")

DEFAULTS: Dict[str, Any] = {
    "URL": "",  # else $PGFORK_URL, else $INTEGRESQL_CLIENT_BASE_URL, else the run's own pgfork serve
    "TOKEN": "",  # else $PGFORK_TOKEN
    "EXTRA_KEY": "",  # hashed into every template key: change it to rebuild
    # A fresh database per TransactionTestCase test instead of a flush:
    # True, False, or "auto": on when the test database has at least
    # FRESH_MIN_TABLES tables (a flush truncates every table and reruns the
    # post_migrate handlers; a fresh database costs the same for any size).
    "FRESH_TRANSACTION_DB": "auto",
    "FRESH_MIN_TABLES": 8,
    "KEEP_ON_FAILURE": True,  # keep the databases of a failing run (URLs printed, password masked)
    "PG": "",  # else $PGFORK_PG: the PostgreSQL major of the run's own pgfork serve, e.g. "17"
}


def options() -> Dict[str, Any]:
    """settings.PGFORK over the defaults; unknown keys are an error."""
    user = getattr(settings, "PGFORK", None) or {}
    unknown = sorted(set(user) - set(DEFAULTS))
    if unknown:
        from django.core.exceptions import ImproperlyConfigured

        raise ImproperlyConfigured(f"settings.PGFORK: unknown key(s) {', '.join(unknown)}; "
                                   f"known: {', '.join(sorted(DEFAULTS))}")
    return {**DEFAULTS, **user}


def make_client(url: str = "", token: str = "") -> Client:
    """A client for the server named by url/token, else the environment
    ($PGFORK_URL, $PGFORK_TOKEN), else settings.PGFORK; with none, the
    `pgfork serve` of the run (pgfork.server.server_for_run: proven by its
    record in the state directory, else started; its PostgreSQL major
    $PGFORK_PG, else settings.PGFORK["PG"])."""
    opts = options()
    api_version = None
    url = url or os.environ.get("PGFORK_URL") or opts["URL"]
    if not url and os.environ.get("INTEGRESQL_CLIENT_BASE_URL"):
        url = os.environ["INTEGRESQL_CLIENT_BASE_URL"]
        if not url.rstrip("/").endswith("/api/v2"):
            api_version = 1
    token = token or os.environ.get("PGFORK_TOKEN") or opts["TOKEN"]
    from ..server import server_for_run

    major = os.environ.get("PGFORK_PG") or str(opts["PG"] or "")
    base = getattr(settings, "BASE_DIR", None)  # the project, as startproject writes it
    s = server_for_run(url, token or None, progress=log, major=major, project=Path(base) if base else None)
    return Client(s.url, token=s.token, api_version=api_version)


def masked_url(config: DatabaseConfig) -> str:
    """config.url with the password shown as ***."""
    import urllib.parse

    url = config.url
    if config.password:
        url = url.replace(":" + urllib.parse.quote(config.password, safe="") + "@", ":***@")
    return url


# ---------------------------------------------------------------- template keys

_ADDR = re.compile(r" at 0x[0-9a-fA-F]+")


def _stable(value: Any) -> str:
    """value as makemigrations would write it (stable across processes), else
    its repr without memory addresses."""
    from django.db.migrations.serializer import serializer_factory

    try:
        return serializer_factory(value).serialize()[0]
    except Exception:
        return _ADDR.sub("", repr(value))


def _dir_digest(root: Path) -> str:
    h = hashlib.sha256()
    files: List[str] = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if not d.startswith(".") and d != "__pycache__")
        for name in filenames:
            if not name.startswith(".") and not name.endswith((".pyc", ".pyo")):
                files.append(Path(dirpath, name).relative_to(root).as_posix())
    for rel in sorted(files):
        data = (root / rel).read_bytes()
        h.update(f"{rel}\n{len(data)}\n".encode())
        h.update(data)
    return h.hexdigest()


def migration_files_key() -> List[str]:
    """One line per installed app: its label, migrations module and a digest
    of every file in that module's directory."""
    from django.db.migrations.loader import MigrationLoader

    lines = []
    for app in apps.get_app_configs():
        module_name, _ = MigrationLoader.migrations_module(app.label)
        digest = "-"
        if module_name:
            try:
                module = import_module(module_name)
            except ImportError:
                module = None
            path = getattr(module, "__file__", None) if module else None
            if path:
                digest = _dir_digest(Path(path).parent)
            elif module is not None and getattr(module, "__path__", None):
                digest = "|".join(_dir_digest(Path(p)) for p in module.__path__)
        lines.append(f"app {app.label} {app.name} {module_name} {digest}")
    return lines


def model_state_key() -> List[str]:
    """One line per model: its fields, options and bases as makemigrations
    sees them (catches model changes that have no migration yet, and apps
    without migrations, which Django creates with syncdb)."""
    from django.db.migrations.state import ModelState

    lines = []
    for model in sorted(apps.get_models(include_auto_created=True), key=lambda m: m._meta.label_lower):
        ms = ModelState.from_model(model)
        fields = ";".join(f"{name}={_stable(field)}" for name, field in ms.fields.items())
        lines.append(f"model {ms.app_label}.{ms.name} {fields} options={_stable(ms.options)} "
                     f"bases={_stable(ms.bases)}")
    return lines


def template_key(alias: str, extra_key: Optional[str] = None) -> str:
    """The pgfork template hash of alias's test database: migration files of
    every installed app, the models' state, the settings that shape the
    schema (engine, TEST options, OPTIONS, routers, MIGRATION_MODULES, the
    Django version) and settings.PGFORK["EXTRA_KEY"]."""
    sd = connections[alias].settings_dict
    test = sd.get("TEST") or {}
    parts = [
        "pgfork-django-template/1",
        f"django {django.get_version()}",
        f"alias {alias}",
        f"engine {sd.get('ENGINE')}",
        f"options {_stable(sorted((k, v) for k, v in (sd.get('OPTIONS') or {}).items()))}",
        f"test {_stable(sorted((k, v) for k, v in test.items() if k in ('CHARSET', 'COLLATION', 'MIGRATE', 'TEMPLATE')))}",
        f"routers {_stable(list(getattr(settings, 'DATABASE_ROUTERS', [])))}",
        f"migration_modules {_stable(sorted((getattr(settings, 'MIGRATION_MODULES', {}) or {}).items()))}",
        *migration_files_key(),
        *model_state_key(),
    ]
    extra = options()["EXTRA_KEY"] if extra_key is None else extra_key
    return template_hash(None, "\n".join(parts) + "\nextra " + str(extra))


# ------------------------------------------------------------- connections


def conn_settings(config: DatabaseConfig, base: Dict[str, Any]) -> Dict[str, Any]:
    """The connection keys of a settings dict for config (OPTIONS: base's
    with the server's additional parameters)."""
    return {
        "NAME": config.database,
        "HOST": config.host,
        "PORT": str(config.port) if config.port else "",
        "USER": config.username,
        "PASSWORD": config.password,
        "OPTIONS": {**(base.get("OPTIONS") or {}), **config.additional_params},
    }


def point(alias: str, values: Dict[str, Any]) -> None:
    """Point alias's connection (and settings.DATABASES[alias]) at values, in
    place so that every thread's connection follows (as Django's
    setup_worker_connection does)."""
    conn = connections[alias]
    conn.close()
    conn.settings_dict.update(values)
    db = settings.DATABASES.get(alias)
    if db is not None and db is not conn.settings_dict:
        db.update(values)


def saved(alias: str) -> Dict[str, Any]:
    sd = connections[alias].settings_dict
    return {k: sd[k] for k in (*_CONN_KEYS, INFO) if k in sd}


def restore(alias: str, values: Dict[str, Any]) -> None:
    conn = connections[alias]
    conn.close()
    for sd in {id(x): x for x in (conn.settings_dict, settings.DATABASES.get(alias)) if x is not None}.values():
        sd.pop(INFO, None)
        sd.update(values)


def log(msg: str) -> None:
    sys.stderr.write(msg + os.linesep)
    sys.stderr.flush()


class Held:
    """A test database handed out to this process, and the aliases pointed at it."""

    def __init__(self, client: Client, db: TestDatabase, aliases: List[str], what: str) -> None:
        self.client = client
        self.db = db
        self.aliases = aliases
        self.what = what

    def give_back(self, keep: bool, reason: str = "") -> None:
        if keep:
            log(f"pgfork: {reason}: keeping {self.what} for alias(es) {', '.join(repr(a) for a in self.aliases)}: "
                f"{masked_url(self.db.config)}")
            try:  # out of the pool's count, so kept databases do not fill it; IntegreSQL has no keep
                self.client.keep(self.db)
            except PgforkError:
                pass
            return
        try:
            self.client.recreate(self.db)
        except Exception as e:  # the server may have reclaimed it; never hide the run's result
            log(f"pgfork: giving back {self.db.config.database} failed: {e}")


class Session:
    """The templates and databases of one test run (or one xdist worker)."""

    def __init__(self, client: Optional[Client] = None, verbosity: int = 1) -> None:
        self.client = client or make_client()
        self.verbosity = verbosity
        self.opts = options()
        self.held: List[Held] = []
        self.saved: Dict[str, Dict[str, Any]] = {}
        self.hashes: Dict[str, str] = {}
        self.fresh = False

    # -- templates

    def build(self, alias: str) -> str:
        """The template of alias, built now with `migrate` unless some run
        built (or is building) it."""
        h = template_key(alias)
        try:
            tpl = self.client.initialize_template(h)
        except TemplateAlreadyInitialized:
            if self.verbosity >= 1:
                log(f"pgfork: using template {h} for alias {alias!r} (migrated before)")
            self.hashes[alias] = h
            return h
        t0 = time.monotonic()
        if self.verbosity >= 1:
            log(f"pgfork: building template {h} for alias {alias!r} (migrate)...")
        before = saved(alias)
        try:
            point(alias, conn_settings(tpl.config, connections[alias].settings_dict))
            migrate(alias, self.verbosity)
            connections[alias].close()
        except BaseException:
            restore(alias, before)
            try:
                self.client.discard_template(h)  # waiting runs fail at once instead of timing out
            except Exception:
                pass
            raise
        restore(alias, before)
        self.client.finalize_template(h)
        if self.verbosity >= 1:
            log(f"pgfork: built template {h} for alias {alias!r} in {time.monotonic() - t0:.2f} s")
        self.hashes[alias] = h
        return h

    def take(self, alias: str, what: str) -> Tuple[Held, Dict[str, Any]]:
        """A database from alias's template: (its hold, its settings values)."""
        h = self.hashes[alias]
        td = self.client.get_test_database(h)
        base = connections[alias].settings_dict
        values = conn_settings(td.config, base)
        values[INFO] = {"url": self.client.base_url, "token": self.client.token, "api": self.client.api_version,
                        "hash": h, "fresh": self.fresh}
        held = Held(self.client, td, [], what)
        self.held.append(held)
        return held, values

    def setup(self, aliases: Optional[Iterable[str]] = None, serialized_aliases: Optional[Iterable[str]] = None,
              parallel: int = 0, timed: Optional[Callable[[str], Any]] = None) -> Dict[str, List[Dict[str, Any]]]:
        """Django's setup_databases with pgfork databases: a template per
        distinct test database (built once), a database from the pool for
        each, same-database aliases and TEST MIRRORs pointed at it, and with
        parallel > 1 one more database per worker. Returns the workers'
        settings: {alias: [worker 1's values, ...]}. timed(name) is a
        context manager timing a step (Django's TimeKeeper.timed)."""
        import contextlib

        step = timed or (lambda name: contextlib.nullcontext())
        from django.test.utils import get_unique_databases_and_mirrors

        test_databases, mirrored = get_unique_databases_and_mirrors(aliases)
        groups: List[List[str]] = [list(a) for _, a in test_databases.values()]
        for group in groups:
            for alias in group:
                self.saved.setdefault(alias, saved(alias))
            with step(f"  pgfork template of {group[0]!r}"):
                self.build(group[0])
        for alias in mirrored:
            self.saved.setdefault(alias, saved(alias))
        mains: List[Tuple[List[str], Held]] = []
        for group in groups:
            held, values = self.take(group[0], "the test database")
            for alias in group + [m for m, target in mirrored.items() if target in group]:
                held.aliases.append(alias)
                point(alias, values)
            mains.append((group, held))
            if self.verbosity >= 1:
                log(f"pgfork: alias(es) {', '.join(repr(a) for a in held.aliases)} -> "
                    f"{held.db.config.database} (template {self.hashes[group[0]]})")
        self.fresh = self._decide_fresh([g[0] for g in groups])
        for group in groups:
            connections[group[0]].settings_dict[INFO]["fresh"] = self.fresh
        workers: Dict[str, List[Dict[str, Any]]] = {}
        for group, held in mains:
            for index in range(parallel if parallel > 1 else 0):
                with step(f"  pgfork worker {index + 1}'s database for {group[0]!r}"):
                    wheld, wvalues = self.take(group[0], f"worker {index + 1}'s database")
                wheld.aliases.extend(held.aliases)
                if self.verbosity >= 1:
                    log(f"pgfork: worker {index + 1}: alias(es) {', '.join(repr(a) for a in held.aliases)} -> "
                        f"{wheld.db.config.database}")
                for alias in held.aliases:
                    workers.setdefault(alias, []).append(wvalues)
            if serialized_aliases is None or group[0] in serialized_aliases:
                conn = connections[group[0]]
                conn._test_serialized_contents = conn.creation.serialize_db_to_string()
        return workers

    def _decide_fresh(self, aliases: List[str]) -> bool:
        mode = self.opts["FRESH_TRANSACTION_DB"]
        if mode is True or mode is False:
            return mode
        if str(mode).lower() != "auto":
            from django.core.exceptions import ImproperlyConfigured

            raise ImproperlyConfigured(f"settings.PGFORK['FRESH_TRANSACTION_DB'] = {mode!r}: want True, False "
                                       "or 'auto'")
        # auto: by the number of tables a flush would truncate.
        most = 0
        for alias in aliases:
            with connections[alias].cursor() as cursor:
                most = max(most, len(connections[alias].introspection.table_names(cursor)))
            connections[alias].close()
        fresh = most >= int(self.opts["FRESH_MIN_TABLES"])
        if self.verbosity >= 2:
            log(f"pgfork: {most} tables: each TransactionTestCase test gets "
                f"{'a fresh database' if fresh else 'a flush'}")
        return fresh

    def teardown(self, keep: bool, reason: str) -> None:
        """Give every held database back (or keep them, printing their URLs
        with the password masked) and restore the settings."""
        for held in self.held:
            held.give_back(keep, reason)
        self.held = []
        for alias, values in self.saved.items():
            restore(alias, values)
        self.saved = {}


def migrate(alias: str, verbosity: int) -> None:
    """What Django's create_test_db runs on a new test database: migrate
    (syncdb for apps without migrations, or all apps with TEST MIGRATE
    False) and createcachetable."""
    from django.core.management import call_command

    conn = connections[alias]
    no_migrate = conn.settings_dict.get("TEST", {}).get("MIGRATE") is False
    old = settings.MIGRATION_MODULES
    if no_migrate:
        settings.MIGRATION_MODULES = {app.label: None for app in apps.get_app_configs()}
    try:
        call_command("migrate", verbosity=max(verbosity - 1, 0), interactive=False, database=alias,
                     run_syncdb=True)
    finally:
        if no_migrate:
            settings.MIGRATION_MODULES = old
    call_command("createcachetable", database=alias)


# ------------------------------------------- fresh database per TransactionTestCase


def result_failures(result: Any) -> int:
    """Failures and errors so far in a unittest result (or Django's
    RemoteTestResult in --parallel workers, which records events, or the
    pytest item running a unittest class)."""
    events = getattr(result, "events", None)
    if "_excinfo" in getattr(result, "__dict__", {}):  # pytest's unittest item
        return len(result._excinfo or ())
    if events is not None:
        return sum(1 for e in events if e[0] in ("addError", "addFailure", "addUnexpectedSuccess")
                   or (e[0] == "addSubTest" and len(e) > 3 and e[-1] is not None))
    return sum(len(getattr(result, n, ())) for n in ("failures", "errors", "unexpectedSuccesses"))


#: Set by whoever runs the tests: returns True if the current test failed.
current_test_failed: Callable[[], bool] = lambda: False

_patched: Dict[str, Any] = {}
_active: List[Tuple[List[Held], Dict[str, Dict[str, Any]]]] = []


def _client_for(info: Dict[str, Any]) -> Client:
    return Client(info["url"], token=info.get("token") or None, api_version=info.get("api") or None)


def _fresh_in(cls: Any) -> None:
    """Point cls's databases (and every alias that shares them) at fresh
    databases from their templates."""
    if not getattr(cls, "pgfork_fresh_db", True):
        _active.append(([], {}))
        return
    helds: List[Held] = []
    before: Dict[str, Dict[str, Any]] = {}
    try:
        for alias in cls._databases_names(include_mirrors=False):
            info = connections[alias].settings_dict.get(INFO)
            if not info or not info.get("fresh"):
                continue
            if alias in before:
                continue
            name = connections[alias].settings_dict["NAME"]
            sharing = [a for a in connections if connections[a].settings_dict.get("NAME") == name
                       and connections[a].settings_dict.get(INFO)]
            client = _client_for(info)
            td = client.get_test_database(info["hash"])
            values = {**conn_settings(td.config, connections[alias].settings_dict), INFO: info}
            helds.append(Held(client, td, sharing, "its fresh database"))
            for a in sharing:
                before[a] = saved(a)
                point(a, values)
    except BaseException:
        _fresh_out(helds, before, keep=False, reason="")
        raise
    _active.append((helds, before))


def _fresh_out(helds: List[Held], before: Dict[str, Dict[str, Any]], keep: bool, reason: str) -> None:
    for alias, values in before.items():
        restore(alias, values)
    for held in helds:
        held.give_back(keep, reason)


def install_fresh_transaction_db() -> None:
    """Patch TransactionTestCase (not TestCase) so that each test runs on a
    fresh database from the pool instead of being followed by a flush, for
    the aliases whose settings say fresh (Session.setup records that).
    serialized_rollback needs no reload then: the database is the
    template's. A test class can opt out with ``pgfork_fresh_db = False``."""
    if _patched:
        return
    from django.test import TestCase, TransactionTestCase
    from django.test.testcases import SimpleTestCase

    pre = TransactionTestCase.__dict__["_pre_setup"]
    teardown = TransactionTestCase.__dict__["_fixture_teardown"]
    call = SimpleTestCase.__dict__["_setup_and_call"]
    _patched.update(pre=pre, teardown=teardown, call=call)
    pre_func = pre.__func__ if isinstance(pre, classmethod) else pre

    def _pre_setup(cls_or_self: Any) -> None:
        cls = cls_or_self if isinstance(cls_or_self, type) else type(cls_or_self)
        if issubclass(cls, TestCase):
            return pre_func(cls_or_self)
        _fresh_in(cls)
        helds, _ = _active[-1]
        hidden = {}
        if helds:  # the database is the template's: nothing to reload
            for held in helds:
                for a in held.aliases:
                    c = connections[a]
                    if hasattr(c, "_test_serialized_contents"):
                        hidden[a] = c._test_serialized_contents
                        del c._test_serialized_contents
        try:
            pre_func(cls_or_self)
        except BaseException:
            helds, before = _active.pop()
            _fresh_out(helds, before, keep=False, reason="")
            raise
        finally:
            for a, v in hidden.items():
                connections[a]._test_serialized_contents = v

    def _fixture_teardown(self: Any) -> None:
        if not _active or not _active[-1][0]:
            if _active:
                _active.pop()
            return teardown(self)
        helds, before = _active.pop()
        for conn in connections.all(initialized_only=True):
            conn.close()
        failed = current_test_failed()
        _fresh_out(helds, before, keep=failed, reason=f"{self.id()} failed")
        return None

    def _setup_and_call(self: Any, result: Any, debug: bool = False) -> Any:
        global current_test_failed
        if result is None or isinstance(self, TestCase) or not isinstance(self, TransactionTestCase):
            return call(self, result, debug)
        n = result_failures(result)
        old = current_test_failed
        current_test_failed = lambda: result_failures(result) > n
        try:
            return call(self, result, debug)
        finally:
            current_test_failed = old

    TransactionTestCase._pre_setup = classmethod(_pre_setup) if isinstance(pre, classmethod) else _pre_setup
    TransactionTestCase._fixture_teardown = _fixture_teardown
    SimpleTestCase._setup_and_call = _setup_and_call


def uninstall_fresh_transaction_db() -> None:
    if not _patched:
        return
    from django.test import TransactionTestCase
    from django.test.testcases import SimpleTestCase

    TransactionTestCase._pre_setup = _patched["pre"]
    TransactionTestCase._fixture_teardown = _patched["teardown"]
    SimpleTestCase._setup_and_call = _patched["call"]
    _patched.clear()
