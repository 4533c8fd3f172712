"""Default migrations: the .sql files of a directory, in name order."""

from __future__ import annotations

from pathlib import Path
from types import ModuleType
from typing import Optional

from .hashing import StrPath


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
