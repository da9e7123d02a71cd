#!/usr/bin/env bash
# The test suite N times in a row (default 10), exactly as `make test` runs it (the slow tests
# with the fast tier beside them, `scripts/test_suite.sh`): each run's summary lines (one a
# part) and its failures in one log, a red run's whole output beside it; how a test that fails
# in CI and passes alone is caught before it costs a landing.
#
#   scripts/test_repeat.sh [N] [LOG]        # e.g. scripts/test_repeat.sh 10 suite10.log
set -uo pipefail
n=${1:-10} log=${2:-test-repeat.log}
cd "$(dirname "$0")/.."
: > "$log"
green=0
for i in $(seq 1 "$n"); do
  start=$(date +%s)
  out=$(bash scripts/test_suite.sh 2>&1)
  rc=$?
  summary=$(printf '%s\n' "$out" | grep -E '(passed|failed|errors?|no tests ran).* in [0-9.]+s' | paste -sd ';')
  printf 'run %d/%d: exit %d in %d s: %s\n' "$i" "$n" "$rc" $(( $(date +%s) - start )) "$summary" >> "$log"
  printf '%s\n' "$out" | grep -E '^(FAILED|ERROR) ' >> "$log"
  if [ "$rc" -ne 0 ]; then  # the whole output of a red run: its tracebacks and captured logs
    printf '%s\n' "$out" > "${log%.log}.run$i.txt"
    printf '  its whole output: %s\n' "${log%.log}.run$i.txt" >> "$log"
  fi
  [ "$rc" -eq 0 ] && green=$((green + 1))
done
printf '%d/%d green\n' "$green" "$n" | tee -a "$log"
[ "$green" -eq "$n" ]
