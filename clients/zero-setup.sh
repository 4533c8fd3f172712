#!/usr/bin/env bash
# Proves issue 34's zero setup: a developer installs the released packages and
# runs their tests, with nothing else: no Go, no pgfork on PATH, no server
# started by hand, a clean HOME. Builds the release for this machine's platform
# only (`make release PLATFORMS=<host>`), then, in fresh copies of the example
# projects:
#
#   vitest  clients/js/examples/vitest: npm install of the packed tarballs, npx vitest run
#   jest    clients/js/examples/jest:   the same, npx jest, with PGHOST, PGPORT, PGUSER, PGPASSWORD and
#           PGDATABASE set to a listener that is not pgfork's server: nothing may connect to it
#   pytest  clients/python/examples/pytest_project: pip install of the wheel into a fresh venv, pytest
#   django  clients/python/examples/django_project: the same, python manage.py test, then pytest
#   rust    clients/rust/example: cargo test, with pgfork (and its platform crate with the binary)
#           from the release's crates dist/cargo as a registry, and no pgfork on PATH
#   java    clients/java/examples/spring-boot-3 (Spring Boot 3.5), then spring-boot-3.2 (the oldest
#           line supported): mvn test with pgfork-spring from the
#           release's Maven repository dist/maven (as the README's <repository> takes it) into an
#           empty local repository, and only the release tarball's binary on PATH (the tests start it)
#   nopg    the pytest example on a machine with no PostgreSQL (root: a mount namespace hides
#           /usr/lib/postgresql and pg_config): the server the plugin starts installs one
#           (pgfork pg install's way, no pip) into a state directory of its own, and the tests pass
#
# Each case runs twice. After each run no pgfork or postgres process of it may
# be left 60 s after it ends: a leak (how promptly serve stops is
# TestServeStopsPromptly's; the run is in a PID namespace of its own as root,
# so "of it" is exact), and the second run must reuse the first run's template
# (its database, by OID, is still in the managed cluster); both runs' times
# are printed (bench/ holds the timed proof: second run's setup <= 1 s).
#
#   clients/zero-setup.sh [CASE...]   CASE: vitest jest pytest django rust java nopg, or js, python, all (default)
#
#   PGFORK_DIST=DIR         use a release already built there (make release DIST=DIR) instead of building one
#   PGFORK_ZERO_KEEP=1      keep the work directory (printed) for a look afterwards
#   CARGO_TARGET_DIR        the Rust case builds there (default clients/rust/target, which
#                           clients/rust/test.sh filled: only pgfork's crates and the example rebuild)
#   PGFORK_ZERO_JAVA_TESTS  the Java case's -Dtest (default Boot3SlicesTest*: the whole application,
#                           @DataJpaTest and @JdbcTest; "" for all of the example's tests)
#
# npm's, pip's and cargo's download caches are the calling user's (nothing is
# downloaded twice); so are the registry settings (~/.npmrc, pip.conf, proxies).
# Maven's local repository is a fresh, empty one (the clean HOME's): third-party
# plugins and dependencies come from the user's ~/.m2/repository (a file
# repository: offline, when clients/java/test.sh filled it) and Maven Central
# only for what that lacks; io.pgfork's only from dist/maven, which is checked.
# Needs python3, and for the cases node/npm (>= 20), cargo and mvn (JDK >= 17);
# Go only to build the release. Any failure exits non-zero with what the run printed.
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
# Each line says when, and the seconds and the machine's busy CPU-seconds
# since the script began, so that CI's log shows which suite costs the time.
# shellcheck source=../scripts/cpu-busy.sh
. "$root/scripts/cpu-busy.sh"
cpu_start=$(cpu_busy)
log() { printf '== clients/zero-setup.sh: %s (%s, %d s and %d CPU-s in)\n' "$*" "$(date -u +%H:%M:%S)" "$SECONDS" "$(($(cpu_busy) - cpu_start))" >&2; }
die() { log "FAILED: $*"; exit 1; }

cases=()
for a in "${@:-all}"; do
	case $a in
	all) cases+=(vitest jest pytest django rust java nopg) ;;
	js) cases+=(vitest jest) ;;
	python) cases+=(pytest django) ;;
	vitest | jest | pytest | django | rust | java | nopg) cases+=("$a") ;;
	*) die "unknown case $a: want vitest, jest, pytest, django, rust, java, nopg, js, python or all" ;;
	esac
