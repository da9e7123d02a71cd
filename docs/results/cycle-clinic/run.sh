#!/usr/bin/env bash
# The committed clinic cycle (issue 13), run from an archive of the branch's commit.
cd /tmp/i13/runtree
export PYTHONPATH=/tmp/i13/runtree
# The budget runs to 11:57 UTC (the results must be committed by 12:05), at most 2400 s.
now=$(date -u +%s); stop=$(date -u -d "11:57" +%s); budget=$(( stop - now )); [ $budget -gt 2400 ] && budget=2400
echo "lock acquired $(date -u +%H:%M:%S) budget ${budget}s" > /work/wt/i13-cycle/cycles/clinic-run.timing
timeout $(( budget + 300 )) /work/main/.venv/bin/python -c "from pipecat_rl.cli import main; main()" \
  cycle --config examples/clinic/loop.yaml \
  --out /work/wt/i13-cycle/cycles/clinic-run --ledger /work/wt/i13-cycle/cycles/clinic-run.db \
  --budget-s $budget --json > /work/wt/i13-cycle/cycles/clinic-run.json 2> /work/wt/i13-cycle/cycles/clinic-run.err
echo "rc=$? ended $(date -u +%H:%M:%S)" >> /work/wt/i13-cycle/cycles/clinic-run.timing
