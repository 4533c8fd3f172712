#!/usr/bin/env bash
# Downloads and builds what the client suites need before a server runs, with
# the very commands and flags they use, so their own runs later find it done:
# the Go client's modules and test binaries, the JS client's npm packages, the
# Rust client's crates and test build (clippy's too), the Java modules' Maven
# dependencies and classes. Needs no server, starts no PostgreSQL and writes
# only to the tools' caches and the clients' build directories.
#
# scripts/check.sh runs it beside the Go tests (which mostly wait on
# PostgreSQL), at low priority, so the client stage that follows them spends
# its time testing rather than downloading and compiling. It is only a head
# start: clients/test.sh and clients/zero-setup.sh repeat every step (cached
# now), so a step that fails here fails there again with its reason, and this
# script's own status is only reported. Any step may be left out with
# PGFORK_PREPARE_SKIP="go js rust java".
set -uo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
log() { printf '== clients/prepare.sh: %s\n' "$*" >&2; }
skip=" ${PGFORK_PREPARE_SKIP:-} "
status=0

# step NAME DIR CMD...: runs CMD in DIR, timed; a failure is reported and remembered.
step() {
	local name=$1 dir=$2 t0
	shift 2
	case $skip in *" $name "*) log "$name: skipped"; return 0 ;; esac
	t0=$(date +%s)
	if (cd "$root/$dir" && "$@"); then
		log "$name: $* ($(($(date +%s) - t0)) s)"
	else
		log "$name: $* FAILED after $(($(date +%s) - t0)) s (the client stage repeats it)"
		status=1
	fi
}

# The Go client (a module of its own) and its migrators' end-to-end module:
# modules downloaded, test binaries compiled and linked, not run (-exec
# true: clients/test.sh runs them against its server).
step go clients/go go test -count=1 -exec true ./...
step go clients/go/migrators/e2e go test -count=1 -exec true ./...
# clients/js/test.sh runs `npm ci` again: from npm's cache, offline.
step js clients/js npm ci --ignore-scripts --no-audit --no-fund --loglevel=error
# clients/rust/test.sh's clippy and test build (same flags, same profile).
if command -v cargo >/dev/null; then
	step rust clients/rust cargo clippy --locked --all-targets --all-features --quiet
	step rust clients/rust cargo test --locked --all-features --no-run --quiet
fi
# clients/java/test.sh's `mvn verify`: every plugin and dependency downloaded,
# everything compiled and packaged; the tests run there.
if command -v mvn >/dev/null; then
	step java clients/java mvn -B -ntp -q -DskipTests verify
fi
exit "$status"
