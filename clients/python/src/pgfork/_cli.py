"""The `pgfork` command of ``pip install pgfork``: runs the pgfork binary.

It replaces itself (exec) with the binary :func:`pgfork.binary.find_binary`
finds — the one in the wheel, else $PGFORK_BIN, else one on PATH — with the
same arguments; with none it says how to get one and exits 127.
"""

from __future__ import annotations

import os
import sys
from typing import NoReturn

from .binary import BinaryNotFound, find_binary, not_found_message


def main() -> NoReturn:
    try:
        exe = find_binary()
    except BinaryNotFound as e:
        print(f"pgfork: {e}", file=sys.stderr)
        sys.exit(127)
    if exe is None:
        print(f"pgfork: {not_found_message()}", file=sys.stderr)
        sys.exit(127)
    try:
        os.execv(exe, ["pgfork", *sys.argv[1:]])
    except OSError as e:
        print(f"pgfork: cannot run {exe}: {e}", file=sys.stderr)
        sys.exit(126)


if __name__ == "__main__":
    main()
