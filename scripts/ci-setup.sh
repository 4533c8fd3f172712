#!/usr/bin/env bash
# Sets pgfork up on a CI runner in one step: gets pgfork, creates a reflink
# volume (as root, where the disk cannot clone), gets PostgreSQL, starts
# `pgfork serve` in the background, waits for /healthz and exports what
# clients read for later steps. Used by .github/actions/setup-pgfork, the
# GitLab template ci/gitlab/pgfork.gitlab-ci.yml, and clients/test.sh (so
# `make check` runs it exactly as a runner would). See docs/ci.md.
#
# Settings (environment, all optional):
#   PGFORK_BIN        a pgfork binary to use (else built from PGFORK_SOURCE,
#                     else `go install ...@PGFORK_VERSION`)
#   PGFORK_SOURCE     a pgfork checkout to build from
#   PGFORK_VERSION    module version for go install (default latest)
#   PGFORK_PG         PostgreSQL major; installed with `pgfork pg install`
#                     when no build of it is found (default: newest found, else 18)
#   PGFORK_VOLUME     auto (default) or none
#   PGFORK_STATE_DIR  state directory (default: pgfork's, /var/lib/pgfork as root)
#   PGFORK_PORT       port on 127.0.0.1 (default: a free one)
#   PGFORK_TOKEN      API token (default: generated)
#   PGFORK_SERVE_ARGS more arguments for `pgfork serve`
#   PGFORK_LOG        the server's log (default $STATE/serve.log)
#   PGFORK_DOTENV     also write the variables to this file (KEY=VALUE lines)
# Exports (to $GITHUB_ENV when set, to $PGFORK_DOTENV when set, and as
# `export` lines on stdout): PGFORK_URL, PGFORK_TOKEN,
# INTEGRESQL_CLIENT_BASE_URL, PGFORK_BIN, PGFORK_PID, PGFORK_STATE_DIR.
# Step timings go to stderr.
set -euo pipefail

say() { printf '== pgfork ci-setup: %s\n' "$*" >&2; }
die() { say "ERROR: $*"; exit 1; }
now() { date +%s%N; }
t0=$(now)
took() { say "$1 took $(( ($(now) - $2) / 1000000 )) ms"; }

if [ "$(id -u)" != 0 ] && [ "${PGFORK_VOLUME:-auto}" != none ] && command -v sudo >/dev/null && sudo -n true 2>/dev/null; then
	say "re-running as root (sudo) for the volume"
	exec sudo -n --preserve-env bash "$0" "$@"
fi

# 1. pgfork
t=$(now)
bin=${PGFORK_BIN:-}
if [ -z "$bin" ]; then
	command -v go >/dev/null || die "no PGFORK_BIN and no go to build pgfork with (install Go or give PGFORK_BIN)"
	gobin=${GOBIN:-$(go env GOPATH)/bin}
	if [ -n "${PGFORK_SOURCE:-}" ]; then
		say "building pgfork from $PGFORK_SOURCE"
		(cd "$PGFORK_SOURCE" && CGO_ENABLED=0 go build -o "$gobin/pgfork" ./cmd/pgfork) || die "go build failed"
	else
		say "go install github.com/pgfork/pgfork/cmd/pgfork@${PGFORK_VERSION:-latest}"
		CGO_ENABLED=0 GOBIN=$gobin go install "github.com/pgfork/pgfork/cmd/pgfork@${PGFORK_VERSION:-latest}" || die "go install failed"
	fi
	bin=$gobin/pgfork
fi
[ -x "$bin" ] || die "$bin is not an executable"
took "getting pgfork" "$t"

if [ "$(id -u)" = 0 ]; then
	state=${PGFORK_STATE_DIR:-${PGFORK_HOME:-/var/lib/pgfork}}
else
	state=${PGFORK_STATE_DIR:-${PGFORK_HOME:-${XDG_STATE_HOME:-$HOME/.local/state}/pgfork}}
fi
sd=(--state-dir "$state")

