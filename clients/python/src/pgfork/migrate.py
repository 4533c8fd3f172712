"""Default migrations: the .sql files of a directory, in name order; the
Migrator protocol that other migration tools' adapters implement."""

from __future__ import annotations

from pathlib import Path
from types import ModuleType
from typing import Optional, Protocol

from .hashing import StrPath, template_hash


def psycopg_module() -> ModuleType:
    """psycopg 3, imported on first use: the package works without it (the
    client and hashing need only the standard library) until a connection is
    needed."""
    try:
        import psycopg
    except ImportError as e:
        raise ImportError("pgfork needs psycopg 3 to connect to databases: "
                          "install it with the extra, pip install 'pgfork[psycopg]'") from e
    return psycopg


def run_sql_files(url: str, directory: Optional[StrPath]) -> None:
    """Run the *.sql files directly in directory, in name order, each as one batch."""
    if not directory:
        return
    files = sorted(Path(directory).glob("*.sql"))
    psycopg = psycopg_module()
    with psycopg.connect(url, autocommit=True) as conn:
        for f in files:
            sql = f.read_text(encoding="utf-8")
            if not sql.strip():
                continue
            try:
                conn.execute(sql.encode("utf-8"))
            except psycopg.Error as e:
                raise RuntimeError(f"{f.name}: {e}") from e


class Migrator(Protocol):
    """How a template is keyed and built: the pytest plugin asks for
    template_hash(extra_key) and, if no process built that template yet, runs
    migrate(url) against it. SQLFiles is the default; pgfork.alembic's
    AlembicMigrator runs Alembic."""

    def template_hash(self, extra_key: str = "") -> str:
        """The template key (32 hex digits) of these migrations and extra_key."""
        ...

    def migrate(self, url: str) -> None:
        """Migrate the empty template database at url (postgres://…)."""
        ...


class SQLFiles:
    """The default Migrator: every file under directory is hashed (template_hash,
    the same key as the other pgfork clients), its *.sql files are run in name
    order (run_sql_files). directory None: an empty template."""

    def __init__(self, directory: Optional[StrPath]) -> None:
        self.directory = directory

    def template_hash(self, extra_key: str = "") -> str:
        return template_hash(self.directory, extra_key)

    def migrate(self, url: str) -> None:
        run_sql_files(url, self.directory)

    def __repr__(self) -> str:
        return f"SQLFiles({str(self.directory) if self.directory else None!r})"
