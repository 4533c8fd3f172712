#!/bin/bash
# pgfork-healthcheck: GET /healthz on the local `pgfork serve` with bash's
# /dev/tcp only (no curl in the image). Exit 0 when it answers 200.
# The port is INTEGRESQL_PORT (the container listens on it), else 5000.
# /healthz needs no token, whatever access mode the server uses.
set -u
port="${PGFORK_HEALTH_PORT:-${INTEGRESQL_PORT:-5000}}"
host="${PGFORK_HEALTH_HOST:-127.0.0.1}"
exec 3<>"/dev/tcp/${host}/${port}" || { echo "pgfork-healthcheck: cannot connect to ${host}:${port}" >&2; exit 1; }
printf 'GET /healthz HTTP/1.0\r\nHost: %s\r\nConnection: close\r\n\r\n' "$host" >&3
IFS= read -r -t 5 status <&3 || { echo "pgfork-healthcheck: no answer from ${host}:${port}" >&2; exit 1; }
exec 3<&-
case "$status" in
"HTTP/1."?" 200 "*) exit 0 ;;
*) echo "pgfork-healthcheck: /healthz answered: ${status%$'\r'}" >&2; exit 1 ;;
esac
