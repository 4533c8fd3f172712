#!/usr/bin/env bash
# The test command of the README and of CI (`make check`): prepare a real test
# environment private to this run (packages, XFS reflink image, tmpfs, more
# PostgreSQL majors), run lint and every test once, run the client suites,
# then tear down what this run made, and only that.
#
# Any failure fails the run: a failed test is never re-run into a pass.
#
#   PGFORK_TEST_RUN_DIR  where this run mounts and writes (default: a fresh
#                        /var/tmp/pgfork-check.XXXXXX, removed at the end)
#   PGFORK_TEST_CACHE    shared, read-only-after-install PostgreSQL builds
#                        (default /var/cache/pgfork-test)
set -euo pipefail
cd "$(dirname "$0")/.."

if [ -z "${PGFORK_TEST_RUN_DIR:-}" ]; then
	PGFORK_TEST_RUN_DIR=$(mktemp -d /var/tmp/pgfork-check.XXXXXX)
fi
export PGFORK_TEST_RUN_DIR
mkdir -p "$PGFORK_TEST_RUN_DIR"
chmod 0755 "$PGFORK_TEST_RUN_DIR"
echo "check: this run's directory is $PGFORK_TEST_RUN_DIR" >&2

if [ "$(id -u)" = 0 ]; then
	# As root we can build the whole environment, so nothing may be skipped.
	export PGFORK_TEST_REQUIRE=${PGFORK_TEST_REQUIRE:-1}
else
	echo "check: not root: tests that need XFS, tmpfs or mounts will skip (run as root for the full suite)" >&2
fi
prepare_pid=
# On any exit: stop clients/prepare.sh if it still runs (its own process
# group), then remove what this run made.
finish() {
	[ -z "$prepare_pid" ] || kill -- "-$prepare_pid" 2>/dev/null || true
	scripts/test-env.sh down
}
trap finish EXIT
# Each stage line says how much of the machine the run used so far, so that
# the stage that costs the budget shows in CI's log.
# shellcheck source=cpu-busy.sh
. scripts/cpu-busy.sh
cpu_start=$(cpu_busy)
stage() {
	echo "check: $* ($(date -u +%H:%M:%S), $((SECONDS / 60)) min in, $(($(cpu_busy) - cpu_start)) CPU-s used of $((SECONDS * $(nproc))))" >&2
}
stage "test environment"
scripts/test-env.sh up
eval "$(scripts/test-env.sh env)"

# Temporary files of the tests (and of the servers they start) stay in this
# run's directory, so nothing is left in /tmp and two runs never meet.
export TMPDIR=$PGFORK_TEST_RUN_DIR/tmp
mkdir -p "$TMPDIR"
chmod 0755 "$TMPDIR"
# pgfork's own state for commands the tests run without --state-dir.
export PGFORK_HOME=$PGFORK_TEST_RUN_DIR/home

