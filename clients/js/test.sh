#!/usr/bin/env bash
# Tests the JavaScript/TypeScript client (clients/js) against a live
# `pgfork serve`: npm ci (versions from package-lock.json; no install
# scripts: none is needed, and Prisma's would download engines), tsc --noEmit
# (strict), eslint, the build (ESM + CommonJS + .d.ts), then the tests with
# node's test runner (TAP), which also run the README's examples with vitest,
# jest and node:test, a fixture project shaped like issue 34's (node-pg-migrate
# 6, "moduleResolution": "node", stores opened in beforeEach), and the glue
# starting `pgfork serve` itself when no server is configured (with
# PGFORK_BIN, as clients/test.sh exports it). Needs PGFORK_URL (and PGFORK_TOKEN) naming the server,
# as clients/test.sh exports them; any failure exits non-zero.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
log() { printf '== clients/js/test.sh: %s\n' "$*" >&2; }

for tool in node npm; do
	command -v "$tool" >/dev/null || { log "$tool not found (Node.js >= 20 is needed)"; exit 1; }
done
major=$(node -p 'process.versions.node.split(".")[0]')
[ "$major" -ge 20 ] || { log "node $(node --version) is too old: Node.js >= 20 is needed"; exit 1; }
[ -n "${PGFORK_URL:-}" ] || { log "PGFORK_URL is not set: start pgfork serve and export PGFORK_URL (and PGFORK_TOKEN)"; exit 1; }

cd "$here"
log "npm ci"
if ! npm ci --ignore-scripts --no-audit --no-fund --loglevel=error >/tmp/pgfork-js-npm.$$ 2>&1; then
	cat /tmp/pgfork-js-npm.$$ >&2
	rm -f /tmp/pgfork-js-npm.$$
	log "npm ci FAILED (see above)"
	exit 1
fi
rm -f /tmp/pgfork-js-npm.$$
log "tsc --noEmit (strict): the sources, and the TypeScript examples against the declarations"
npx --no-install tsc --noEmit -p tsconfig.json
log "eslint"
npx --no-install eslint --max-warnings 0 .
log "build"
npm run --silent build
# The examples and fixtures import "pgfork" as a user's project does: through
# node_modules/pgfork, here a link to this package.
for d in examples test/fixtures; do
	mkdir -p "$d/node_modules"
	ln -sfn "$here" "$d/node_modules/pgfork"
done
# The legacy-project fixture gets a copy of pgfork instead: its peers must
# resolve from the project, as in an installed package (node-pg-migrate 6 here).
lp=test/legacy-project/node_modules
rm -rf "$lp/pgfork"
mkdir -p "$lp/pgfork"
cp -R package.json bin dist "$lp/pgfork/"
ln -sfn ../../../node_modules/node-pg-migrate-6 "$lp/node-pg-migrate"
npx --no-install tsc -p tsconfig.examples.json
log "tests (node --test)"
node --test --test-reporter=tap --test-concurrency=2 test/*.test.mjs
