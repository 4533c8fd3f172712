#!/usr/bin/env bash
# `make run`: pgfork's main job on the embedded default, the local PostgreSQL
# found on this machine. It shows what pgfork sees (doctor), starts a fresh
# throw-away cluster from a cached template (up) and queries it, removes it,
# and then serves pools of test databases over IntegreSQL's HTTP API on
# 127.0.0.1:5000 until Ctrl-C (serve). PGFORK_DEMO_SERVE=0 stops after `up`.
set -euo pipefail
cd "$(dirname "$0")/.."
bin=${PGFORK_BIN:-bin/pgfork}
[ -x "$bin" ] || CGO_ENABLED=0 go build -o "$bin" ./cmd/pgfork

step() { printf '\n\033[1m== %s\033[0m\n' "$*" >&2; }

step "pgfork doctor: PostgreSQL builds found, filesystem and copy methods"
"$bin" doctor

step "pgfork up: a fresh cluster from a cached template (the first run builds the template)"
name="demo-$$"
start=$(date +%s%N)
url=$("$bin" up --name "$name" --ttl 10m)
end=$(date +%s%N)
echo "$url"
echo "ready in $(( (end - start) / 1000000 )) ms" >&2
trap '"$bin" down "$name" >/dev/null 2>&1 || true' EXIT
if command -v psql >/dev/null; then
	psql "$url" -Atc "select 'connected to ' || version()"
elif [ -x /usr/lib/postgresql/15/bin/psql ]; then
	/usr/lib/postgresql/15/bin/psql "$url" -Atc "select 'connected to ' || version()"
fi

step "again, now that the template is cached"
start=$(date +%s%N)
url2=$("$bin" up --name "$name-2" --ttl 10m)
end=$(date +%s%N)
echo "$url2"
echo "ready in $(( (end - start) / 1000000 )) ms" >&2
"$bin" ls
"$bin" down "$name" "$name-2"
trap - EXIT

if [ "${PGFORK_DEMO_SERVE:-1}" = 0 ]; then exit 0; fi
step "pgfork serve: test databases over IntegreSQL's API on http://127.0.0.1:5000 (Ctrl-C to stop)"
exec "$bin" serve
