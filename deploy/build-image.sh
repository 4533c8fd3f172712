#!/bin/bash
# deploy/build-image.sh — build deploy/Containerfile for real with buildah on
# a machine that reaches no image registry, then run deploy/smoke.sh against
# the built image's root filesystem. Opt-in (slow: several minutes); CI runs
# deploy/smoke.sh alone. See docs/deploy.md.
#
# The base images cannot be pulled, so it makes them locally under the names
# the Containerfile uses: debian:bookworm-slim from `debootstrap --variant=
# minbase bookworm` (from the Debian mirror apt is configured with), and
# golang:1.26-bookworm as that plus this machine's Go toolchain and CA
# certificates. Everything else — the Containerfile's RUN steps (useradd,
# apt-get install postgresql, go build), COPY, ENV, USER — runs as written,
# with buildah's chroot isolation (no container runtime is needed).
#
# Needs root, buildah, podman (for `import`), debootstrap, go.
set -euo pipefail

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
for t in buildah podman debootstrap go; do
	command -v "$t" >/dev/null || {
		echo "build-image: $t not found (apt-get install buildah podman debootstrap)" >&2
		exit 1
	}
done
[[ $(id -u) == 0 ]] || {
	echo "build-image: needs root" >&2
	exit 1
}

RUN=$(mktemp -d "${TMPDIR:-/var/tmp}/pgfork-build-image.XXXXXX")
STORE=(--root "$RUN/storage" --runroot "$RUN/runroot" --storage-driver vfs)
cleanup() {
	local rc=$?
	set +e
	buildah "${STORE[@]}" rm --all >/dev/null 2>&1
	if grep -q " $RUN/" /proc/self/mounts; then
		grep " $RUN/" /proc/self/mounts | awk '{print $2}' | sort -r | xargs -r -n1 umount -l
	fi
	rm -rf "$RUN"
	echo "build-image: exit $rc"
	exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# The Debian mirror apt already uses (deb822 or one-line format).
MIRROR=$(awk '/^URIs:/ {print $2; exit}' /etc/apt/sources.list.d/*.sources 2>/dev/null || true)
[[ -n $MIRROR ]] || MIRROR=$(awk '$1 == "deb" {print $2; exit}' /etc/apt/sources.list 2>/dev/null || true)
[[ -n $MIRROR ]] || {
	echo "build-image: no Debian mirror found in apt's sources" >&2
	exit 1
}

echo "== base image debian:bookworm-slim (debootstrap minbase from $MIRROR)"
debootstrap --variant=minbase bookworm "$RUN/debian" "$MIRROR" >"$RUN/debootstrap.log" 2>&1 || {
	tail -20 "$RUN/debootstrap.log" >&2
	exit 1
}
rm -rf "$RUN/debian/var/cache/apt/archives/"*.deb
# Like the official images: apt sources in place, no cache.
tar -C "$RUN/debian" -cf "$RUN/debian.tar" .
podman "${STORE[@]}" import --change 'CMD ["bash"]' "$RUN/debian.tar" docker.io/library/debian:bookworm-slim >/dev/null

echo "== base image golang:1.26-bookworm (that + $(go env GOROOT), $(go version | awk '{print $3}'))"
mkdir -p "$RUN/debian/usr/local" "$RUN/debian/etc/ssl/certs"
cp -a "$(go env GOROOT)" "$RUN/debian/usr/local/go"
cp -L /etc/ssl/certs/ca-certificates.crt "$RUN/debian/etc/ssl/certs/ca-certificates.crt"
tar -C "$RUN/debian" -cf "$RUN/golang.tar" .
rm -rf "$RUN/debian"
podman "${STORE[@]}" import \
	--change 'ENV PATH=/go/bin:/usr/local/go/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
	--change 'ENV GOPATH=/go' --change 'ENV GOTOOLCHAIN=local' --change 'WORKDIR /go' \
	"$RUN/golang.tar" docker.io/library/golang:1.26-bookworm >/dev/null
rm -f "$RUN/debian.tar" "$RUN/golang.tar"

echo "== buildah build -f deploy/Containerfile (chroot isolation, no pulls)"
VERSION=$(git -C "$REPO" describe --tags --always --dirty 2>/dev/null || echo devel)
COMMIT=$(git -C "$REPO" rev-parse HEAD 2>/dev/null || echo unknown)
buildah "${STORE[@]}" build --isolation chroot --pull=never --layers=false --format docker \
	--build-arg VERSION="$VERSION" --build-arg COMMIT="$COMMIT" \
	-f "$REPO/deploy/Containerfile" -t localhost/pgfork:smoke "$REPO" 2>&1 | tee "$RUN/build.log" |
	grep -E '^(STEP|COMMIT|Successfully)|pgfork [0-9a-z]' || true
grep -q '^Successfully tagged localhost/pgfork:smoke' "$RUN/build.log" || {
	tail -30 "$RUN/build.log" >&2
	echo "build-image: buildah build failed" >&2
	exit 1
}
echo "== image configuration"
buildah "${STORE[@]}" inspect --type image --format \
	'user={{.OCIv1.Config.User}} entrypoint={{.OCIv1.Config.Entrypoint}} cmd={{.OCIv1.Config.Cmd}} volumes={{.OCIv1.Config.Volumes}} ports={{.OCIv1.Config.ExposedPorts}} env={{.OCIv1.Config.Env}} healthcheck={{.Docker.Config.Healthcheck}}' \
	localhost/pgfork:smoke

echo "== smoke test against the built image's root filesystem"
ctr=$(buildah "${STORE[@]}" from --pull-never localhost/pgfork:smoke)
mnt=$(buildah "${STORE[@]}" mount "$ctr")
"$REPO/deploy/smoke.sh" --rootfs "$mnt"
