"""The shared template-hash vectors (clients/testdata/template-hash-vectors.json),
read by every pgfork client's tests, so all clients share templates."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from pgfork import template_hash

VECTORS = Path(__file__).resolve().parents[2] / "testdata" / "template-hash-vectors.json"
CASES = json.loads(VECTORS.read_text(encoding="utf-8"))["cases"]


@pytest.mark.parametrize("case", CASES, ids=[c["name"] for c in CASES])
def test_shared_vector(case: dict, tmp_path: Path) -> None:
    tree = tmp_path / "tree"
    tree.mkdir()
    for base, entries in ((tree, case.get("files", {})), (tmp_path, case.get("outside", {}))):
        for rel, data in entries.items():
            p = base / rel
            p.parent.mkdir(parents=True, exist_ok=True)
            p.write_bytes(data.encode("utf-8"))
    for link in case.get("symlinks", []):
        os.symlink(link["target"], tree / link["path"])
    directory = None if case.get("no_dir") else tree
    assert template_hash(directory, case["extra_key"]) == case["hash"]
