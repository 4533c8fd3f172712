#!/usr/bin/env bash
# Tests pgfork's clients (Go, Python, JS, Rust, Java) against a real `pgfork serve`:
# builds pgfork, starts it on a free loopback port with a token and its own
# state dir (so its own managed PostgreSQL), runs the Go client's tests (with
# the goose and golang-migrate adapters' module) and the Python client's
# tests (pytest -n 2) against it, then stops it. Last, clients/compat/run.sh
# runs IntegreSQL's official Go and JavaScript clients against servers of
# its own. Tests may skip only for a reason starting "KNOWN SKIP".
# PGFORK_BIN=/path/to/pgfork uses that build instead of building one.
#
# The Python venv is kept in $PGFORK_CLIENTS_CACHE (default
# ~/.cache/pgfork-clients) and reinstalled only when pyproject.toml or the
# checkout path changes (clients/python/venv.sh). Any failure stops the
# script with a non-zero exit and the server's log.
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
work=$(mktemp -d "${TMPDIR:-/tmp}/pgfork-clients.XXXXXX")
chmod 755 "$work" # the managed PostgreSQL runs as an unprivileged user when we are root
server_pid=

# Each line says when, and the seconds and the machine's busy CPU-seconds
# since the script began, so that CI's log shows which suite costs the time.
# shellcheck source=../scripts/cpu-busy.sh
. "$root/scripts/cpu-busy.sh"
cpu_start=$(cpu_busy)
log() { printf '== clients/test.sh: %s (%s, %d s and %d CPU-s in)\n' "$*" "$(date -u +%H:%M:%S)" "$SECONDS" "$(($(cpu_busy) - cpu_start))" >&2; }

# shellcheck source=skips.sh
. "$root/clients/skips.sh"

# check_skips LOG LANG: against a live server no test may skip, except for a
# reason starting "KNOWN SKIP" (see skips.sh); those are listed.
check_skips() {
	local known
	known=$(known_skips "$1")
	if [ -n "$known" ]; then
		log "$2 tests skipped for known reasons:"
		printf '%s\n' "$known" | sed 's/^/   /' >&2
	fi
	if ! unknown_skips "$1"; then
		log "$2 tests skipped against a live server (not for a known reason)"
		exit 1
	fi
}

stop_server() {
	[ -n "$server_pid" ] || return 0
	if kill -0 "$server_pid" 2>/dev/null; then
		kill -TERM "$server_pid" 2>/dev/null || true
		for _ in $(seq 1 600); do
			kill -0 "$server_pid" 2>/dev/null || break
			sleep 0.1
		done
		if kill -0 "$server_pid" 2>/dev/null; then
			log "pgfork serve did not stop within 60s of SIGTERM; killing it"
			kill -KILL "$server_pid" 2>/dev/null || true
		fi
	fi
	wait "$server_pid" 2>/dev/null || true
	server_pid=
	# The volume ci-setup.sh made under $work (unmounted before rm -rf).
	[ -z "${state_dir:-}" ] || [ ! -e "$state_dir/volume.json" ] || "$bin" --state-dir "$state_dir" volume rm >&2 || true
}

finish() {
	local status=$?
	stop_server
	if [ "$status" -ne 0 ]; then
		log "FAILED (exit $status)"
		if [ -s "$work/serve.log" ]; then
			log "last lines of the pgfork serve log:"
			tail -n 60 "$work/serve.log" >&2
		fi
	fi
	rm -rf "$work"
	exit "$status"
}
trap finish EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

command -v go >/dev/null || { log "go not found"; exit 1; }
command -v python3 >/dev/null || { log "python3 not found"; exit 1; }

bin="$work/bin/pgfork"
if [ -n "${PGFORK_BIN:-}" ]; then
	[ -x "$PGFORK_BIN" ] || { log "PGFORK_BIN=$PGFORK_BIN is not an executable"; exit 1; }
	log "using pgfork at $PGFORK_BIN"
	bin=$PGFORK_BIN
else
	log "building pgfork"
	(cd "$root" && CGO_ENABLED=0 go build -o "$bin" ./cmd/pgfork)
fi

log "starting pgfork serve with scripts/ci-setup.sh (what the CI recipes run)"
# As a runner runs it: as root, on this machine's disk (ext4), with a volume;
# --finalize-timeout 15s: the v2 timeout tests (503 with the reason) wait
# that long; every other template is finalized within seconds.
state_dir="$work/state"
PGFORK_BIN="$bin" PGFORK_STATE_DIR="$state_dir" PGFORK_LOG="$work/serve.log" PGFORK_DOTENV="$work/pgfork.env" \
	PGFORK_SERVE_ARGS="--finalize-timeout 15s" "$root/scripts/ci-setup.sh"
