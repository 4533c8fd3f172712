#!/usr/bin/env bash
# Tests pgfork's Java client (Maven: pgfork, pgfork-junit5, pgfork-spring and
# the Spring Boot examples) against the live `pgfork serve` clients/test.sh
# started (PGFORK_URL, PGFORK_TOKEN), and once with no server configured, where
# the client starts one itself from PGFORK_BIN. Maven's repository is the
# user's (~/.m2), so a second run downloads nothing. Any failure exits non-zero.
set -euo pipefail
cd "$(dirname "$0")"
log() { printf '== clients/java/test.sh: %s\n' "$*" >&2; }
[ -n "${PGFORK_URL:-}" ] || { log "PGFORK_URL is not set: start pgfork serve and export PGFORK_URL (and PGFORK_TOKEN)"; exit 1; }
[ -n "${PGFORK_BIN:-}" ] && [ -x "$PGFORK_BIN" ] || { log "PGFORK_BIN must name a pgfork build (the autostart test starts it)"; exit 1; }
command -v mvn >/dev/null || { log "mvn not found: install Maven (Debian: apt-get install maven)"; exit 1; }
mkdir -p pgfork/target
state=$PWD/pgfork/target/pgfork-autostart
rm -rf "$state"
log "mvn verify (client, JUnit 5, Spring; examples on Spring Boot 4.0, 3.5 and 3.2)"
mvn -B -ntp -Dpgfork.skipAutostart=false verify
# The server the autostart test started goes when the last JVM holding its
# lease is gone (serve --lease); none may be left behind.
[ -f "$state/serve.json" ] || { log "the autostart test left no $state/serve.json: it did not start a serve"; exit 1; }
for _ in $(seq 1 30); do
	pgrep -f -- "--state-dir $state/state" >/dev/null || break
	sleep 0.1
done
if pgrep -f -- "--state-dir $state/state" >/dev/null; then
	log "the pgfork serve the autostart test started is still running 3 s after the tests ended"
	pgrep -af -- "--state-dir $state/state" >&2
	exit 1
fi
log "the autostarted pgfork serve stopped with the test JVMs"
