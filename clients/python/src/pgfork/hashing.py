"""Template hashes, the same as the Go client's client.TemplateHash."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path
from typing import List, Optional, Union

StrPath = Union[str, "os.PathLike[str]"]


def _files(root: Path) -> List[str]:
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
    h = hashlib.sha256(b"pgfork-template-hash/1\n")
    if directory:
        root = Path(directory)
        for rel in _files(root):
            data = (root / rel).read_bytes()
            h.update(f"file {rel}\n{len(data)}\n".encode("utf-8"))
            h.update(data)
            h.update(b"\n")
    extra = extra_key.encode("utf-8")
    h.update(f"extra {len(extra)}\n".encode("utf-8") + extra)
    return h.hexdigest()[:32]
