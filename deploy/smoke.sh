#!/bin/bash
# deploy/smoke.sh — smoke test of the service recipes (docs/deploy.md).
#
# No image registry is reachable on CI machines, so the base images of
# deploy/Containerfile cannot be pulled and no `docker build` runs here.
# Instead this script builds the image's root filesystem with the same steps
# (static pgfork built like the builder stage, Debian's PostgreSQL 15 with its
# shared libraries and share files, bash, the non-root user pgfork uid 999,
# the same ENV) and runs it the way a container engine would: chroot as that
# user inside private mount/pid/network namespaces. A client in a SECOND
# network namespace, joined by a veth pair, then runs IntegreSQL's flow
# against it (compose-like: server beyond loopback, client elsewhere).
# It also checks deploy/pgfork.service with systemd-analyze verify and runs
# the unit's ExecStart by hand as its user with its environment.
#
# Needs root, iproute2, util-linux, curl, jq, psql, go. Everything it makes
# lives under one directory made for the run and is removed at the end,
# together with its namespaces, veth pair and mounts. Exit status non-zero
# on any failure; the last line is `deploy smoke: N passed, M failed`.
set -euo pipefail

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
SRC_ROOTFS=
case "${1:-}" in
--rootfs) # test a real image's root filesystem instead of assembling one
	SRC_ROOTFS=${2:?--rootfs needs a directory}
	[[ -x $SRC_ROOTFS/usr/local/bin/pgfork ]] || {
		echo "deploy smoke: $SRC_ROOTFS has no /usr/local/bin/pgfork" >&2
		exit 2
	}
	;;
"") ;;
*)
	echo "usage: deploy/smoke.sh [--rootfs DIR]" >&2
	exit 2
	;;
esac
PG_MAJOR=15
PG_LIB=/usr/lib/postgresql/$PG_MAJOR
PG_SHARE=/usr/share/postgresql/$PG_MAJOR
APP_UID=999 # the Containerfile's user
TOKEN=smoke-$(od -An -N12 -tx1 /dev/urandom | tr -d " \n")
# ACCESS: how the server is opened beyond loopback, and how clients pass.
# Today: a bearer token. Switch these two lines to serve's final access flag
# (token in the base URL path, --allow-from, private-network opt-out).
ACCESS_ENV=("PGFORK_TOKEN=$TOKEN")
ACCESS_CURL=(-H "Authorization: Bearer $TOKEN")

passed=0
failed=0
ok() {
	passed=$((passed + 1))
	echo "ok   [${SECONDS}s] $*"
}
die() {
	failed=$((failed + 1))
	echo "FAIL $*" >&2
	if [[ -n "${SRV_LOG:-}" && -s "${SRV_LOG:-}" ]]; then
		echo "---- last server log lines ($SRV_LOG):" >&2
		tail -n 30 "$SRV_LOG" >&2
	fi
	exit 1
}

[[ $(id -u) == 0 ]] || {
	echo "deploy smoke: needs root (namespaces, chroot, veth)" >&2
	exit 1
}
for t in ip unshare chroot curl jq psql go ldd; do
	command -v "$t" >/dev/null || {
		echo "deploy smoke: $t not found (install it: iproute2, util-linux, curl, jq, postgresql-client, go)" >&2
		exit 1
	}
done
[[ -x $PG_LIB/bin/postgres ]] || {
	echo "deploy smoke: $PG_LIB/bin/postgres not found: apt-get install postgresql-$PG_MAJOR" >&2
	exit 1
}

