#!/usr/bin/env bash
# Downloads and builds what the client suites need before a server runs, with
# the very commands and flags they use, so their own runs later find it done:
# the Go client's modules and test binaries, clients/test.sh's pgfork build,
# IntegreSQL's Go and JS clients of clients/compat/run.sh, the Python client's
# venv, the JS client's npm packages, the Rust client's crates and test build
# (clippy's too), the Java modules' Maven dependencies and classes; with
# PGFORK_PREPARE_DIST, the release that clients/zero-setup.sh tests. Needs no
# server, starts no PostgreSQL and writes only to the tools' caches, the
# clients' build directories and caches, build/release and
# PGFORK_PREPARE_DIST.
#
# scripts/check.sh runs it beside the Go tests (which mostly wait on
# PostgreSQL), at low priority, so the client stage that follows them spends
# its time testing rather than downloading and compiling. It is only a head
# start: clients/test.sh and clients/zero-setup.sh repeat every step (cached
# now; zero-setup.sh builds the release itself unless it was built here), so a
# step that fails here fails there again with its reason, and this script's
# own status is only reported. Any step may be left out with
# PGFORK_PREPARE_SKIP="go compat python js rust java release".
#
#   PGFORK_PREPARE_DIST=DIR  also build the release for this machine's platform
#                            into DIR (`make release`, as clients/zero-setup.sh
#                            builds it), for zero-setup.sh to use as PGFORK_DIST;
#                            DIR is removed again if the build fails, so a DIR
#                            holding SHA256SUMS is a complete release
set -uo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
log() { printf '== clients/prepare.sh: %s\n' "$*" >&2; }
skip=" ${PGFORK_PREPARE_SKIP:-} "
status=0

# The CPU seconds (user + system) of this shell's finished children so far,
# from /proc (clock ticks): what a step's compilers used, beside its wall time.
child_cpu() { awk -v hz="$(getconf CLK_TCK)" '{printf "%d", ($16 + $17) / hz}' "/proc/$$/stat"; }
# step NAME DIR CMD...: runs CMD in DIR (absolute or under the checkout), timed; a failure is reported and remembered.
step() {
	local name=$1 dir=$2 t0 c0
	shift 2
	case $skip in *" $name "*) log "$name: skipped"; return 0 ;; esac
	t0=$(date +%s)
	c0=$(child_cpu)
	case $dir in /*) ;; *) dir=$root/$dir ;; esac
	if (cd "$dir" && "$@"); then
		log "$name: $* ($(($(date +%s) - t0)) s, $(($(child_cpu) - c0)) CPU-s)"
	else
		log "$name: $* FAILED after $(($(date +%s) - t0)) s (the client stage repeats it)"
		status=1
		return 1
	fi
}

# The Go client (a module of its own) and its migrators' end-to-end module:
# modules downloaded, test binaries compiled and linked, not run (-exec
# true: clients/test.sh runs them against its server).
step go clients/go go test -count=1 -exec true ./...
step go clients/go/migrators/e2e go test -count=1 -exec true ./...
# clients/test.sh's own build of pgfork (the same command, so it finds every
# package compiled; the binary itself is thrown away), unless the release is
# built below: scripts/check.sh then gives clients/test.sh the release's.
if [ -z "${PGFORK_PREPARE_DIST:-}" ]; then
	bin_tmp=$(mktemp -d "${TMPDIR:-/tmp}/pgfork-prepare.XXXXXX")
	step go . env CGO_ENABLED=0 go build -o "$bin_tmp/pgfork" ./cmd/pgfork
	rm -rf "$bin_tmp"
fi
# clients/compat/run.sh's download and build of IntegreSQL's Go client (its
# test binaries compiled, not run) and its npm install (into npm's cache).
step compat clients/compat/go go test -count=1 -exec true . github.com/allaboutapps/integresql-client-go
compat_tmp=$(mktemp -d "${TMPDIR:-/tmp}/pgfork-prepare.XXXXXX")
cp "$root/clients/compat/js/package.json" "$compat_tmp/"
step compat "$compat_tmp" npm install --no-audit --no-fund --no-package-lock --loglevel=error
rm -rf "$compat_tmp"
# clients/test.sh's Python venv (kept in its cache; it finds it made).
step python . clients/python/venv.sh
# clients/js/test.sh runs `npm ci` again: from npm's cache, offline.
step js clients/js npm ci --ignore-scripts --no-audit --no-fund --loglevel=error
# clients/rust/test.sh's clippy and test build (same flags, same profile; clippy's
# own -D warnings too: cargo checks the crates again when clippy's arguments differ).
if command -v cargo >/dev/null; then
	step rust clients/rust cargo clippy --locked --all-targets --all-features --quiet -- -D warnings
	step rust clients/rust cargo test --locked --all-features --no-run --quiet
fi
# clients/java/test.sh's `mvn verify`: every plugin and dependency downloaded,
# everything compiled and packaged; the tests run there.
if command -v mvn >/dev/null; then
	step java clients/java mvn -B -ntp -q -DskipTests verify
fi
# clients/zero-setup.sh's release (its PGFORK_DIST), after the js and java
# steps: the release packs clients/js with the node_modules npm ci installed,
# and its Maven build (dist/maven) runs offline from what `mvn verify` put in
# ~/.m2. The build goes to a directory of its own and is moved to DIR only
# when complete.
if [ -n "${PGFORK_PREPARE_DIST:-}" ]; then
	rm -rf "$PGFORK_PREPARE_DIST" "$PGFORK_PREPARE_DIST.part"
	if step release . make -s release PLATFORMS="$(go env GOOS)/$(go env GOARCH)" DIST="$PGFORK_PREPARE_DIST.part" &&
		[ -f "$PGFORK_PREPARE_DIST.part/SHA256SUMS" ]; then
		mv "$PGFORK_PREPARE_DIST.part" "$PGFORK_PREPARE_DIST"
	else
		rm -rf "$PGFORK_PREPARE_DIST.part"
	fi
fi
exit "$status"
