#!/usr/bin/env bash
# Runs IntegreSQL's official clients against a real `pgfork serve`, in both
# of the ways IntegreSQL users deploy it:
#
#   managed   pgfork serve with no PostgreSQL configured (its own cluster)
#   external  pgfork serve configured by PGHOST/PGPORT/PGUSER/PGPASSWORD only,
#             naming a PostgreSQL server this script starts (as IntegreSQL's
#             README configures it)
#
# In each mode: the Go client (github.com/allaboutapps/integresql-client-go,
# from the Go module proxy) with its own test file and with go/flow_test.go,
# then the JavaScript client (@devoxa/integresql-client, pinned in
# js/package.json, installed with npm into a temporary directory) with
# js/flow.test.cjs. IntegreSQL's clients send no token, so the servers listen
# on loopback without one.
#
# Usage: clients/compat/run.sh PGFORK_BINARY
# Any failure, including a failed install, exits non-zero and says which.
# No test may skip: the server answers as IntegreSQL v1.1.0 does, so a skip
# would hide a difference.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
bin=${1:?usage: clients/compat/run.sh PGFORK_BINARY}
[ -x "$bin" ] || { echo "compat: $bin is not an executable" >&2; exit 1; }
bin=$(cd "$(dirname "$bin")" && pwd)/$(basename "$bin")
work=$(mktemp -d "${TMPDIR:-/tmp}/pgfork-compat.XXXXXX")
chmod 755 "$work" # PostgreSQL runs as an unprivileged user when we are root
server_pid=
ext_pgdata=
pg_bindir=

log() { printf '== compat: %s\n' "$*" >&2; }
# shellcheck source=../skips.sh
. "$here/../skips.sh"

as_pg() { # run a PostgreSQL program as the postgres OS user when we are root
	if [ "$(id -u)" -eq 0 ]; then
		runuser -u postgres -- "$@"
	else
		"$@"
	fi
}

stop_server() {
	[ -n "$server_pid" ] || return 0
	kill -TERM "$server_pid" 2>/dev/null || true
	for _ in $(seq 1 600); do
		kill -0 "$server_pid" 2>/dev/null || break
		sleep 0.1
	done
	if kill -0 "$server_pid" 2>/dev/null; then
		log "pgfork serve did not stop within 60s of SIGTERM; killing it"
		kill -KILL "$server_pid" 2>/dev/null || true
	fi
	wait "$server_pid" 2>/dev/null || true
	server_pid=
}

finish() {
	local status=$?
	stop_server
	if [ -n "$ext_pgdata" ] && [ -f "$ext_pgdata/postmaster.pid" ]; then
		as_pg "$pg_bindir/pg_ctl" -D "$ext_pgdata" -m fast -w stop >/dev/null 2>&1 || true
	fi
	if [ "$status" -ne 0 ]; then
		log "FAILED (exit $status)"
		for f in "$work"/serve-*.log; do
			[ -s "$f" ] || continue
			log "last lines of $(basename "$f"):"
			tail -n 40 "$f" >&2
		done
	fi
	rm -rf "$work"
	exit "$status"
}
trap finish EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

for tool in go node npm python3; do
	command -v "$tool" >/dev/null || { log "$tool not found on PATH"; exit 1; }
done
pg_bindir=$(pg_config --bindir 2>/dev/null || true)
[ -x "$pg_bindir/initdb" ] || { log "PostgreSQL's initdb not found (pg_config --bindir: '$pg_bindir'): install PostgreSQL's server package"; exit 1; }

free_port() { python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }

# Installs first, so that a failed install says so before any test runs.
log "installing the JavaScript client (npm, versions pinned in js/package.json)"
mkdir -p "$work/js"
cp "$here/js/package.json" "$work/js/"
if ! (cd "$work/js" && npm install --no-audit --no-fund --no-package-lock --loglevel=error) >"$work/npm.log" 2>&1; then
	cat "$work/npm.log" >&2
	log "npm install of the JavaScript client FAILED (see above)"
	exit 1
fi
log "downloading the Go client (go mod download in compat/go)"
if ! (cd "$here/go" && go mod download && go test -count=1 -run '^$' . github.com/allaboutapps/integresql-client-go) >"$work/go-dl.log" 2>&1; then
	cat "$work/go-dl.log" >&2
	log "download or build of the Go client github.com/allaboutapps/integresql-client-go FAILED (see above)"
	exit 1
fi

