#!/usr/bin/env bash
# The slow tier N times in a row (default 10), each run's summary line and failures in one log:
# how a test that fails in CI and passes alone is caught before it costs a landing.
#
#   scripts/slow_tier_repeat.sh [N] [LOG]        # e.g. scripts/slow_tier_repeat.sh 10 slow10.log
set -uo pipefail
n=${1:-10} log=${2:-slow-tier-repeat.log}
cd "$(dirname "$0")/.."
: > "$log"
green=0
for i in $(seq 1 "$n"); do
  start=$(date +%s)
  out=$(.venv/bin/python -m pytest -q -m slow -p no:cacheprovider 2>&1)
  rc=$?
  summary=$(printf '%s\n' "$out" | tail -1)
  printf 'run %d/%d: exit %d in %d s: %s\n' "$i" "$n" "$rc" $(( $(date +%s) - start )) "$summary" >> "$log"
  printf '%s\n' "$out" | grep -E '^(FAILED|ERROR) ' >> "$log"
  [ "$rc" -eq 0 ] && green=$((green + 1))
done
printf '%d/%d green\n' "$green" "$n" | tee -a "$log"
[ "$green" -eq "$n" ]
