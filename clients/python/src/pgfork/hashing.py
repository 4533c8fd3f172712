"""Template hashes, the same as the Go client's client.TemplateHash."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path
from typing import Iterable, List, Optional, Tuple, Union

StrPath = Union[str, "os.PathLike[str]"]


def tree_files(root: Path) -> List[str]:
    """The files under root that template_hash hashes: relative paths with
    forward slashes, names starting with "." left out, symlinks to files kept,
    symlinks to directories not followed, sorted by UTF-8 bytes."""
    if not root.is_dir():
        raise FileNotFoundError(f"template hash: {root} is not a directory")
    found: List[str] = []
    for dirpath, dirnames, filenames in os.walk(root, followlinks=False):
        dirnames[:] = [d for d in dirnames if not d.startswith(".")]
        for name in filenames:
            if name.startswith("."):
                continue
            p = Path(dirpath, name)
            if p.is_file():  # follows symlinks to files
                found.append(p.relative_to(root).as_posix())
    # Sort by UTF-8 bytes, as Go's sort.Strings does.
    return sorted(found, key=lambda s: s.encode("utf-8"))


def template_hash(directory: Optional[StrPath] = None, extra_key: str = "") -> str:
    """32 hex digits of a SHA-256 over every file under directory (relative path
    with forward slashes, and content; names starting with "." left out), in
    path order, then extra_key. Equal to the Go client's TemplateHash.

    directory may be a symlink to a directory. Below it, symlinks to files are
    hashed with their target's content, symlinks to directories are not
    followed, and dangling symlinks are left out (as the Go client does)."""
    files: List[Tuple[str, Path]] = []
    if directory:
        root = Path(directory)
        files = [(rel, root / rel) for rel in tree_files(root)]
    return files_hash(files, extra_key)


def files_hash(files: Iterable[Tuple[str, Path]], extra_key: str = "") -> str:
    """template_hash's algorithm over given files: (name, path) pairs, hashed
    as name (forward slashes) and path's content, in the order given (sort
    names by UTF-8 bytes to match template_hash), then extra_key. Adapters
    (pgfork.alembic) use it to hash files that are not one directory."""
    h = hashlib.sha256(b"pgfork-template-hash/1\n")
    for rel, path in files:
        data = Path(path).read_bytes()
        h.update(f"file {rel}\n{len(data)}\n".encode("utf-8"))
        h.update(data)
        h.update(b"\n")
    extra = extra_key.encode("utf-8")
    h.update(f"extra {len(extra)}\n".encode("utf-8") + extra)
    return h.hexdigest()[:32]
