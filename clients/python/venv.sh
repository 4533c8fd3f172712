#!/usr/bin/env bash
# Makes the Python client's test venv (the client installed editable with its
# [test] extras) and prints its path; clients/test.sh runs the Python tests in
# it, and clients/prepare.sh makes it ahead of time. The venv is kept in
# $PGFORK_CLIENTS_CACHE (default ~/.cache/pgfork-clients) and made again only
# when pyproject.toml or the checkout path changes.
set -euo pipefail

root=$(cd "$(dirname "$0")/../.." && pwd)
cache=${PGFORK_CLIENTS_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/pgfork-clients}
venv="$cache/venv"
stamp="$venv/.pgfork-stamp"
want=$( (cat "$root/clients/python/pyproject.toml"; echo "$root") | sha256sum | cut -d' ' -f1)
if [ ! -x "$venv/bin/python" ] || [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
	printf '== clients/python/venv.sh: %s\n' "creating the Python venv in $venv" >&2
	rm -rf "$venv"
	mkdir -p "$cache"
	python3 -m venv "$venv"
	"$venv/bin/python" -m pip install --quiet --disable-pip-version-check -e "$root/clients/python[test]" >&2
	echo "$want" >"$stamp"
fi
echo "$venv"