done
want() { local c; for c in "${cases[@]}"; do [ "$c" = "$1" ] && return 0; done; return 1; }
want_js() { want vitest || want jest; }

work=$(mktemp -d "${TMPDIR:-/var/tmp}/pgfork-zero.XXXXXX")
chmod 755 "$work" # the managed PostgreSQL runs as an unprivileged user when we are root
finish() {
	local status=$?
	# A volume a server made under $work is unmounted before rm -rf.
	if [ -n "${tarbin:-}" ] && [ -x "$tarbin" ]; then
		find "$work" "${rust_state:-$work}" -name volume.json -path '*/pgfork*' 2>/dev/null | while read -r v; do
			"$tarbin" --state-dir "$(dirname "$v")" volume rm >&2 || true
		done
	fi
	# The Rust case's registry caches in CARGO_HOME.
	! declare -F rust_forget_registry >/dev/null || rust_forget_registry
	if [ "${PGFORK_ZERO_KEEP:-}" = 1 ]; then
		log "kept $work"
	else
		rm -rf "$work"
	fi
	[ "$status" -eq 0 ] || log "FAILED (exit $status)"
	exit "$status"
}
trap finish EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

orig_home=$HOME
version=$(cat "$root/VERSION")
case "$(uname -s)-$(uname -m)" in
Linux-x86_64) goos=linux goarch=amd64 node_plat=linux-x64 wheel_tag=manylinux_2_17_x86_64 ;;
Linux-aarch64) goos=linux goarch=arm64 node_plat=linux-arm64 wheel_tag=manylinux_2_17_aarch64 ;;
Darwin-arm64) goos=darwin goarch=arm64 node_plat=darwin-arm64 wheel_tag=macosx_12_0_arm64 ;;
Darwin-x86_64) goos=darwin goarch=amd64 node_plat=darwin-x64 wheel_tag=macosx_12_0_x86_64 ;;
*) die "no release is built for $(uname -s) $(uname -m)" ;;
esac

# --- the release, for this platform only ---------------------------------------
if [ -n "${PGFORK_DIST:-}" ]; then
	dist=$(cd "$PGFORK_DIST" && pwd)
	log "using the release in $dist"
else
	dist=$work/dist
	log "make release PLATFORMS=$goos/$goarch (version $version)"
	t0=$(date +%s.%N)
	flags=
	want_js || flags=--skip-js
	want java || flags+=" --skip-java"
	want rust || flags+=" --skip-rust"
	make -s -C "$root" release PLATFORMS="$goos/$goarch" DIST="$dist" RELEASEFLAGS="$flags" >"$work/release.log" 2>&1 ||
		{ cat "$work/release.log" >&2; die "make release failed"; }
	log "release built in $(awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN{printf "%.1f", b-a}') s"
fi
(cd "$dist" && sha256sum --quiet -c SHA256SUMS) || die "$dist/SHA256SUMS does not match the files"
tarball=$dist/pgfork-$version-$goos-$goarch.tar.gz
[ -f "$tarball" ] || die "no $tarball"
mkdir -p "$work/tarball-bin"
tar -xzf "$tarball" -C "$work/tarball-bin" pgfork
tarbin=$work/tarball-bin/pgfork

# --- the clean environment --------------------------------------------------------
# PATH: the tools a developer of each ecosystem has (linked one by one) and the
# system's directories; never Go or pgfork.
mkdir -p "$work/tools" "$work/home" "$work/tmp"
chmod 1777 "$work/tmp"
for t in node npm npx python3 cargo rustc rustdoc mvn java; do
	p=$(command -v "$t" 2>/dev/null) || continue
	ln -s "$p" "$work/tools/$t"
done
clean_path=$work/tools:/usr/bin:/bin:/usr/sbin:/sbin
for t in go pgfork; do
	if PATH=$clean_path command -v "$t" >/dev/null; then
		die "$(PATH=$clean_path command -v "$t") is on the clean PATH ($clean_path): the proof needs a PATH without $t"
	fi