# 2. The volume (root only; nothing to do where the disk clones already),
# before PostgreSQL: a volume moves pgfork's state, so what is installed
# next goes onto it. (One made after an install carries the install over;
# one is refused, exit 6, while pgfork runs anything from the state.)
t=$(now)
volume=()
if [ "${PGFORK_VOLUME:-auto}" = auto ]; then
	if [ "$(id -u)" = 0 ]; then
		vlog=$(mktemp)
		if "$bin" "${sd[@]}" --quiet volume create >/dev/null 2>"$vlog"; then
			volume=(--volume auto)
		else
			rc=$?
			if [ "$rc" = 4 ] && grep -q 'can already clone' "$vlog"; then
				say "the state directory's disk clones already: no volume needed"
			else
				cat "$vlog" >&2
				say "volume create failed (exit $rc): going on without a volume"
			fi
		fi
		rm -f "$vlog"
	else
		volume=(--volume auto)
		say "not root and no passwordless sudo: no volume (copies are real copies; see docs/ci.md)"
	fi
fi
took "creating the volume" "$t"

# 3. PostgreSQL: the runner's, else pgfork pg install (onto the volume).
t=$(now)
pgargs=()
[ -z "${PGFORK_PG:-}" ] || pgargs=(--pg "$PGFORK_PG")
if ! "$bin" "${sd[@]}" pg ls --json 2>/dev/null | grep -q "\"major\": ${PGFORK_PG:-[0-9]*},"; then
	major=${PGFORK_PG:-18}
	say "no PostgreSQL $major found; pgfork pg install $major"
	"$bin" "${sd[@]}" pg install "$major" >&2 || die "pgfork pg install $major failed"
fi
took "getting PostgreSQL" "$t"

# 4. pgfork serve in the background, detached from this step.
t=$(now)
port=${PGFORK_PORT:-$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])' 2>/dev/null || echo 5000)}
token=${PGFORK_TOKEN:-$(od -An -N16 -tx1 /dev/urandom | tr -d ' \n')}
url="http://127.0.0.1:$port"
log=${PGFORK_LOG:-$state/serve.log}
# The token goes in the environment: a command line is every local user's to
# read (docs/SECURITY.md, rule 2), and serve refuses --token TOKEN.
# shellcheck disable=SC2086 # PGFORK_SERVE_ARGS is a list of words
PGFORK_TOKEN=$token setsid "$bin" "${sd[@]}" "${pgargs[@]}" serve --managed "${volume[@]}" --listen "127.0.0.1:$port" \
	${PGFORK_SERVE_ARGS:-} >"$log" 2>&1 </dev/null &
pid=$!
health() {
	if command -v curl >/dev/null; then
		curl -s -o /dev/null -w '%{http_code}' "$url/healthz" 2>/dev/null || true
	else
		python3 -c 'import sys, urllib.request, urllib.error
try: print(urllib.request.urlopen(sys.argv[1], timeout=1).status)
except urllib.error.HTTPError as e: print(e.code)
except OSError: print(0)' "$url/healthz"
	fi
}
code=0
for _ in $(seq 1 1800); do
	code=$(health)
	case $code in 200 | 401) break ;; esac
	kill -0 "$pid" 2>/dev/null || { tail -n 30 "$log" >&2; die "pgfork serve exited before it answered"; }
	sleep 0.1
done
case $code in 200 | 401) ;; *) tail -n 30 "$log" >&2; die "pgfork serve did not answer $url/healthz within 180 s" ;; esac
took "starting pgfork serve" "$t"
took "the whole setup" "$t0"

vars=(
	"PGFORK_URL=$url"
	"PGFORK_TOKEN=$token"
	"INTEGRESQL_CLIENT_BASE_URL=$url/api"
	"PGFORK_BIN=$bin"
	"PGFORK_PID=$pid"
	"PGFORK_STATE_DIR=$state"
)
if [ -n "${GITHUB_ENV:-}" ]; then
	echo "::add-mask::$token"
	printf '%s\n' "${vars[@]}" >>"$GITHUB_ENV"
fi
if [ -n "${PGFORK_DOTENV:-}" ]; then
	(umask 077 && printf '%s\n' "${vars[@]}" >"$PGFORK_DOTENV")
fi
if [ -z "${GITHUB_ENV:-}" ] && [ -z "${PGFORK_DOTENV:-}" ]; then
	for v in "${vars[@]}"; do printf 'export %q\n' "$v"; done
fi
say "pgfork serve is up at $url (pid $pid, log $log)"