RUN=$(mktemp -d "${TMPDIR:-/var/tmp}/pgfork-deploy-smoke.XXXXXX")
ID=${RUN##*.}
NS_SRV=pgfork-smoke-$ID-srv
NS_CLI=pgfork-smoke-$ID-cli
VETH_SRV=pfs${ID}s
VETH_CLI=pfs${ID}c
# A private /30 between the two namespaces; neither end is in the host's
# namespace, so it cannot clash with anything on the machine.
SRV_IP=10.213.77.1
CLI_IP=10.213.77.2
ROOTFS=$RUN/rootfs
SRV_PID=
SRV_LOG=
CONTAINERS=() # pids of every container_start, for cleanup

cleanup() {
	local rc=$?
	set +e
	# Each container's main process is pid 1 of its pid namespace: killing it
	# takes the namespace's other processes (postgres) along. (unshare's
	# --kill-child does not reach it: the uid change clears the death signal.)
	local c p
	for c in "${CONTAINERS[@]}"; do
		for p in $(pgrep -P "$c"); do kill -KILL "$p" 2>/dev/null; done
		kill -KILL "$c" 2>/dev/null
		wait "$c" 2>/dev/null
	done
	# Belt and braces: anything still rooted in this run's rootfs is ours.
	for p in /proc/[0-9]*; do
		[[ $(readlink "$p/root" 2>/dev/null) == "$ROOTFS"* ]] && kill -KILL "${p#/proc/}" 2>/dev/null
	done
	ip netns del "$NS_SRV" 2>/dev/null
	ip netns del "$NS_CLI" 2>/dev/null
	rm -rf "/etc/netns/$NS_CLI"
	rmdir /etc/netns 2>/dev/null
	ip link del "$VETH_SRV" 2>/dev/null
	# Mounts were made in private mount namespaces only; make sure none leaked.
	if grep -q " $RUN/" /proc/self/mounts; then
		grep " $RUN/" /proc/self/mounts | awk '{print $2}' | sort -r | xargs -r -n1 umount -l
	fi
	rm -rf "$RUN"
	if [[ $rc != 0 && $failed == 0 ]]; then failed=1; fi
	echo "deploy smoke: $passed passed, $failed failed"
	exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# ---- 1. the image's root filesystem, as deploy/Containerfile builds it ------
VERSION=$(git -C "$REPO" describe --tags --always --dirty 2>/dev/null || echo devel)
COMMIT=$(git -C "$REPO" rev-parse HEAD 2>/dev/null || echo unknown)
if [[ -n $SRC_ROOTFS ]]; then
	# --rootfs: a root filesystem of the real image (deploy/build-image.sh).
	echo "== copying the built image's root filesystem $SRC_ROOTFS to $ROOTFS"
	mkdir -p "$ROOTFS"
	cp -a "$SRC_ROOTFS/." "$ROOTFS/"
	if ldd "$ROOTFS/usr/local/bin/pgfork" >/dev/null 2>&1; then die "pgfork in the image is not static"; fi
	chroot "$ROOTFS" "$PG_LIB/bin/postgres" --version >/dev/null || die "PostgreSQL $PG_MAJOR does not run in the image"
	grep -qx "pgfork:x:$APP_UID:$APP_UID:.*" "$ROOTFS/etc/passwd" || die "the image has no user pgfork with uid/gid $APP_UID"
	[[ $(stat -c %u:%a "$ROOTFS/var/lib/pgfork") == "$APP_UID:700" ]] || die "/var/lib/pgfork in the image is not owned by pgfork (0700)"
	[[ ! -e $ROOTFS/var/lib/postgresql/$PG_MAJOR/main ]] || die "the image has Debian's main cluster (create_main_cluster should be off)"
	ok "image rootfs: static pgfork, $(chroot "$ROOTFS" "$PG_LIB/bin/postgres" --version), user pgfork $APP_UID owning /var/lib/pgfork, no main cluster, $(du -sh "$ROOTFS" | cut -f1)"
	printf '127.0.0.1 localhost\n%s pgfork postgres\n' "$SRV_IP" >"$ROOTFS/etc/hosts"
else
	echo "== building the image root filesystem in $ROOTFS"
	mkdir -p "$ROOTFS"/{usr/bin,usr/sbin,usr/lib,usr/lib64,usr/local/bin,etc,tmp,proc,dev,var/lib/pgfork,run}
	ln -s usr/bin "$ROOTFS/bin"
	ln -s usr/sbin "$ROOTFS/sbin"
	ln -s usr/lib "$ROOTFS/lib"
	ln -s usr/lib64 "$ROOTFS/lib64"
	chmod 1777 "$ROOTFS/tmp"

	# Builder stage: static, versioned like `make build`.
	BUILDDATE=$(date -u +%Y-%m-%dT%H:%M:%SZ)
	(cd "$REPO" && CGO_ENABLED=0 go build -trimpath \
		-ldflags "-s -w -X main.version=$VERSION -X main.commit=$COMMIT -X main.buildDate=$BUILDDATE" \
		-o "$ROOTFS/usr/local/bin/pgfork" ./cmd/pgfork) || die "building pgfork (CGO_ENABLED=0)"
	if ldd "$ROOTFS/usr/local/bin/pgfork" >/dev/null 2>&1; then die "pgfork is not static"; fi
	ok "pgfork built static ($VERSION)"
	install -m 0755 "$REPO/deploy/healthcheck.sh" "$ROOTFS/usr/local/bin/pgfork-healthcheck"

	# Runtime stage: Debian's PostgreSQL package files and what they link to.
	copy_in() { # copy host paths into the rootfs at the same place (symlinks kept)
		local p
		for p in "$@"; do
			[[ -e $p || -L $p ]] || continue
			mkdir -p "$ROOTFS$(dirname "$p")"
			cp -a "$p" "$ROOTFS$(dirname "$p")/"
		done
	}
	copy_in "$PG_LIB" "$PG_SHARE" /usr/share/zoneinfo /bin/bash /bin/sh /usr/bin/dash /usr/bin/env
	# ldd fails on the non-ELF files (scripts, data): ignore its status, keep paths.
	libs=$(find "$PG_LIB" /bin/bash /usr/bin/dash /usr/bin/env -type f \( -perm -u+x -o -name '*.so*' \) -print0 |
		{ xargs -0 ldd 2>/dev/null || true; } | grep -o '/[^ ]*' | grep -v ':$' | sort -u)
	[[ -n $libs ]] || die "ldd found no shared libraries for PostgreSQL"
	for l in $libs; do
		[[ -e $ROOTFS$l ]] && continue
		mkdir -p "$ROOTFS$(dirname "$l")"
		cp -L "$l" "$ROOTFS$l"                 # the library under the name the loader asks for
	done
	chroot "$ROOTFS" "$PG_LIB/bin/postgres" --version >/dev/null || die "PostgreSQL does not run in the rootfs (missing libraries?)"
	ok "rootfs: $("$PG_LIB/bin/postgres" --version), $(du -sh "$ROOTFS" | cut -f1)"

	# The non-root user, created before the package as in the Containerfile.
	cat >"$ROOTFS/etc/passwd" <<EOF
root:x:0:0:root:/root:/bin/bash
pgfork:x:$APP_UID:$APP_UID::/var/lib/pgfork:/usr/sbin/nologin
EOF
	cat >"$ROOTFS/etc/group" <<EOF
root:x:0:
pgfork:x:$APP_UID:
EOF
	printf 'passwd: files\ngroup: files\nhosts: files\n' >"$ROOTFS/etc/nsswitch.conf"
	printf '127.0.0.1 localhost\n%s pgfork postgres\n' "$SRV_IP" >"$ROOTFS/etc/hosts"
	chown "$APP_UID:$APP_UID" "$ROOTFS/var/lib/pgfork"
	chmod 0700 "$ROOTFS/var/lib/pgfork"
fi

# The image's ENV, read from the Containerfile itself so the two cannot drift.
mapfile -t IMAGE_ENV < <(awk '
	/^ENV / { on = 1; sub(/^ENV /, "") }
	on { line = $0; cont = sub(/ *\\$/, "", line); n = split(line, kv, " ");
	     for (i = 1; i <= n; i++) if (kv[i] ~ /=/) print kv[i]; if (!cont) on = 0 }' "$REPO/deploy/Containerfile")
printf '%s\n' "${IMAGE_ENV[@]}" | grep -qx 'PGFORK_HOME=/var/lib/pgfork' || die "Containerfile ENV not understood: ${IMAGE_ENV[*]}"
ok "image user pgfork ($APP_UID), ENV ${IMAGE_ENV[*]}"

got=$(chroot --userspec=$APP_UID:$APP_UID "$ROOTFS" /usr/local/bin/pgfork --version) || die "pgfork --version in the rootfs"
[[ $got == *"$VERSION"* ]] || die "pgfork --version says '$got', want $VERSION"
ok "pgfork --version in the image: $got"

# ---- 2. two network namespaces joined by a veth pair --------------------------
ip netns add "$NS_SRV"
ip netns add "$NS_CLI"
ip link add "$VETH_SRV" type veth peer name "$VETH_CLI"
ip link set "$VETH_SRV" netns "$NS_SRV"
ip link set "$VETH_CLI" netns "$NS_CLI"
ip -n "$NS_SRV" addr add "$SRV_IP/30" dev "$VETH_SRV"
ip -n "$NS_CLI" addr add "$CLI_IP/30" dev "$VETH_CLI"
for ns in "$NS_SRV" "$NS_CLI"; do
	ip -n "$ns" link set lo up
done
ip -n "$NS_SRV" link set "$VETH_SRV" up
# Service names as compose's DNS gives them: `ip netns exec` bind-mounts
# /etc/netns/<ns>/hosts over /etc/hosts for the client's processes.
mkdir -p "/etc/netns/$NS_CLI"
printf '127.0.0.1 localhost\n%s pgfork postgres\n' "$SRV_IP" >"/etc/netns/$NS_CLI/hosts"
ip -n "$NS_CLI" link set "$VETH_CLI" up
# (no ping in the image of CI machines: reachability is proven by /healthz below)
ip -n "$NS_CLI" route get "$SRV_IP" | grep -q "dev $VETH_CLI" || die "no route from the client namespace to $SRV_IP"
ok "network namespaces $NS_SRV ($SRV_IP) and $NS_CLI ($CLI_IP)"

# container ENV... CMD: run CMD in the rootfs as the image's user inside a
# fresh mount+pid namespace in the server's network namespace, in the
# background; SRV_PID is its pid 1. Extra args are NAME=VALUE, then --, then
# the command (default: pgfork serve).
container_start() {
	local envs=() cmd=()
	while [[ $# -gt 0 && $1 != -- ]]; do envs+=("$1"); shift; done
	[[ ${1:-} == -- ]] && shift
	cmd=("$@")
	[[ ${#cmd[@]} -gt 0 ]] || cmd=(/usr/local/bin/pgfork serve)
	SRV_LOG=$RUN/server-$((++starts)).log
	ip netns exec "$NS_SRV" unshare --mount --pid --fork --kill-child --propagation private bash -c '
		set -e
		r=$1; shift
		mount -t proc proc "$r/proc"
		mount -t tmpfs -o mode=0755,size=1m tmpfs "$r/dev"
		for d in null:1:3 zero:1:5 random:1:8 urandom:1:9 tty:5:0; do
			IFS=: read -r n ma mi <<<"$d"; mknod -m 0666 "$r/dev/$n" c "$ma" "$mi"
		done
		mkdir "$r/dev/shm"; mount -t tmpfs -o mode=1777,size=256m tmpfs "$r/dev/shm"
		ln -s /proc/self/fd "$r/dev/fd"
		exec chroot --userspec='"$APP_UID:$APP_UID"' "$r" "$@"
	' smoke "$ROOTFS" /usr/bin/env -i HOME=/var/lib/pgfork PATH=/usr/local/bin:/usr/bin:/bin \
		"${BASE_ENV[@]}" "${envs[@]}" "${cmd[@]}" >"$SRV_LOG" 2>&1 &
	SRV_PID=$!
	CONTAINERS+=("$SRV_PID")
}
starts=0
BASE_ENV=("${IMAGE_ENV[@]}") # the environment every container_start gets

# main_pid: the host pid of the container's main process (pid 1 inside).
main_pid() { pgrep -P "$SRV_PID" | head -n1; }

# container_exec CMD...: a second process in the server's network namespace
# (like `docker exec` / the HEALTHCHECK), as the image user with its ENV.
container_exec() {
	ip netns exec "$NS_SRV" chroot --userspec=$APP_UID:$APP_UID "$ROOTFS" /usr/bin/env -i \
		PATH=/usr/local/bin:/usr/bin:/bin "${IMAGE_ENV[@]}" "$@"
}

# container_stop: SIGTERM to pgfork (what `docker stop` sends), wait for a
# clean exit with status 0.
container_stop() {
	local child
	child=$(main_pid)
	[[ -n $child ]] || die "server process gone before stop"
	kill -TERM "$child"
	local rc=0
	for _ in $(seq 120); do kill -0 "$SRV_PID" 2>/dev/null || break; sleep 0.5; done
	kill -0 "$SRV_PID" 2>/dev/null && die "server did not stop within 60 s of SIGTERM"
	wait "$SRV_PID" || rc=$?
	SRV_PID=
	[[ $rc == 0 ]] || die "server exited with status $rc after SIGTERM"
}

cli() { ip netns exec "$NS_CLI" "$@"; }
# The client's view of the API, as a test container on the compose network:
# from the client namespace to the service name. (The sidecar variant
# switches both to the server's namespace and loopback.)
API_NS=$NS_CLI
API_BASE=http://pgfork:5000
api() { # api METHOD PATH [BODY] -> body on stdout; fails on non-2xx
	local out code
	out=$(ip netns exec "$API_NS" curl -sS -m 60 -o - -w '\n%{http_code}' -X "$1" "${ACCESS_CURL[@]}" \
		-H 'Content-Type: application/json' ${3:+--data "$3"} "$API_BASE$2") || die "curl $1 $2 failed"
	code=${out##*$'\n'}
	out=${out%$'\n'*}
	[[ $code == 2* ]] || die "$1 $2 answered $code: $out"
	printf '%s' "$out"
}
wait_healthy() { # [HOST]: where the healthcheck connects (default 127.0.0.1)
	for _ in $(seq 240); do
		kill -0 "$SRV_PID" 2>/dev/null || die "server exited during start"
		if container_exec PGFORK_HEALTH_HOST="${1:-127.0.0.1}" /usr/local/bin/pgfork-healthcheck 2>/dev/null; then return 0; fi
		sleep 0.5
	done
	die "not healthy within 120 s"
}
# psql_conf JSON SQL: connect with a database config as the API returns it.
psql_conf() {
	local c=$1 sql=$2
	PGPASSWORD=$(jq -r .password <<<"$c") psql -X -q -At -v ON_ERROR_STOP=1 \
		-h "$(jq -r .host <<<"$c")" -p "$(jq -r .port <<<"$c")" \
		-U "$(jq -r .username <<<"$c")" -d "$(jq -r .database <<<"$c")" -c "$sql"
}

# compose_env SERVICE: the environment of a service in deploy/compose.yaml
# as NAME=VALUE lines, ${VAR:-default} expanded like compose does. Reads the
# simple form used there (`      NAME: value` under `    environment:`).
compose_env() {
	local line name value
	awk -v svc="  $1:" '
		$0 == svc { in_svc = 1; next }
		in_svc && /^  [^ #]/ { in_svc = 0 }
		in_svc && $0 == "    environment:" { in_env = 1; next }
		in_env && /^      #/ { next }
		in_env && !/^      [A-Za-z_]+:/ { in_env = 0 }
		in_svc && in_env { sub(/^ +/, ""); print }' "$REPO/deploy/compose.yaml" |
		while IFS= read -r line; do
			name=${line%%:*}
			value=${line#*: }
			value=${value#\"} value=${value%\"}
			if [[ $value =~ ^\$\{([A-Za-z_]+):-(.*)\}$ ]]; then
				value=${!BASH_REMATCH[1]:-${BASH_REMATCH[2]}}
			fi
			printf '%s=%s\n' "$name" "$value"
		done
}

# integresql_flow LABEL WHERE: IntegreSQL's client flow over HTTP from the
# client namespace; psql runs in WHERE (cli: the client namespace; srv: the
# server's, as a sidecar sharing its network would; auto: cli unless the
# database config names a loopback address).
integresql_flow() {
	local label=$1 where=$2 r conf got
	local hash="deploy-smoke-$label-$ID"
	r=$(api POST /api/v1/templates "{\"hash\":\"$hash\"}") # IntegreSQL: POST initializes, PUT finalizes
	conf=$(jq -c .database.config <<<"$r")
	[[ $conf != null ]] || die "$label: no database config in $r"
	if [[ $where == auto ]]; then
		# A managed cluster that hands out loopback can only be reached from
		# the server's own network namespace; once serve advertises an
		# address other containers can reach, the client namespace is used.
		case $(jq -r .host <<<"$conf") in
		127.* | ::1 | localhost) where=srv ;;
		*) where=cli ;;
		esac
	fi
	if [[ $where == cli ]]; then
		cli bash -c "$(declare -f psql_conf); psql_conf '$conf' 'CREATE TABLE smoke (id int PRIMARY KEY); INSERT INTO smoke VALUES (42)'" ||
			die "$label: psql to the template from the client namespace"
	else
		ip netns exec "$NS_SRV" bash -c "$(declare -f psql_conf); psql_conf '$conf' 'CREATE TABLE smoke (id int PRIMARY KEY); INSERT INTO smoke VALUES (42)'" ||
			die "$label: psql to the template in the server namespace"
	fi
	api PUT "/api/v1/templates/$hash" >/dev/null
	r=$(api GET "/api/v1/templates/$hash/tests")
	conf=$(jq -c .database.config <<<"$r")
	if [[ $where == cli ]]; then
		got=$(cli bash -c "$(declare -f psql_conf); psql_conf '$conf' 'SELECT id FROM smoke'") || die "$label: psql to the test database"
	else
		got=$(ip netns exec "$NS_SRV" bash -c "$(declare -f psql_conf); psql_conf '$conf' 'SELECT id FROM smoke'") || die "$label: psql to the test database"
	fi
	[[ $got == 42 ]] || die "$label: test database has '$got', want the template's row 42"
	ok "$label: template $hash created, migrated, finalized; test database $(jq -r .database <<<"$conf") has its table (psql from the $where namespace, server at $(jq -r .host <<<"$conf"):$(jq -r .port <<<"$conf"))"
}

# ---- 3. no access rule: the container refuses to listen beyond loopback -------
container_start
for _ in $(seq 60); do kill -0 "$SRV_PID" 2>/dev/null || break; sleep 0.5; done
rc=0
wait "$SRV_PID" || rc=$?
SRV_PID=
[[ $rc == 2 ]] || die "without an access rule serve exited $rc, want 2 (usage)"
grep -q 'not loopback) needs a way to keep anonymous clients out' "$SRV_LOG" || die "without an access rule: no clear error in the log"
ok "without an access rule the image refuses 0.0.0.0 (exit 2, '$(grep -m1 -o 'listening.*anonymous clients out' "$SRV_LOG")')"

# ---- 4. managed PostgreSQL inside the container ----------------------------------
container_start "${ACCESS_ENV[@]}"
wait_healthy
ok "managed: HEALTHCHECK (pgfork-healthcheck, bash /dev/tcp) passes"
got=$(cli curl -sS -m 10 "$API_BASE/healthz") || die "GET /healthz from the client namespace"
ok "managed: GET $API_BASE/healthz from the client namespace: $got"
code=$(cli curl -s -m 10 -o /dev/null -w '%{http_code}' "$API_BASE/api/v1/templates/x/tests") || true
[[ $code == 401 ]] || die "API without credentials answered $code, want 401"
ok "managed: API without credentials is refused (401)"
ps_uid=$(ps -o uid=,comm= --ppid "$(main_pid)" | awk '$2 == "postgres" {print $1}' | sort -u | tr -d ' \n')
[[ $ps_uid == "$APP_UID" ]] || die "the managed postmaster runs as uid '$ps_uid', want $APP_UID"
ok "managed: PostgreSQL runs as the image user (uid $APP_UID), state in the volume $(ls "$ROOTFS/var/lib/pgfork" | tr '\n' ' ')"
# The managed cluster listens on the container's loopback only and hands out
# 127.0.0.1: its databases are reachable from the server's network namespace
# (a sidecar, `network_mode: service:pgfork`), not from another one.
integresql_flow managed auto

# restart on the same volume: state and templates survive, clean shutdown
container_stop
grep -q 'PostgreSQL stopped' "$SRV_LOG" || die "managed: no clean PostgreSQL stop in the log"
ok "managed: SIGTERM stops serve and its PostgreSQL cleanly (exit 0)"
# Restart on the same volume as compose's `pgfork-managed` service: its
# environment from deploy/compose.yaml, loopback only, the tests sharing its
# network namespace (network_mode: service:pgfork-managed).
mapfile -t cenv < <(compose_env pgfork-managed)
printf '%s\n' "${cenv[@]}" | grep -qx 'INTEGRESQL_ADDRESS=127.0.0.1' || die "compose pgfork-managed: environment not understood: ${cenv[*]}"
container_start "${cenv[@]}"
wait_healthy
code=$(cli curl -s -m 5 -o /dev/null -w '%{http_code}' "$API_BASE/healthz") || true
[[ $code == 000 ]] || die "compose pgfork-managed: reachable from the client namespace ($code), want loopback only"
API_NS=$NS_SRV API_BASE=http://127.0.0.1:5000
saved_access=("${ACCESS_CURL[@]}") ACCESS_CURL=() # loopback: no access rule
r=$(api GET "/api/v1/templates/deploy-smoke-managed-$ID/tests")
ACCESS_CURL=("${saved_access[@]}")
ip netns exec "$NS_SRV" bash -c "$(declare -f psql_conf); psql_conf '$(jq -c .database.config <<<"$r")' 'SELECT id FROM smoke'" | grep -qx 42 ||
	die "managed: after a restart on the same volume the template's data is gone"
ok "compose pgfork-managed (${cenv[*]}): restarted on the same volume, loopback only, the sidecar gets a test database of the finalized template"
API_NS=$NS_CLI API_BASE=http://pgfork:5000
container_stop

# ---- 4b. state on a bind-mounted host XFS (reflink) directory: copies clone --------
# docs/deploy.md "A reflink volume for the container's state": the host's
# XFS directory mounted as the container's state directory.
if [[ -n ${PGFORK_TEST_XFS:-} && -d ${PGFORK_TEST_XFS:-} ]]; then
	XFS_DIR=$(mktemp -d "$PGFORK_TEST_XFS/deploy-smoke.XXXXXX")
	chown "$APP_UID:$APP_UID" "$XFS_DIR"
	chmod 0700 "$XFS_DIR"
	install -d -o "$APP_UID" -g "$APP_UID" -m 0700 "$ROOTFS/var/lib/pgfork-xfs"
	mount --bind "$XFS_DIR" "$ROOTFS/var/lib/pgfork-xfs"
	container_start "${ACCESS_ENV[@]}" PGFORK_HOME=/var/lib/pgfork-xfs
	wait_healthy
	integresql_flow xfs auto
	[[ -n $(ls -A "$XFS_DIR") ]] || die "xfs: serve wrote nothing on the bind-mounted XFS directory"
	got=$(container_exec /usr/local/bin/pgfork doctor --json /var/lib/pgfork-xfs | jq -r '.probe.fs_type + " " + .will_use')
	[[ $got == "xfs clone" ]] || die "xfs: doctor in the container says '$got', want 'xfs clone'"
	container_stop
	ok "xfs: state on a bind-mounted host XFS directory ($got: copies are clones), serve runs and stops cleanly"
	umount "$ROOTFS/var/lib/pgfork-xfs"
	rm -rf "$XFS_DIR"
else
	echo "skip [${SECONDS}s] xfs: PGFORK_TEST_XFS not set (scripts/test-env.sh): no bind-mounted XFS state tested"
fi

# ---- 5. pgfork in front of a `postgres` service (compose's `pgfork`) -------------
# The database server is a second "container" from the same rootfs sharing
# the server network namespace (name `postgres`); pgfork gets exactly the
# environment of the `pgfork` service in deploy/compose.yaml.
export PGFORK_TOKEN=$TOKEN # ACCESS: what `PGFORK_TOKEN=... docker compose up` passes
mapfile -t cenv < <(compose_env pgfork)
unset PGFORK_TOKEN
pg_password=$(printf '%s\n' "${cenv[@]}" | sed -n 's/^INTEGRESQL_PGPASSWORD=//p')
[[ -n $pg_password ]] || die "compose pgfork: no INTEGRESQL_PGPASSWORD in ${cenv[*]}"
EXT=$RUN/rootfs/var/lib/pgfork/external
install -d -o $APP_UID -g $APP_UID -m 0700 "$EXT"
printf '%s\n' "$pg_password" >"$ROOTFS/tmp/pw" && chmod 0644 "$ROOTFS/tmp/pw"
container_start LC_ALL=C -- "$PG_LIB/bin/initdb" -D /var/lib/pgfork/external/data -U postgres --pwfile=/tmp/pw \
	--auth-local=trust --auth-host=scram-sha-256 -N
wait "$SRV_PID" || die "initdb for the postgres service failed"
SRV_PID=
echo "host all all $CLI_IP/32 scram-sha-256" >>"$EXT/data/pg_hba.conf"
echo "host all all $SRV_IP/32 scram-sha-256" >>"$EXT/data/pg_hba.conf"
container_start -- "$PG_LIB/bin/postgres" -D /var/lib/pgfork/external/data \
	-c listen_addresses="$SRV_IP" -c port=5432 -c unix_socket_directories=/tmp -c fsync=off
PG_PID_SAVED=$SRV_PID
PG_LOG=$SRV_LOG
for _ in $(seq 120); do
	cli env PGPASSWORD="$pg_password" psql -X -At -h postgres -U postgres -d postgres -c 'SELECT 1' >/dev/null 2>&1 && break
	kill -0 "$PG_PID_SAVED" 2>/dev/null || { SRV_LOG=$PG_LOG; die "postgres service did not start"; }
	sleep 0.5
done
ok "postgres service listening on postgres:5432 ($SRV_IP, scram)"

container_start "${cenv[@]}"
wait_healthy
[[ $(ps -o comm= --ppid "$(main_pid)" | grep -c postgres) == 0 ]] ||
	die "external: serve started a managed PostgreSQL although INTEGRESQL_PGHOST was set"
ok "compose pgfork: serve uses the postgres service (${cenv[*]/PGFORK_TOKEN=*/PGFORK_TOKEN=…}), no managed cluster"
# compose.yaml's ACCESS line admits the compose network (PGFORK_ALLOW_FROM):
# the client sends no token at all, as IntegreSQL's clients do.
saved_access=("${ACCESS_CURL[@]}") ACCESS_CURL=()
integresql_flow external cli
ACCESS_CURL=("${saved_access[@]}")
# ... by its service name (PGFORK_ALLOWED_HOSTS); another name in Host, as a
# DNS-rebinding page in a browser would send, is refused (421).
code=$(cli curl -s -m 10 -o /dev/null -w '%{http_code}' -H 'Host: rebound.example:5000' "$API_BASE/api/v2/templates") || true
[[ $code == 421 ]] || die "compose pgfork: a request naming another host answered $code, want 421"
ok "compose pgfork: a request without a token naming another host than pgfork is refused (421)"
container_stop
SRV_PID=$PG_PID_SAVED
kill -INT "$(main_pid)"
wait "$SRV_PID" || true
SRV_PID=

# ---- 6. the systemd unit --------------------------------------------------------
UNIT=$REPO/deploy/pgfork.service
mkdir -p "$RUN/unit"
# verify needs the ExecStart binary to exist: point it at the one just built.
sed "s#/usr/local/bin/pgfork#$ROOTFS/usr/local/bin/pgfork#g" "$UNIT" >"$RUN/unit/pgfork.service"
if command -v systemd-analyze >/dev/null; then
	if out=$(systemd-analyze verify --man=no "$RUN/unit/pgfork.service" 2>&1); then
		[[ -z $out ]] || { echo "$out" >&2; die "systemd-analyze verify printed warnings"; }
		ok "systemd-analyze verify deploy/pgfork.service: clean"
	else
		echo "$out" >&2
		die "systemd-analyze verify deploy/pgfork.service"
	fi
else
	echo "skip systemd-analyze verify: systemd-analyze not installed (apt-get install systemd)"
fi
# Run ExecStart by hand as the unit's user with the unit's Environment= and
# an EnvironmentFile like /etc/pgfork/serve.env (in the rootfs, whose pgfork
# user stands in for the unit's User=). The hardening options are not applied.
unit_user=$(sed -n 's/^User=//p' "$UNIT")
[[ $unit_user == pgfork ]] || die "unit User= is '$unit_user', this test expects pgfork"
mapfile -t unit_env < <(sed -n 's/^Environment=//p' "$UNIT" | tr ' ' '\n' | tr -d '"')
exec_start=$(sed -n 's/^ExecStart=//p' "$UNIT")
read -r -a exec_argv <<<"$exec_start"
install -d -o $APP_UID -g $APP_UID -m 0700 "$ROOTFS/var/lib/pgfork-unit"
unit_env=("${unit_env[@]/#PGFORK_HOME=*/PGFORK_HOME=/var/lib/pgfork-unit}")
# serve.env as docs/deploy.md shows it: address, port and access rule.
envfile=("INTEGRESQL_ADDRESS=$SRV_IP" "INTEGRESQL_PORT=5000" "${ACCESS_ENV[@]}")
BASE_ENV=() # only the unit's environment, not the image's
container_start "${unit_env[@]}" "${envfile[@]}" -- "${exec_argv[@]}"
wait_healthy "$SRV_IP"
integresql_flow unit auto
container_stop
ok "unit ExecStart ($exec_start) as user $unit_user with Environment=${unit_env[*]}: serves and stops cleanly on SIGTERM"