# The external PostgreSQL server: a superuser with a password on 127.0.0.1.
log "starting an external PostgreSQL ($("$pg_bindir/postgres" --version))"
ext_pgdata="$work/ext-pgdata"
ext_port=$(free_port)
ext_user=compat_admin
ext_password=$(python3 -c 'import secrets; print(secrets.token_hex(12))')
mkdir -p "$ext_pgdata" "$work/ext-sock"
printf '%s\n' "$ext_password" >"$work/ext-pw"
: >"$work/ext-pg.log"
if [ "$(id -u)" -eq 0 ]; then chown postgres "$ext_pgdata" "$work/ext-sock" "$work/ext-pw" "$work/ext-pg.log"; fi
as_pg "$pg_bindir/initdb" -D "$ext_pgdata" -U "$ext_user" --pwfile="$work/ext-pw" -A scram-sha-256 -N >"$work/initdb.log" 2>&1 ||
	{ cat "$work/initdb.log" >&2; log "initdb of the external server failed"; exit 1; }
as_pg "$pg_bindir/pg_ctl" -D "$ext_pgdata" -l "$work/ext-pg.log" -w -t 120 \
	-o "-p $ext_port -k $work/ext-sock -c listen_addresses=127.0.0.1 -c fsync=off -c max_connections=200" start >/dev/null ||
	{ cat "$work/ext-pg.log" >&2; log "the external PostgreSQL did not start"; exit 1; }

# run_mode NAME ENV...: starts pgfork serve with ENV (and no other PG*
# variables) and runs every client test against it.
run_mode() {
	local mode=$1
	shift
	local port url
	port=$(free_port)
	url="http://127.0.0.1:$port"
	log "[$mode] starting pgfork serve on $url"
	env -u PGHOST -u PGPORT -u PGUSER -u PGPASSWORD -u PGDATABASE -u PGFORK_PG_URL -u PGFORK_TOKEN \
		-u INTEGRESQL_PGHOST -u INTEGRESQL_PGPORT -u INTEGRESQL_PGUSER -u INTEGRESQL_PGPASSWORD \
		INTEGRESQL_TEMPLATE_FINALIZE_TIMEOUT_MS=3000 "$@" \
		"$bin" serve --listen "127.0.0.1:$port" --state-dir "$work/state-$mode" >"$work/serve-$mode.log" 2>&1 &
	server_pid=$!
	local ok=
	for _ in $(seq 1 1800); do
		if curl -fsS -o /dev/null "$url/healthz" 2>/dev/null; then ok=1; break; fi
		kill -0 "$server_pid" 2>/dev/null || break
		sleep 0.1
	done
	[ -n "$ok" ] || { log "[$mode] pgfork serve did not answer /healthz"; exit 1; }

	local -a genv=(INTEGRESQL_CLIENT_BASE_URL="$url/api" PGFORK_COMPAT_MODE="$mode" "$@")
	log "[$mode] Go client: go/flow_test.go"
	if ! (cd "$here/go" && env "${genv[@]}" go test -count=1 -v -timeout 10m .) >"$work/go-$mode.log" 2>&1; then
		grep -v -E '^=== (RUN|PAUSE|CONT)' "$work/go-$mode.log" >&2
		log "[$mode] Go client flow tests FAILED"
		exit 1
	fi
	grep -E '^(--- |ok|FAIL)' "$work/go-$mode.log" >&2 || true
	# Its own test file last: every test in it starts with ResetAllTracking.
	log "[$mode] Go client: its own test file (client_test.go of integresql-client-go)"
	if ! (cd "$here/go" && env "${genv[@]}" go test -count=1 -v -timeout 10m github.com/allaboutapps/integresql-client-go) >"$work/go-own-$mode.log" 2>&1; then
		grep -v -E '^=== (RUN|PAUSE|CONT)' "$work/go-own-$mode.log" >&2
		log "[$mode] the Go client's own tests FAILED"
		exit 1
	fi
	grep -E '^(--- |ok|FAIL)' "$work/go-own-$mode.log" >&2 || true

	log "[$mode] JavaScript client: js/flow.test.cjs"
	if ! (cd "$here/js" && INTEGRESQL_URL="$url" NODE_PATH="$work/js/node_modules" node --test --test-reporter=tap flow.test.cjs) >"$work/js-$mode.log" 2>&1; then
		cat "$work/js-$mode.log" >&2
		log "[$mode] JavaScript client tests FAILED"
		exit 1
	fi
	grep -E '^(ok|not ok) ' "$work/js-$mode.log" >&2 || true

	# No skips at all, not even a "KNOWN SKIP" one.
	local f
	for f in "$work/go-$mode.log" "$work/go-own-$mode.log" "$work/js-$mode.log"; do
		if ! unknown_skips "$f" || [ -n "$(known_skips "$f")" ]; then
			known_skips "$f" >&2
			log "[$mode] a test skipped ($(basename "$f")): IntegreSQL's clients must run in full"
			exit 1
		fi
	done
	stop_server
}

run_mode managed
run_mode external PGHOST=127.0.0.1 PGPORT="$ext_port" PGUSER="$ext_user" PGPASSWORD="$ext_password" \
	PGFORK_COMPAT_PGPORT="$ext_port"

log "IntegreSQL's Go and JavaScript clients passed against pgfork serve (managed and external)"