done
clean_env=(env -i "HOME=$work/home" "PATH=$clean_path" "TMPDIR=$work/tmp" "LANG=C.UTF-8" "TERM=dumb"
	# Where the downloads are cached and the registries configured: the user's.
	"npm_config_cache=$(npm config get cache 2>/dev/null || echo "$orig_home/.npm")"
	"npm_config_prefer_offline=true" "npm_config_audit=false" "npm_config_fund=false"
	"npm_config_update_notifier=false" "npm_config_loglevel=error"
	"PIP_CACHE_DIR=${PIP_CACHE_DIR:-${XDG_CACHE_HOME:-$orig_home/.cache}/pip}" "PIP_DISABLE_PIP_VERSION_CHECK=1"
	"CARGO_HOME=${CARGO_HOME:-$orig_home/.cargo}" "RUSTUP_HOME=${RUSTUP_HOME:-$orig_home/.rustup}"
	# pgfork's own state (the Python plugin's server, PostgreSQL installs) stays
	# in this run's directory, as check.sh keeps every test's.
	"PGFORK_HOME=$work/pgfork-home")
[ ! -f "$orig_home/.npmrc" ] || clean_env+=("NPM_CONFIG_USERCONFIG=$orig_home/.npmrc")
for f in "$orig_home/.config/pip/pip.conf" "$orig_home/.pip/pip.conf"; do
	[ ! -f "$f" ] || { clean_env+=("PIP_CONFIG_FILE=$f"); break; }
done
for v in http_proxy https_proxy no_proxy HTTP_PROXY HTTPS_PROXY NO_PROXY SSL_CERT_FILE; do
	[ -z "${!v:-}" ] || clean_env+=("$v=${!v}")
done

# Runs in a PID namespace of its own (root), so the processes left after the
# run are exactly the run's: after CMD, waits up to 60 s for every pgfork and
# postgres process to exit; fails if one is left.
ns=()
if [ "$(id -u)" = 0 ] && unshare --pid --fork --mount-proc true 2>/dev/null; then
	ns=(unshare --pid --fork --mount-proc)
else
	log "not root (or no PID namespaces): leftovers are looked for among processes whose directory is under $work"
fi
cat >"$work/run-one.sh" <<'EOF'
#!/bin/bash
# run-one.sh DIR WORK CMD...: CMD in DIR; then no pgfork/postgres process may be left within 60 s.
dir=$1 work=$2
shift 2
cd "$dir" || exit 1
"$@"
rc=$?
ours() {
	local p c
	for p in /proc/[0-9]*; do
		c=$(cat "$p/comm" 2>/dev/null) || continue
		case $c in pgfork | postgres) ;; *) continue ;; esac
		[ "$(awk '{print $3}' "$p/stat" 2>/dev/null)" = Z ] && continue
		if [ "$$" != 1 ]; then # not in a namespace of our own: only processes under $work
			case "$(readlink "$p/cwd" 2>/dev/null) $(tr '\0' ' ' <"$p/cmdline" 2>/dev/null)" in *"$work"*) ;; *) continue ;; esac
		fi
		printf '%s %s\n' "${p#/proc/}" "$(tr '\0' ' ' <"$p/cmdline" 2>/dev/null)"
	done
}
# A leak stays; a stop only slowed by the machine's load goes on its own
# (how promptly serve stops is TestServeStopsPromptly's to hold it to).
for _ in $(seq 1 600); do
	left=$(ours)
	[ -z "$left" ] && break
	sleep 0.1
done
if [ -n "$left" ]; then
	echo "== left running 60 s after the run ended (exit $rc):" >&2
	printf '%s\n' "$left" >&2
	[ "$rc" -ne 0 ] || rc=99
fi
exit "$rc"
EOF
chmod +x "$work/run-one.sh"

# databases STATE_DIR: the databases the runs made in the managed clusters
# under STATE_DIR, as the OIDs of their directories (base/<oid>, from 16384):
# a template kept between runs keeps its OID, a rebuilt one gets a new one.
databases() {
	find "$1" -path '*/base/*' -prune -type d -name '[0-9]*' -printf '%f\n' 2>/dev/null | awk '$1 >= 16384' | sort -n | tr '\n' ' '
}

