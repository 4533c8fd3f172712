"""Alembic adapter: templates keyed by an Alembic project's revisions, built by
``alembic upgrade head``.

Install with the extra: ``pip install 'pgfork[alembic]'`` (Alembic,
SQLAlchemy and psycopg 3; the URL's driver is ``postgresql+psycopg``).

The template key (:meth:`AlembicMigrator.template_hash`) is
:func:`pgfork.hashing.files_hash` over

- ``env.py`` of the script location (named ``env.py``),
- every file under each version location (``versions/`` by default; named by
  their path below the script location, or ``version_locations/N/…`` for a
  location outside it), except ``__pycache__`` directories, ``*.pyc``/``*.pyo``
  and names starting with ".",

then a key text: ``alembic``, the target revision, the ``-x`` arguments given,
and every option of the config's main section (``[alembic]`` of alembic.ini,
``[tool.alembic]`` of pyproject.toml) as written (``%(here)s`` not expanded,
so the key is the same in every checkout) except those that only
``alembic revision`` or the database URL use: ``sqlalchemy.url``,
``file_template``, ``timezone``, ``truncate_slug_length``,
``revision_environment``, ``output_encoding``, ``post_write_hooks``.
The logging sections are not hashed, nor is code the revisions import from
your application: change the extra key when such code changes the schema.

The contract with ``env.py`` (:meth:`AlembicMigrator.migrate`): the upgrade
runs in the process, as ``alembic upgrade head`` run from the config file's
directory (relative ``script_location``, ``version_locations`` and
``prepend_sys_path`` are relative to it), with the template's URL, as
``postgresql+psycopg://…``, in three places at once: the main option
``sqlalchemy.url`` (what the ``env.py`` that ``alembic init`` writes reads,
through ``config.get_main_option`` or ``engine_from_config``), the ``-x``
argument ``url`` (``context.get_x_argument(as_dictionary=True)["url"]``), and,
if ``url_env`` names one, that environment variable (set for the upgrade only,
then restored). An ``env.py`` that gets its URL any other way (application
settings) must be changed to read one of these. ``config.attributes["pgfork"]``
is True in a pgfork build. The logging configuration that ``env.py`` loads
with ``fileConfig`` is undone after the upgrade, so pytest's log capture and
your application's loggers keep working (but the handlers it closed stay
closed: pytest's ``--log-file`` stops; skip ``fileConfig`` when
``config.attributes.get("pgfork")`` if you use it).

A failed upgrade raises :class:`AlembicUpgradeError`, which names the revision
that failed (its id, message and file) and the error.
"""

from __future__ import annotations

import argparse
import configparser
import json
import logging
import os
import sys
import traceback
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Dict, Iterator, List, Optional, Sequence, Tuple

from .hashing import StrPath, files_hash, tree_files

__all__ = ["AlembicMigrator", "AlembicUpgradeError", "sqlalchemy_url"]

# Main-section options that do not change what `alembic upgrade` builds.
_UNHASHED = frozenset({"sqlalchemy.url", "file_template", "timezone", "truncate_slug_length",
                       "revision_environment", "output_encoding", "post_write_hooks"})


def _alembic() -> Any:
    try:
        import alembic.command  # noqa: F401
        import alembic.config  # noqa: F401
        import alembic.script  # noqa: F401
    except ImportError as e:
        raise ImportError("pgfork.alembic needs Alembic and SQLAlchemy: install the extra, "
                          "pip install 'pgfork[alembic]'") from e
    import alembic
    return alembic


def sqlalchemy_url(url: str) -> str:
    """url (postgres:// or postgresql://, as pgfork hands out) as a SQLAlchemy
    URL with the psycopg 3 driver: ``postgresql+psycopg://…`` (the rest,
    percent-encoding included, unchanged)."""
    for scheme in ("postgres://", "postgresql://"):
        if url.startswith(scheme):
            return "postgresql+psycopg://" + url[len(scheme):]
    return url


class AlembicUpgradeError(RuntimeError):
    """``alembic upgrade`` failed. ``revision`` is the id of the revision whose
    code raised (None if the error came from elsewhere: env.py, Alembic, the
    final commit), ``path`` its file, ``error`` the original exception."""

    def __init__(self, message: str, revision: Optional[str], path: Optional[Path], error: BaseException) -> None:
        super().__init__(message)
        self.revision = revision
        self.path = path
        self.error = error


@contextmanager
def _chdir(directory: Path) -> Iterator[None]:
    old = os.getcwd()
    os.chdir(directory)
    try:
        yield
    finally:
        os.chdir(old)


