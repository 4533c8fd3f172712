#!/usr/bin/env bash
# The test command of the README and of CI: prepare the real test environment
# (packages, XFS reflink image, tmpfs, a second PostgreSQL major), run lint and
# every test, then tear the filesystems down again.
set -euo pipefail
cd "$(dirname "$0")/.."

if [ "$(id -u)" = 0 ]; then
	# As root we can build the whole environment, so nothing may be skipped.
	export PGFORK_TEST_REQUIRE=${PGFORK_TEST_REQUIRE:-1}
	trap 'scripts/test-env.sh down' EXIT
else
	echo "check: not root: tests that need XFS, tmpfs or mounts will skip (run with sudo for the full suite)" >&2
fi
scripts/test-env.sh up
eval "$(scripts/test-env.sh env)"
make lint
go test -race -count=1 -timeout 60m ./... 2>&1 | tee /tmp/pgfork-test.log
# The client libraries (a Go module of their own and a pip package) against a real `pgfork serve`.
clients/test.sh
