#!/usr/bin/env bash
# The learning check of issue 10: SFT warm start from scripted-expert demonstrations of the pool,
# base vs adapter on the pool and held-out sets at the bot's own temperature, then one online
# GRPO step from the warm start. Run from the repository root, under the heavy lock:
#   flock /tmp/pipecat-rl-heavy.lock bash docs/results/train-learning-check/run.sh
set -euo pipefail
OUT=docs/results/train-learning-check
WORK=${WORK:-/tmp/pipecat-rl-learning-check}
L=$WORK/ledger.db
PORT=${PORT:-8031}
URL=http://127.0.0.1:$PORT
PRL=${PRL:-pipecat-rl}
SCN=examples/clinic/handwritten
SIM=(--persona scripted --llm-url "$URL" --ledger "$L" --max-tokens 100 --concurrency 8 --json)
rm -rf "$WORK" && mkdir -p "$WORK"

$PRL llm serve --port "$PORT" --max-loras 2 > "$WORK/serve.log" 2>&1 &
SERVER=$!
trap 'kill $SERVER 2>/dev/null; wait $SERVER 2>/dev/null || true' EXIT
for _ in $(seq 300); do curl -sf "$URL/health" > /dev/null && break; sleep 1; done
curl -sf "$URL/health" > /dev/null

t() { local name=$1; shift; local t0=$SECONDS; "$@"; echo "$name $((SECONDS - t0)) s" >> "$OUT/timings.txt"; }
: > "$OUT/timings.txt"
# 1. demonstrations: the scripted expert on the pool (no model)
t expert $PRL simulate $SCN/pool --bot examples/clinic/expert.py --persona scripted --no-server \
    --ledger "$L" --json > "$OUT/expert_pool.json"
# 2. the base model, at the bot's temperature (0.2)
t base_pool $PRL simulate $SCN/pool --bot examples/clinic/bot.py "${SIM[@]}" > "$OUT/base_pool.json"
t base_heldout $PRL simulate $SCN/heldout --bot examples/clinic/bot.py "${SIM[@]}" > "$OUT/base_heldout.json"
# 3. SFT warm start (hot-loaded into the server and verified there)
t sft $PRL train --algo sft --ledger "$L" --llm-url "$URL" --out "$WORK/adapters" --json > "$OUT/sft.json"
ADAPTER=$(python -c "import json; print(json.load(open('$OUT/sft.json'))['adapter'])")
cp "$(python -c "import json; print(json.load(open('$OUT/sft.json'))['metrics_path'])")" "$OUT/sft.metrics.jsonl"
# 4. the adapter, same scenarios, same seeds, same temperature
t sft_pool $PRL simulate $SCN/pool --bot examples/clinic/bot.py --adapter "$ADAPTER" "${SIM[@]}" > "$OUT/sft_pool.json"
t sft_heldout $PRL simulate $SCN/heldout --bot examples/clinic/bot.py --adapter "$ADAPTER" "${SIM[@]}" > "$OUT/sft_heldout.json"
# 5. one online GRPO step from the warm start: 4 pool scenarios x 4 episodes at temperature 1.0
GRPO_SCN=()
for s in routine_booking cancel_long_confirmation tool_timeout_recovery emergency_same_day; do
    GRPO_SCN+=(--scenarios "$SCN/pool/$s.yaml")
done
t grpo $PRL train --algo grpo --parent "$ADAPTER" "${GRPO_SCN[@]}" \
    --bot examples/clinic/bot.py --steps 1 --group-size 4 --temperature 1.0 --persona scripted \
    --max-tokens 100 --ledger "$L" \
    --llm-url "$URL" --out "$WORK/adapters" --json > "$OUT/grpo.json" || echo "grpo exit $?" >> "$OUT/timings.txt"
cp "$(ls -t "$WORK"/adapters/runs/*.jsonl | head -1)" "$OUT/grpo.metrics.jsonl" || true
python "$OUT/summarise.py" "$L" "$OUT"