@contextmanager
def _env(name: str, value: str) -> Iterator[None]:
    if not name:
        yield
        return
    old = os.environ.get(name)
    os.environ[name] = value
    try:
        yield
    finally:
        if old is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = old


@contextmanager
def _sys_path(base: Path, keep: bool) -> Iterator[None]:
    """Alembic prepends prepend_sys_path to sys.path each time it reads its
    config: without keep, undo that; with keep (an upgrade, whose env.py may
    import from there), keep the entries added, made absolute against base so
    that they do not follow the working directory."""
    before = list(sys.path)
    try:
        yield
    finally:
        if not keep:
            sys.path[:] = before
        else:
            old = set(before)
            sys.path[:] = [p if p in old or os.path.isabs(p) else str((base / p).resolve()) for p in sys.path]


@contextmanager
def _kept_logging() -> Iterator[None]:
    """Undo what env.py's logging.config.fileConfig does: the root logger's
    level and handlers, and every existing logger's level, handlers,
    propagation and disabled flag (fileConfig disables loggers it does not
    name); loggers it creates are reset to defaults."""
    manager = logging.Logger.manager
    root = logging.getLogger()
    saved_root = (root.level, list(root.handlers))
    saved: Dict[str, Tuple[int, List[logging.Handler], bool, bool]] = {
        name: (lg.level, list(lg.handlers), lg.propagate, lg.disabled)
        for name, lg in list(manager.loggerDict.items()) if isinstance(lg, logging.Logger)
    }
    try:
        yield
    finally:
        root.setLevel(saved_root[0])
        root.handlers[:] = saved_root[1]
        for name, lg in list(manager.loggerDict.items()):
            if not isinstance(lg, logging.Logger):
                continue
            level, handlers, propagate, disabled = saved.get(name, (logging.NOTSET, [], True, False))
            lg.setLevel(level)
            lg.handlers[:] = handlers
            lg.propagate = propagate
            lg.disabled = disabled


def _under(path: Path, dirs: Sequence[Path]) -> bool:
    return any(path == d or d in path.parents for d in dirs)


