# Sourced by clients/test.sh and clients/compat/run.sh.
#
# unknown_skips LOG: prints to stderr and returns 1 if LOG (go test -v,
# pytest -rs, node --test TAP or cargo test output) shows a skipped test whose reason
# does not start with "KNOWN SKIP". Known reasons are a tool that cannot be
# installed here (the Atlas and dbmate CLIs), named in the reason.
unknown_skips() {
	local log=$1 skipped known
	# go test -v prints a skip's reason on its own line, then "--- SKIP": count both.
	skipped=$(grep -c -E -- '--- SKIP' "$log" || true)
	known=$(grep -E -- '_test\.go:[0-9]+: KNOWN SKIP' "$log" | grep -c . || true)
	if [ "$skipped" -ne "$known" ]; then
		grep -B2 -E -- '--- SKIP' "$log" >&2
		echo "$skipped Go tests skipped, $known for a known reason" >&2
		return 1
	fi
	# pytest -rs: "SKIPPED [n] file:line: reason"; node TAP: "ok N - name # SKIP reason".
	if grep -E '^SKIPPED|^ok .* # SKIP' "$log" | grep -v -q 'KNOWN SKIP'; then
		grep -E '^SKIPPED|^ok .* # SKIP' "$log" | grep -v 'KNOWN SKIP' >&2
		return 1
	fi
	# cargo test: "test name ... ignored" or "... ignored, reason".
	if grep -E '^test .* \.\.\. ignored' "$log" | grep -v -q 'KNOWN SKIP'; then
		grep -E '^test .* \.\.\. ignored' "$log" | grep -v 'KNOWN SKIP' >&2
		return 1
	fi
	return 0
}

# known_skips LOG: the "KNOWN SKIP" reasons in LOG, one per line.
known_skips() { grep -h -o 'KNOWN SKIP.*' "$1" | sort -u || true; }
