#!/usr/bin/env bash
# Prepares (or tears down) the real filesystems and PostgreSQL builds that
# pgfork's tests run against. Idempotent: run it as often as you like.
#
#   scripts/test-env.sh up     # install packages, mount XFS/tmpfs/small fs, install a second PostgreSQL major
#   scripts/test-env.sh down   # unmount and remove what "up" created
#   scripts/test-env.sh env    # print the environment variables the tests read (eval "$(scripts/test-env.sh env)")
#
# Needs root for mounts and packages; without root it prints what it skipped,
# and the tests that need those filesystems skip (or fail under PGFORK_TEST_REQUIRE=1).
set -euo pipefail

BASE=${PGFORK_TEST_BASE:-/var/tmp/pgfork-test}
MNT=${PGFORK_TEST_MNT:-/mnt/pgfork-test}
XFS_SIZE=${PGFORK_TEST_XFS_SIZE:-40G}
SECOND_MAJOR=${PGFORK_TEST_SECOND_MAJOR:-18}
ROOT=$(cd "$(dirname "$0")/.." && pwd)

log() { echo "test-env: $*" >&2; }

is_root() { [ "$(id -u)" = 0 ]; }

install_packages() {
	local need=()
	command -v mkfs.xfs >/dev/null || need+=(xfsprogs)
	command -v pgbench >/dev/null || [ -x /usr/lib/postgresql/15/bin/pgbench ] || need+=(postgresql-contrib)
	command -v unzip >/dev/null || need+=(unzip)
	if [ ${#need[@]} -gt 0 ]; then
		if ! is_root; then log "missing packages ${need[*]} (run as root to install)"; return; fi
		log "installing ${need[*]}"
		apt-get update -qq >/dev/null
		DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need[@]}" >/dev/null
	fi
}

mounted() { mountpoint -q "$1"; }

mount_xfs() {
	mkdir -p "$BASE" "$MNT/xfs"
	if mounted "$MNT/xfs"; then return; fi
	if [ ! -f "$BASE/xfs.img" ]; then
		truncate -s "$XFS_SIZE" "$BASE/xfs.img"
		mkfs.xfs -q -m reflink=1 "$BASE/xfs.img"
	fi
	mount -o loop "$BASE/xfs.img" "$MNT/xfs"
	chmod 0755 "$MNT/xfs"
	log "XFS (reflink) mounted at $MNT/xfs"
}

mount_tmpfs() {
	mkdir -p "$MNT/tmpfs" "$MNT/small"
	mounted "$MNT/tmpfs" || mount -t tmpfs -o size=2G,mode=0755 pgfork-tmpfs "$MNT/tmpfs"
	mounted "$MNT/small" || mount -t tmpfs -o size=64M,mode=0755 pgfork-small "$MNT/small"
}

second_major() {
	# A second PostgreSQL major, installed the way users do it: `pgfork pg install`
	# (a no-op when some $SECOND_MAJOR.x is installed already).
	local home=${PGFORK_TEST_HOME:-$BASE/home}
	mkdir -p "$home"; chmod 0755 "$BASE" "$home"
	local d
	for d in "$home"/installs/"$SECOND_MAJOR".*/bin; do
		[ -x "$d/postgres" ] && return 0
	done
	if ! have_pip; then
		log "pip not found: cannot install PostgreSQL $SECOND_MAJOR (install python3-pip)"
		return 0
	fi
	log "installing PostgreSQL $SECOND_MAJOR with pgfork pg install"
	(cd "$ROOT" && go run ./cmd/pgfork --state-dir "$home" pg install "$SECOND_MAJOR") >&2
}

have_pip() {
	[ -n "${PGFORK_PIP:-}" ] || command -v pip3 >/dev/null || command -v pip >/dev/null ||
		python3 -m pip --version >/dev/null 2>&1
}

print_env() {
	local home=${PGFORK_TEST_HOME:-$BASE/home}
	local bins="" d
	for d in /usr/lib/postgresql/*/bin "$home"/installs/*/bin; do
		[ -x "$d/postgres" ] && bins="$bins${bins:+:}$d"
	done
	echo "export PGFORK_TEST_PG_BINS='$bins'"
	echo "export PGFORK_TEST_SECOND_MAJOR='$SECOND_MAJOR'"
	# pgbin's install test downloads with pip (its cache makes that cheap).
	have_pip && echo "export PGFORK_TEST_INSTALL=1"
	mounted "$MNT/xfs" && echo "export PGFORK_TEST_XFS='$MNT/xfs'"
	mounted "$MNT/tmpfs" && echo "export PGFORK_TEST_TMPFS='$MNT/tmpfs'"
	mounted "$MNT/small" && echo "export PGFORK_TEST_SMALLFS='$MNT/small'"
	return 0
}

down() {
	for m in "$MNT/xfs" "$MNT/tmpfs" "$MNT/small"; do
		mounted "$m" && umount "$m" || true
	done
	rm -f "$BASE/xfs.img"
	log "test filesystems removed"
}

case "${1:-up}" in
up)
	install_packages
	if is_root; then
		mount_xfs
		mount_tmpfs
	else
		log "not root: skipping XFS and tmpfs mounts"
	fi
	second_major
	;;
down) down ;;
env) print_env ;;
*) echo "usage: $0 up|down|env" >&2; exit 2 ;;
esac