class AlembicMigrator:
    """A :class:`pgfork.migrate.Migrator` for an Alembic project (see the
    module's documentation for the key and the env.py contract).

    config: the project's alembic.ini, or a pyproject.toml with
    ``[tool.alembic]``; a pyproject.toml beside an alembic.ini is read too, as
    the ``alembic`` command does. Alembic runs as if from config's directory.
    revision: the upgrade target (``head``; ``heads`` for several branches).
    x_arguments: more ``-x`` arguments (``"key=value"``) for env.py; hashed.
    url_env: an environment variable env.py reads the URL from (e.g.
    ``DATABASE_URL``), set during the upgrade. ini_section: the main section
    of alembic.ini (``alembic -n NAME``)."""

    def __init__(self, config: StrPath = "alembic.ini", *, revision: str = "head",
                 x_arguments: Sequence[str] = (), url_env: str = "", ini_section: str = "alembic") -> None:
        path = Path(config).resolve()
        if not path.is_file():
            raise FileNotFoundError(f"pgfork.alembic: no Alembic config at {path} "
                                    "(give the path of alembic.ini or of a pyproject.toml with [tool.alembic])")
        self.directory = path.parent
        if path.name == "pyproject.toml":
            self.ini_file: Optional[Path] = None
            self.toml_file: Optional[Path] = path
        else:
            self.ini_file = path
            beside = path.parent / "pyproject.toml"
            self.toml_file = beside if beside.is_file() else None
        self.revision = revision
        self.x_arguments = list(x_arguments)
        self.url_env = url_env
        self.ini_section = ini_section

    def __repr__(self) -> str:
        return f"AlembicMigrator({str(self.ini_file or self.toml_file)!r}, revision={self.revision!r})"

    def _config(self, url: Optional[str] = None) -> Any:
        alembic = _alembic()
        x = list(self.x_arguments) + ([f"url={url}"] if url else [])
        cfg = alembic.config.Config(file_=str(self.ini_file) if self.ini_file else None,
                                    toml_file=str(self.toml_file) if self.toml_file else None,
                                    ini_section=self.ini_section, cmd_opts=argparse.Namespace(x=x))
        if url:
            cfg.set_main_option("sqlalchemy.url", url.replace("%", "%%"))
        cfg.attributes["pgfork"] = True  # env.py may tell a pgfork build from a CLI run
        return cfg

    def _locations(self) -> Tuple[Path, List[Path]]:
        """The script directory and the version locations, resolved as Alembic
        resolves them (run from self.directory)."""
        alembic = _alembic()
        with _chdir(self.directory), _sys_path(self.directory, keep=False):
            cfg = self._config()
            script = alembic.script.ScriptDirectory.from_config(cfg)
            base = Path(script.dir).resolve()
            listed = cfg.get_version_locations_list()
            locations = [Path(p).resolve() for p in listed] if listed else [base / "versions"]
        return base, locations

    def files(self) -> List[Tuple[str, Path]]:
        """The (name, path) pairs the template key hashes, in name order."""
        base, locations = self._locations()
        env = base / "env.py"
        if not env.is_file():
            raise FileNotFoundError(f"pgfork.alembic: no env.py in the script location {base}")
        found = {"env.py": env}
        for i, loc in enumerate(locations):
            if not loc.is_dir():
                continue  # Alembic skips a missing location too
            prefix = loc.relative_to(base).as_posix() if _under(loc, [base]) else f"version_locations/{i}"
            for rel in tree_files(loc):
                parts = rel.split("/")
                if "__pycache__" in parts or rel.endswith((".pyc", ".pyo")):
                    continue
                found[f"{prefix}/{rel}"] = loc / rel
        return sorted(found.items(), key=lambda kv: kv[0].encode("utf-8"))

    def _options(self) -> Dict[str, Any]:
        """The main section's options as written, less the unhashed ones."""
        opts: Dict[str, Any] = {}
        if self.toml_file is not None:
            if sys.version_info >= (3, 11):
                import tomllib
            else:  # Alembic depends on tomli before 3.11
                import tomli as tomllib
            data = tomllib.loads(self.toml_file.read_text(encoding="utf-8"))
            opts.update(data.get("tool", {}).get("alembic", {}))
        if self.ini_file is not None:
            parser = configparser.RawConfigParser()
            parser.read(self.ini_file, encoding="utf-8")
            if parser.has_section(self.ini_section):
                opts.update(parser.items(self.ini_section))  # the ini wins, as in Alembic
        return {k: v for k, v in opts.items() if k not in _UNHASHED}

    def key(self) -> str:
        """The text hashed after the files (before the extra key)."""
        lines = ["alembic", f"revision={self.revision}"]
        lines += [f"x={a}" for a in self.x_arguments]
        lines += [f"option {k}={json.dumps(v, sort_keys=True)}" for k, v in sorted(self._options().items())]
        return "\n".join(lines)

    def template_hash(self, extra_key: str = "") -> str:
        """The template key: files() and key(), then extra_key."""
        return files_hash(self.files(), self.key() + "\n" + extra_key)

    def migrate(self, url: str) -> None:
        """``alembic upgrade <revision>`` against url (see the module's
        documentation for how env.py gets the URL); AlembicUpgradeError
        naming the failed revision if it fails."""
        alembic = _alembic()
        sa_url = sqlalchemy_url(url)
        _, locations = self._locations()
        cfg = self._config(sa_url)
        with _chdir(self.directory), _sys_path(self.directory, keep=True), _env(self.url_env, sa_url), \
                _kept_logging():
            try:
                alembic.command.upgrade(cfg, self.revision)
            except Exception as e:
                raise self._error(e, locations) from e

    def _error(self, e: Exception, locations: List[Path]) -> AlembicUpgradeError:
        revision: Optional[str] = None
        message = ""
        path: Optional[Path] = None
        # The innermost frame in a revision file: the revision whose upgrade()
        # (or module code) raised. A revision that does not compile names its
        # file in the SyntaxError.
        for frame, _ in traceback.walk_tb(e.__traceback__):
            p = Path(frame.f_code.co_filename).resolve()
            if _under(p, locations):
                path = p
                rev = frame.f_globals.get("revision")
                revision = None if rev is None else str(rev)
                doc = str(frame.f_globals.get("__doc__") or "").strip()
                message = doc.splitlines()[0] if doc else ""
        if path is None and isinstance(e, SyntaxError) and e.filename:
            p = Path(e.filename).resolve()
            if _under(p, locations):
                path = p
        what = f"alembic upgrade {self.revision}"
        if path is not None:
            shown = os.path.relpath(path, self.directory)
            name = f"revision {revision}" if revision else "a revision"
            where = f"{name} ({shown}{', ' + repr(message) if message else ''})"
            text = f"{what} failed in {where}: {type(e).__name__}: {e}"
        else:
            text = f"{what} failed outside any revision's code (env.py, Alembic or the commit): {type(e).__name__}: {e}"
        return AlembicUpgradeError(text, revision, path, e)
