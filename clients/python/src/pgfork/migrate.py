"""Default migrations: the .sql files of a directory, in name order."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import psycopg

from .hashing import StrPath


def run_sql_files(url: str, directory: Optional[StrPath]) -> None:
    """Run the *.sql files directly in directory, in name order, each as one batch."""
    if not directory:
        return
    files = sorted(Path(directory).glob("*.sql"))
    with psycopg.connect(url, autocommit=True) as conn:
        for f in files:
            sql = f.read_text(encoding="utf-8")
            if not sql.strip():
                continue
            try:
                conn.execute(sql.encode("utf-8"))
            except psycopg.Error as e:
                raise RuntimeError(f"{f.name}: {e}") from e
