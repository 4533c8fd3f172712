#!/usr/bin/env bash
# Tests the Rust client (clients/rust) against a live `pgfork serve`:
# cargo fmt --check, cargo clippy -D warnings and cargo test (unit tests, the
# tests against the server, the example crate that uses #[pgfork::test] as
# README.md shows, doctests), all with --locked and --all-features in the
# one dev profile, so clippy and the tests share their build scripts and
# proc macros. Installs nothing outside the repository except crates into
# CARGO_HOME (target/ is clients/rust/target). Needs PGFORK_URL (and
# PGFORK_TOKEN, INTEGRESQL_CLIENT_BASE_URL) naming the server, as
# clients/test.sh exports them; pgfork/tests/autostart.rs also starts servers of
# its own (no PGFORK_URL, as a new user's run) with $PGFORK_BIN (clients/test.sh
# exports it) or pgfork on PATH. Any failure exits non-zero.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
log() { printf '== clients/rust/test.sh: %s\n' "$*" >&2; }

command -v cargo >/dev/null || {
	log "cargo not found: install Rust (stable >= 1.89, with clippy and rustfmt) and put cargo on PATH"
	exit 1
}
for sub in clippy fmt; do
	cargo "$sub" --version >/dev/null 2>&1 || { log "cargo $sub not found: install it (rustup component add $([ "$sub" = fmt ] && echo rustfmt || echo clippy))"; exit 1; }
done
[ -n "${PGFORK_URL:-}" ] || { log "PGFORK_URL is not set: start pgfork serve and export PGFORK_URL (and PGFORK_TOKEN)"; exit 1; }

cd "$here"
log "$(cargo --version), $(rustc --version)"
log "cargo fmt --check"
cargo fmt --all --check
log "cargo clippy -D warnings"
nice cargo clippy --locked --all-targets --all-features -- -D warnings
log "cargo test"
# Test binaries run one after another; their tests in parallel (cargo's default threads).
nice cargo test --locked --all-features 2>&1
