# shellcheck shell=bash
# Sourced by scripts/check.sh, clients/test.sh and clients/zero-setup.sh.
# cpu_busy prints the machine's busy CPU-seconds since boot (all cores, from
# /proc/stat), so that their log lines can say how much of the machine a
# stage or a suite used: make check is CPU-bound on 2 cores.
cpu_busy() { awk '/^cpu /{printf "%d", ($2 + $3 + $4 + $7 + $8 + $9) / 100}' /proc/stat; }