set -a
# shellcheck source=/dev/null
. "$work/pgfork.env"
set +a
server_pid=$PGFORK_PID url=$PGFORK_URL token=$PGFORK_TOKEN
[ -n "$INTEGRESQL_CLIENT_BASE_URL" ] || { log "ci-setup.sh exported no INTEGRESQL_CLIENT_BASE_URL"; exit 1; }
if [ "$(id -u)" = 0 ] && ! "$bin" --state-dir "$state_dir" volume ls --json | grep -q '"attached": true'; then
	log "as root ci-setup.sh must put the server on a reflink volume; it did not"
	exit 1
fi
export PGFORK_TEST_RUN="$$-$(date +%s)"

# The dbmate CLI for the dbmate adapter's test, from npm (its package ships
# the binary; the Go module proxy refuses dbmate's module here), pinned to
# the version the test names. Best effort: when it cannot be installed the
# test says so with a "KNOWN SKIP". (Atlas's npm package downloads its binary
# from its own site at install time, so atlas stays a known skip offline.)
dbmate_version=$(sed -n 's/^const dbmateVersion = "v\(.*\)"$/\1/p' "$root/clients/go/migrators/dbmatemigrator/dbmatemigrator_test.go")
if ! command -v dbmate >/dev/null && command -v npm >/dev/null && [ -n "$dbmate_version" ]; then
	log "installing the dbmate CLI $dbmate_version (npm)"
	mkdir -p "$work/tools"
	if (cd "$work/tools" && npm install --no-audit --no-fund --no-package-lock --loglevel=error "dbmate@$dbmate_version") >"$work/tools.log" 2>&1 &&
		"$work/tools/node_modules/.bin/dbmate" --version >>"$work/tools.log" 2>&1; then
		export PATH="$work/tools/node_modules/.bin:$PATH"
	else
		log "could not install dbmate $dbmate_version from npm (its test will skip):"
		tail -n 5 "$work/tools.log" >&2
	fi
fi

log "Go client tests"
# -v to see skips: against a live server none of these tests may skip.
if ! (cd "$root/clients/go" && go test -count=1 -timeout 10m -v -skip '^TestResetAllTracking$' ./...) >"$work/go-test.log" 2>&1; then
	grep -v -E '^(=== (RUN|PAUSE|CONT)|    --- PASS|--- PASS)' "$work/go-test.log" >&2
	exit 1
fi
log "Go migrator adapters (goose, golang-migrate: modules of their own)"
if ! (cd "$root/clients/go/migrators/e2e" && go test -count=1 -timeout 10m -v ./...) >>"$work/go-test.log" 2>&1; then
	grep -v -E '^(=== (RUN|PAUSE|CONT)|    --- PASS|--- PASS)' "$work/go-test.log" >&2
	exit 1
fi
grep -E '^(ok|FAIL|---)' "$work/go-test.log" | grep -v -- '--- PASS' || true
check_skips "$work/go-test.log" Go

venv=$("$root/clients/python/venv.sh")

log "Python client tests (pytest -n 2)"
(cd "$root/clients/python" && "$venv/bin/python" -m pytest -n 2 -p no:cacheprovider -q -rs tests) | tee "$work/py-test.log"
check_skips "$work/py-test.log" Python

# Last, alone: it forgets every template on the server.
log "Go ResetAllTracking test"
out=$(cd "$root/clients/go" && PGFORK_TEST_RESET=1 go test -count=1 -run '^TestResetAllTracking$' -v ./client 2>&1) ||
	{ printf '%s\n' "$out"; exit 1; }
printf '%s\n' "$out" | grep -E '^(--- |ok)'
printf '%s\n' "$out" | grep -q -- '--- PASS: TestResetAllTracking' || { log "TestResetAllTracking did not run"; exit 1; }

log "JS client tests (clients/js/test.sh)"
"$root/clients/js/test.sh" | tee "$work/js-test.log"
check_skips "$work/js-test.log" JS

log "Rust client tests (clients/rust/test.sh)"
"$root/clients/rust/test.sh" | tee "$work/rust-test.log"
check_skips "$work/rust-test.log" Rust

log "Java client tests (clients/java/test.sh)"
PGFORK_BIN="$bin" "$root/clients/java/test.sh" 2>&1 | tee "$work/java-test.log"

# IntegreSQL's own clients (Go from the Go module proxy, JavaScript from npm)
# against pgfork serve, managed and external (PGHOST… only); servers of its own.
log "IntegreSQL client compatibility (clients/compat/run.sh)"
"$root/clients/compat/run.sh" "$bin"

log "all client tests passed"