# twice NAME DIR STATE_DIR CMD...: runs CMD in DIR twice in the clean
# environment; after each run no process may be left, and a database the
# first run left in STATE_DIR (its template) must still be there after the second.
twice() {
	local name=$1 dir=$2 state=$3 t0 secs first second i kept o
	shift 3
	for i in 1 2; do
		log "$name: run $i: $*"
		t0=$(date +%s.%N)
		if ! "${clean_env[@]}" "${ns[@]}" "$work/run-one.sh" "$dir" "$work" "$@" >"$work/$name.$i.log" 2>&1; then
			tail -n 80 "$work/$name.$i.log" >&2
			die "$name: run $i failed (its last 80 lines above)"
		fi
		secs=$(awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN{printf "%.1f", b-a}')
		if [ "$i" = 1 ]; then
			first=$(databases "$state")
			[ -n "$first" ] || die "$name: no database in a managed cluster under $state after the first run (is that the state directory the run used?)"
			log "$name: run 1 passed in $secs s (no process left); databases kept: $first"
		else
			second=$(databases "$state")
			kept=
			for o in $first; do
				[[ " $second " == *" $o "* ]] && kept+="$o "
			done
			[ -n "$kept" ] || die "$name: the second run kept none of the first run's databases (a rebuilt template?): before: $first after: $second"
			log "$name: run 2 passed in $secs s (no process left), reusing database(s) $kept"
		fi
	done
}

# --- JavaScript ---------------------------------------------------------------------
if want_js; then
	# One project holding both examples (they share ../migrations), with the
	# test runners and pg at the versions clients/js pins, then the packages.
	js=$work/js
	mkdir -p "$js"
	cp -r "$root/clients/js/examples/vitest" "$root/clients/js/examples/jest" "$root/clients/js/examples/migrations" "$js/"
	rm -rf "$js"/*/node_modules
	node -e '
		const pkg = require(process.argv[1]);
		const d = pkg.devDependencies;
		const out = { name: "zero-setup-example", private: true, devDependencies: {} };
		for (const n of ["vitest", "jest", "pg"]) out.devDependencies[n] = d[n];
		process.stdout.write(JSON.stringify(out, null, 2) + "\n");
	' "$root/clients/js/package.json" >"$js/package.json"
	log "npm install --save-dev the packed tarballs (pgfork, @pgfork/$node_plat) into a fresh project"
	if ! (cd "$js" && "${clean_env[@]}" npm install --save-dev --ignore-scripts \
		"$dist/npm/pgfork-$version.tgz" "$dist/npm/pgfork-$node_plat-$version.tgz") >"$work/npm-install.log" 2>&1; then
		cat "$work/npm-install.log" >&2
		die "npm install failed"
	fi
	(cd "$js" && "${clean_env[@]}" node -e 'require.resolve(process.argv[1])' "@pgfork/$node_plat/package.json") ||
		die "@pgfork/$node_plat is not resolvable from the project"
	js_state=$js/node_modules/.cache/pgfork
	want vitest && twice vitest "$js/vitest" "$js_state" npx --no-install vitest run
	if want jest; then
		# The jest run has PG* set, as a project whose application needs them
		# has (issue 58): they point at a server that is not pgfork's, a
		# listener that records every connection. The serve the glue starts
		# runs its own managed PostgreSQL and never touches it.
		canary_log=$work/pg-env-canary.log
		: >"$canary_log"
		python3 -c '
import socket, sys
s = socket.socket(); s.bind(("127.0.0.1", 0)); s.listen(16)
print(s.getsockname()[1], flush=True)
sys.stdout.close()
while True:
    c, a = s.accept()
    with open(sys.argv[1], "a") as f: f.write("connection from %s:%d\n" % a)
    c.close()
' "$canary_log" >"$work/pg-env-canary.port" &
		canary_pid=$!
		for _ in $(seq 1 100); do [ -s "$work/pg-env-canary.port" ] && break; sleep 0.1; done
		canary_port=$(cat "$work/pg-env-canary.port")
		[ -n "$canary_port" ] || die "jest: the PG* canary listener did not start"
		saved_env=("${clean_env[@]}")
		clean_env+=("PGHOST=127.0.0.1" "PGPORT=$canary_port" "PGUSER=app" "PGPASSWORD=app-secret" "PGDATABASE=app")
		twice jest "$js/jest" "$js_state" npx --no-install jest
		clean_env=("${saved_env[@]}")
		kill "$canary_pid" 2>/dev/null || true
		wait "$canary_pid" 2>/dev/null || true
		[ ! -s "$canary_log" ] || die "jest: with PG* set, something connected to the application's server 127.0.0.1:$canary_port: $(cat "$canary_log")"
		log "jest: with PGHOST/PGPORT/PGUSER/PGPASSWORD/PGDATABASE set to another server, nothing connected to it"
	fi
fi

# --- Python ---------------------------------------------------------------------------
py_venv() {
	[ -x "$work/venv/bin/python" ] && return 0
	local whl
	whl=$(ls "$dist/python/pgfork-$version-py3-none-"*"$wheel_tag"*.whl 2>/dev/null | head -n 1)
	[ -n "$whl" ] || die "no wheel for $wheel_tag in $dist/python"
	log "pip install $(basename "$whl")[django] pytest into a fresh venv"
	"${clean_env[@]}" python3 -m venv "$work/venv"
	"${clean_env[@]}" "$work/venv/bin/pip" install --quiet "$whl[django]" pytest >"$work/pip.log" 2>&1 ||
		{ cat "$work/pip.log" >&2; die "pip install failed"; }
	"${clean_env[@]}" "$work/venv/bin/pgfork" --version >&2 || die "the wheel's pgfork command does not run"
	# The pure fallback wheel: its command names how to get the binary.
	"${clean_env[@]}" python3 -m venv --without-pip "$work/venv-any"
	"${clean_env[@]}" "$work/venv/bin/pip" --python "$work/venv-any/bin/python" install --quiet \
		"$dist/python/pgfork-$version-py3-none-any.whl" >>"$work/pip.log" 2>&1 ||
		{ cat "$work/pip.log" >&2; die "pip install of the fallback wheel failed"; }
	local out rc=0
	out=$("${clean_env[@]}" "$work/venv-any/bin/pgfork" --version 2>&1) || rc=$?
	[ "$rc" = 127 ] && [[ $out == *"pip install pgfork"* ]] ||
		die "the fallback wheel's pgfork should exit 127 naming \`pip install pgfork\`; it exited $rc: $out"
}
# Activated as a user does: the venv's bin first on PATH.
py_env() { printf '%s\n' "PATH=$work/venv/bin:$clean_path" "VIRTUAL_ENV=$work/venv"; }
py_state=$work/pgfork-home
if want pytest; then
	py_venv
	cp -r "$root/clients/python/examples/pytest_project" "$work/pytest_project"
	mapfile -t pe < <(py_env)
	clean_env+=("${pe[@]}")
	twice pytest "$work/pytest_project" "$py_state" python -m pytest -p no:cacheprovider -q
fi
if want django; then
	py_venv
	cp -r "$root/clients/python/examples/django_project" "$work/django_project"
	find "$work/django_project" -name __pycache__ -prune -exec rm -rf {} +
	mapfile -t pe < <(py_env)
	clean_env+=("${pe[@]}")
	twice django "$work/django_project" "$py_state" python manage.py test
	twice django-pytest "$work/django_project" "$py_state" python -m pytest -p no:cacheprovider -q
fi

# --- No PostgreSQL on the machine ------------------------------------------------------
# The first run on a machine without PostgreSQL installs one: the pytest example
# once more, in a mount namespace where /usr/lib/postgresql is an empty tmpfs and
# pg_config is /dev/null, with a state directory of its own (no install there).
if want nopg; then
	if [ "$(id -u)" != 0 ] || [ ${#ns[@]} = 0 ]; then
		log "nopg: skipped: hiding PostgreSQL needs root and mount namespaces"
	else
		py_venv
		cp -r "$root/clients/python/examples/pytest_project" "$work/nopg_project"
		mapfile -t pe < <(py_env)
		nopg_state=$work/pgfork-home-nopg
		hide='mount -t tmpfs -o mode=755 none /usr/lib/postgresql || exit 1
if [ -e /usr/bin/pg_config ]; then mount --bind /dev/null /usr/bin/pg_config || exit 1; fi
if [ -d /usr/local/pgsql ]; then mount -t tmpfs none /usr/local/pgsql || exit 1; fi
exec "$@"'
		log "nopg: run 1 with no PostgreSQL on the machine: python -m pytest"
		t0=$(date +%s.%N)
		if ! "${clean_env[@]}" "${pe[@]}" "PGFORK_HOME=$nopg_state" unshare --mount --pid --fork --mount-proc \
			bash -c "$hide" hide "$work/run-one.sh" "$work/nopg_project" "$work" python -m pytest -p no:cacheprovider -q >"$work/nopg.log" 2>&1; then
			tail -n 80 "$work/nopg.log" >&2
			die "nopg: the run with no PostgreSQL failed (its last 80 lines above)"
		fi
		grep -q "no PostgreSQL build found: installing" "$work/nopg.log" ||
			{ tail -n 40 "$work/nopg.log" >&2; die "nopg: the run passed but installed no PostgreSQL (did it find one after all?)"; }
		ls "$nopg_state"/installs/*/bin/postgres >/dev/null 2>&1 || die "nopg: no PostgreSQL installed under $nopg_state/installs"
		log "nopg: run 1 passed in $(awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN{printf "%.1f", b-a}') s, installing $(basename "$(dirname "$(dirname "$(ls -d "$nopg_state"/installs/*/bin/postgres | head -n 1)")")") (no process left)"
	fi
fi

# --- Rust -----------------------------------------------------------------------------
# The release's crates as a user gets them once they are published: a fresh
# copy of the example depends on `pgfork` by version, the line `cargo add
# --dev pgfork --features sqlx` writes, and cargo takes it from a registry
# made of dist/cargo (the release's index entries in a git repository, its
# downloads the .crate files), which the project's .cargo/config.toml patches
# the default registry's `pgfork` from (clients/rust/README.md's way before
# publishing). Why this way: cargo then resolves pgfork's own dependencies
# (pgfork-macros, pgfork-bin-<platform>) by version from a registry, checks
# each .crate against the index's checksum and unpacks it itself (so the
# binary's mode is cargo's doing), and the third-party crates come from the
# default registry as for any user. A `local-registry` source replacement
# would need every third-party crate in it too, and a [patch] to unpacked
# directories would skip cargo's download and unpacking. The lock starts as
# clients/rust's (the third-party versions clients/rust/test.sh built);
# `cargo update --workspace` adds the release's crates. No pgfork on PATH and no PGFORK_BIN: each run must start
# the platform crate's binary, and says which it started.
if want rust; then
	case $goos-$goarch in
	linux-amd64) rust_plat=linux-x86_64 ;;
	linux-arm64) rust_plat=linux-aarch64 ;;
	darwin-arm64) rust_plat=macos-aarch64 ;;
	darwin-amd64) rust_plat=macos-x86_64 ;;
	esac
	[ -f "$dist/cargo/pgfork-bin-$rust_plat-$version.crate" ] ||
		die "rust: no $dist/cargo/pgfork-bin-$rust_plat-$version.crate (a release built with --skip-rust?)"
	reg=$work/cargo-registry
	cp -r "$dist/cargo/index" "$reg"
	printf '{"dl": "file://%s/{crate}-{version}.crate"}\n' "$dist/cargo" >"$reg/config.json"
	(cd "$reg" && git init -q && git add -A && git -c user.name=pgfork -c user.email=pgfork@localhost -c commit.gpgsign=false commit -q -m "pgfork $version") ||
		die "rust: cannot make the registry's git index in $reg"
	# Cargo keeps what it fetched from the release's registry (a file:// URL:
	# directories named "-<hash>") in the user's CARGO_HOME: removed at exit.
	user_cargo=${CARGO_HOME:-$orig_home/.cargo}
	rust_registry_dirs_before=$(ls -d "$user_cargo"/registry/*/-* 2>/dev/null || true)
	rust_forget_registry() {
		local d
		for d in "$user_cargo"/registry/*/-*; do
			[ -e "$d" ] || continue
			grep -qxF -- "$d" <<<"$rust_registry_dirs_before" || rm -rf "$d"
		done
	}
	# With the README beside it, as in clients/rust: a test compares its blocks with the example's files.
	rust=$work/rust/example
	mkdir -p "$rust"
	(cd "$root/clients/rust/example" && git ls-files -z -c -o --exclude-standard | xargs -0 cp --parents -t "$rust")
	cp "$root/clients/rust/README.md" "$work/rust/"
	# The example's manifest as a project of its own writes it.
	python3 - "$root/clients/rust" "$version" >"$rust/Cargo.toml" <<'PY' || die "rust: cannot write the example's Cargo.toml"
import json, sys, tomllib
rs, version = sys.argv[1], sys.argv[2]
ws = tomllib.load(open(f"{rs}/Cargo.toml", "rb"))["workspace"]
ex = tomllib.load(open(f"{rs}/example/Cargo.toml", "rb"))
assert set(ex) <= {"package", "lib", "dev-dependencies"}, f"the example's manifest has more than this copies: {sorted(ex)}"
toml = lambda d: "{ " + ", ".join(f"{k} = {json.dumps(v)}" for k, v in d.items()) + " }"
print(f'[package]\nname = "{ex["package"]["name"]}"\nversion = "0.1.0"\nedition = "{ws["package"]["edition"]}"\npublish = false\n')
print("[lib]\n" + "".join(f"{k} = {json.dumps(v)}\n" for k, v in ex["lib"].items()))
print("[dev-dependencies]")
for name, spec in ex["dev-dependencies"].items():
    if name == "pgfork":  # what `cargo add --dev pgfork --features sqlx` writes
        dep = {"version": version, "features": spec.get("features", [])}
    else:
        base = ws["dependencies"][name] if spec.get("workspace") else spec
        dep = {k: v for k, v in (base if isinstance(base, dict) else {"version": base}).items() if k != "path"}
        dep["features"] = dep.get("features", []) + [f for f in spec.get("features", []) if f not in dep.get("features", [])]
    print(f"{name} = {toml(dep)}")
PY
	mkdir -p "$rust/.cargo"
	cat >"$rust/.cargo/config.toml" <<EOF
[registries.pgfork-release]
index = "file://$reg"

[patch.crates-io]
pgfork = { version = "$version", registry = "pgfork-release" }
EOF
	cp "$root/clients/rust/Cargo.lock" "$rust/Cargo.lock"
	target=${CARGO_TARGET_DIR:-$root/clients/rust/target}
	rust_state=$target/pgfork
	clean_env+=("CARGO_TARGET_DIR=$target" "PATH=$clean_path")
	log "rust: cargo update --workspace: the example's lock takes pgfork from the release's registry"
	(cd "$rust" && "${clean_env[@]}" cargo update --workspace) >"$work/cargo-update.log" 2>&1 ||
		{ cat "$work/cargo-update.log" >&2; die "rust: cargo update failed"; }
	# Every crate of the release the example uses is the release's file.
	python3 - "$rust/Cargo.lock" "$reg" "$dist/cargo" "$version" "pgfork" "pgfork-macros" "pgfork-bin-$rust_plat" <<'PY' || die "rust: the example's lock does not take the release's crates"
import hashlib, sys, tomllib
lock, reg, crates, version, names = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4], sys.argv[5:]
pkgs = {p["name"]: p for p in tomllib.load(open(lock, "rb"))["package"]}
for n in names:
    p = pkgs.get(n)
    want = hashlib.sha256(open(f"{crates}/{n}-{version}.crate", "rb").read()).hexdigest()
    got = p and (p["version"], p.get("source"), p.get("checksum"))
    if got != (version, f"registry+file://{reg}", want):
        sys.exit(f"{n}: locked as {got}, want {(version, 'registry+file://' + reg, want)}")
PY
	twice rust "$rust" "$rust_state" cargo test --locked
	for i in 1 2; do
		used=$(grep -o 'pgfork: starting .* serve for this test run' "$work/rust.$i.log" | head -n 1) || true
		case $used in
		"pgfork: starting $user_cargo/registry/src/-"*"/pgfork-bin-$rust_plat-$version/bin/pgfork serve for this test run") ;;
		*) die "rust: run $i did not start the binary of the crate pgfork-bin-$rust_plat: ${used:-no \"pgfork: starting ... serve\" line in its log}" ;;
		esac
	done
	bin=${used#pgfork: starting }
	bin=${bin% serve for this test run}
	[ -x "$bin" ] || die "rust: $bin (as cargo unpacked it) is not executable"
	log "rust: both runs started $bin ($(du -k "$dist/cargo/pgfork-bin-$rust_plat-$version.crate" | cut -f1) KiB crate), with no pgfork on PATH"
fi

# --- Java -----------------------------------------------------------------------------
# The Spring Boot 3.5 example (its application sources are ../spring-boot's)
# with pgfork-spring at the release's version from dist/maven, declared as a
# user declares it (a <repository>; here in settings.xml, as the README
# allows), resolved into the clean HOME's empty ~/.m2.
if want java; then
	[ -d "$dist/maven/io/pgfork/pgfork-spring/$version" ] || die "java: no $dist/maven/io/pgfork/pgfork-spring/$version (a release built with --skip-java?)"
	java_dir=$work/java
	mkdir -p "$java_dir/spring-boot/src"
	cp -r "$root/clients/java/examples/spring-boot/src/main" "$java_dir/spring-boot/src/"
	cp -r "$root/clients/java/examples/spring-boot-3" "$java_dir/"
	rm -rf "$java_dir/spring-boot-3/target"
	# The version a user writes into the copied pom.
	sed -i "s|<revision>[^<]*</revision>|<revision>$version</revision>|" "$java_dir/spring-boot-3/pom.xml"
	grep -q "<revision>$version</revision>" "$java_dir/spring-boot-3/pom.xml" || die "java: the example's pom has no <revision> to set to $version"
	m2=$work/home/.m2/repository
	seed=$orig_home/.m2/repository
	cat >"$work/maven-settings.xml" <<EOF
<settings>
  <profiles>
    <profile>
      <id>pgfork</id>
      <repositories>
        <!-- The release, as the README has users declare it. -->
        <repository><id>pgfork-release</id><url>file://$dist/maven</url>
          <releases><checksumPolicy>fail</checksumPolicy></releases><snapshots><enabled>false</enabled></snapshots></repository>
        <!-- Third-party downloads: the user's local repository, read as a file repository (never written). -->
        <repository><id>user-m2</id><url>file://$seed</url><snapshots><enabled>false</enabled></snapshots></repository>
      </repositories>
      <pluginRepositories>
        <pluginRepository><id>user-m2</id><url>file://$seed</url><snapshots><enabled>false</enabled></snapshots></pluginRepository>
      </pluginRepositories>
    </profile>
  </profiles>
  <activeProfiles><activeProfile>pgfork</activeProfile></activeProfiles>
</settings>
EOF
	[ ! -e "$m2" ] || die "java: $m2 is not empty"
	java_tests=${PGFORK_ZERO_JAVA_TESTS-Boot3SlicesTest*}
	# Named: Java takes user.home from the password database, not HOME.
	mvn_cmd=(mvn -B -ntp -s "$work/maven-settings.xml" "-Dmaven.repo.local=$m2" test)
	[ -z "$java_tests" ] || mvn_cmd+=("-Dtest=$java_tests")
	clean_env+=("PATH=$work/tarball-bin:$clean_path")
	twice java "$java_dir/spring-boot-3" "$java_dir/spring-boot-3/target/pgfork" "${mvn_cmd[@]}"
	# io.pgfork's artifacts came from dist/maven, byte for byte, and from nowhere else.
	for a in pgfork-parent pgfork pgfork-spring; do
		d=$m2/io/pgfork/$a/$version
		grep -q '>pgfork-release=$' "$d/_remote.repositories" 2>/dev/null ||
			die "java: $d does not record dist/maven (pgfork-release) as where $a came from: $(cat "$d/_remote.repositories" 2>&1)"
		for f in "$d"/*.pom "$d"/*.jar; do
			[ -f "$f" ] || continue
			cmp -s "$f" "$dist/maven/io/pgfork/$a/$version/$(basename "$f")" || die "java: $f differs from dist/maven's"
		done
	done
	[ -f "$m2/io/pgfork/pgfork-spring/$version/pgfork-spring-$version.jar" ] || die "java: pgfork-spring's jar was not resolved into $m2"
	others=$(find "$m2/io/pgfork" -mindepth 2 -maxdepth 2 -type d ! -name "$version" | tr '\n' ' ')
	[ -z "$others" ] || die "java: io.pgfork artifacts of another version were resolved: $others"
	log "java: io.pgfork's pom, jars and parent came from dist/maven (checked byte for byte)"
	# The oldest Spring Boot line pgfork-spring supports (3.2: Spring
	# Framework 6.1, Flyway 9), the same tests, from the same release.
	cp -r "$root/clients/java/examples/spring-boot-3.2" "$java_dir/"
	rm -rf "$java_dir/spring-boot-3.2/target"
	sed -i "s|<revision>[^<]*</revision>|<revision>$version</revision>|" "$java_dir/spring-boot-3.2/pom.xml"
	grep -q "<revision>$version</revision>" "$java_dir/spring-boot-3.2/pom.xml" || die "java: the 3.2 example's pom has no <revision> to set to $version"
	twice java-boot-3.2 "$java_dir/spring-boot-3.2" "$java_dir/spring-boot-3.2/target/pgfork" "${mvn_cmd[@]}"
fi

log "all passed: ${cases[*]}"