stage "make lint"
make lint
# While the Go tests run (they mostly wait on PostgreSQL and the disks), the
# client stage's downloads and builds run beside them at low priority
# (clients/prepare.sh: a head start only; the client stage repeats each step
# from the caches, so a failure there still fails the run with its reason).
prepare_log=$PGFORK_TEST_RUN_DIR/clients-prepare.log
# It also builds the release clients/zero-setup.sh tests (`make release` for
# this platform, over a minute on the serial path otherwise) into dist/,
# complete or absent.
prepared_dist=$PGFORK_TEST_RUN_DIR/dist
PGFORK_PREPARE_DIST=$prepared_dist setsid nice -n 19 clients/prepare.sh >"$prepare_log" 2>&1 &
prepare_pid=$!
stage "go test"
# Every test once, verbose into the run's log; on the terminal the package
# results, failures and skips. Under PGFORK_TEST_REQUIRE=1 (root) a test whose
# environment is missing (XFS, tmpfs, a PostgreSQL major) fails instead of
# skipping (internal/testenv), so CI really runs them; the skips listed are the
# few a test takes on its own when it could not set up its case (each says why).
log=$PGFORK_TEST_RUN_DIR/go-test.log
status=0
# The slowest packages first (go test starts them in the order given, two at
# a time on 2 cores): in alphabetical order upgrade, one of the longest, ran
# alone at the end for minutes. Measured in one fresh run on CI, seconds:
# upgrade 680, cmd/pgfork 555, branches 273, pgclone 243, restore 210,
# server 198, pool 158; all others under 50. Inside upgrade, cmd/pgfork and
# branches the tests that can run beside each other call t.Parallel() (two
# at a time: -parallel defaults to the cores), as they mostly wait on
# PostgreSQL and the disks.
slow="./upgrade ./cmd/pgfork ./branches ./pgclone ./restore ./server ./pool"
# shellcheck disable=SC2046,SC2086
pkgs="$slow $(go list ./... | sed 's|^github.com/pgfork/pgfork|.|; s|^\.$|./|' | grep -v -x -F $(printf -- '-e %s ' $slow))"
# -vet=off: make lint ran go vet over everything already.
# shellcheck disable=SC2086
go test -race -vet=off -count=1 -timeout 60m -v $pkgs >"$log" 2>&1 || status=$?
grep -E '^(ok|FAIL|panic:|--- FAIL)' "$log" || true
grep -E -A1 '^\s*--- SKIP' "$log" | grep -v '^--$' || true
passed=$(grep -c -- '^--- PASS' "$log" || true)
failed=$(grep -c -- '^--- FAIL' "$log" || true)
skipped=$(grep -c -E -- '^\s*--- SKIP' "$log" || true)
echo "tests: $passed passed, $failed failed, $skipped skipped"
if [ "$status" -ne 0 ]; then
	echo "check: what the failing tests said:" >&2
	grep -B60 -A10 -E -- '--- FAIL|^panic:' "$log" | head -600 >&2 || true
	kept=/var/tmp/$(basename "$PGFORK_TEST_RUN_DIR")-go-test.log
	cp "$log" "$kept" 2>/dev/null || true
	echo "check: go test failed (exit $status); the whole verbose log is kept in $kept" >&2
	exit "$status"
fi
prepare_status=0
wait "$prepare_pid" || prepare_status=$?
prepare_pid=
grep '^== clients/prepare.sh' "$prepare_log" >&2 || true
[ "$prepare_status" = 0 ] || echo "check: clients/prepare.sh failed (exit $prepare_status; its log: $prepare_log): the client stage repeats its steps" >&2
# The client libraries (a Go module of their own and a pip package) against a real `pgfork serve`.
stage "clients/test.sh"
# They run the release's pgfork when clients/prepare.sh built it (what users
# install; no second build of pgfork), else clients/test.sh builds one.
client_bin=()
if [ -f "$prepared_dist/SHA256SUMS" ]; then
	mkdir -p "$PGFORK_TEST_RUN_DIR/release-bin"
	tar -xzf "$prepared_dist"/pgfork-*-"$(go env GOOS)-$(go env GOARCH)".tar.gz -C "$PGFORK_TEST_RUN_DIR/release-bin" pgfork
	client_bin=("PGFORK_BIN=$PGFORK_TEST_RUN_DIR/release-bin/pgfork")
fi
env "${client_bin[@]}" clients/test.sh
# Zero setup (issue 34): the release for this platform installed as a user
# installs it (npm, pip, the tarball, the Maven repository), and the example projects' tests run with
# nothing else: clean HOME, no Go or pgfork on PATH, no server started by hand;
# uses the npm/pip/cargo caches, Rust target dir and ~/.m2 clients/test.sh filled.
# PGFORK_ZERO_SETUP_CASES narrows it (e.g. "python"; see the script).
stage "clients/zero-setup.sh"
# Uses the release clients/prepare.sh built, or builds it if that failed.
if [ -f "$prepared_dist/SHA256SUMS" ]; then
	export PGFORK_DIST=$prepared_dist
fi
# shellcheck disable=SC2086
clients/zero-setup.sh ${PGFORK_ZERO_SETUP_CASES:-all}
# The service recipes (deploy/): the image's root filesystem run in private
# namespaces, a client in another, and the systemd unit. Needs root.
if [ "$(id -u)" = 0 ]; then
	stage "deploy/smoke.sh"
	deploy/smoke.sh
else
	echo "check: not root: deploy/smoke.sh skipped (it needs namespaces and chroot)" >&2
fi
stage "all passed"
