"""Summarise the learning check: pass rate and tool calls per call, base vs SFT adapter."""

import json
import sys
from pathlib import Path

from pipecat_rl.ledger import Ledger

TOOLS = {"lookup_patient", "find_slots", "book", "cancel", "transfer"}


def arm(ledger: Ledger, report: dict) -> dict:
    """Pass rate and tool calls per call of one simulation report (tool calls from the ledger)."""
    episodes = report["episodes"]
    verified = [e for e in episodes if e["outcome"] in ("pass", "fail")]
    emitted = executed = invented = 0
    for e in episodes:
        calls = [c for t in ledger.turns(e["session_id"]) for c in t.tool_calls]
        emitted += len(calls)
        invented += sum(1 for c in calls if c["name"] not in TOOLS)
        executed += len(ledger.tool_calls(e["session_id"]))
    n = len(episodes)
    return {
        "episodes": n,
        "passes": sum(e["outcome"] == "pass" for e in episodes),
        "verified": len(verified),
        "errors": sum(e["outcome"] == "error" for e in episodes),
        "tool_calls_per_call": round(emitted / n, 2) if n else None,
        "executed_tool_calls_per_call": round(executed / n, 2) if n else None,
        "invented_tool_names": invented,
        "mean_reward": round(sum(e["reward"] for e in episodes) / n, 3) if n else None,
    }


def prefix_property(ledger: Ledger) -> dict:
    """Merged vs split turns (served and demonstrations), and prompts re-rendered exactly."""
    from transformers import AutoTokenizer

    from pipecat_rl.serving.weights import prepare_model
    from pipecat_rl.training.rows import TrainableTurn, build_sequences

    tokenizer = AutoTokenizer.from_pretrained(prepare_model("smollm2"))
    turns = ledger.training_turns(purpose="sft")
    out = {}
    for kind, chosen in (
        ("served", [t for t in turns if not t.demonstration]),
        ("demonstration", [t for t in turns if t.demonstration]),
    ):
        rows = [TrainableTurn.from_turn(t, tokenizer) for t in chosen]
        _, stats = build_sequences(rows)
        out[kind] = {"turns": stats.turns, "sequences": stats.sequences, "merged": stats.merged,
                     "split": stats.split}  # fmt: skip
    served = [t for t in turns if not t.demonstration and t.request.get("messages")]
    exact = 0
    for t in served:
        ids = tokenizer.apply_chat_template(
            t.request["messages"], tools=t.request.get("tools") or None,
            add_generation_prompt=True, tokenize=True,
        )["input_ids"]  # fmt: skip
        exact += list(ids) == t.prompt_token_ids
    out["served_prompts_rendered_exactly"] = f"{exact}/{len(served)}"
    return out


def main(ledger_path: str, out: str) -> None:
    """Write summary.json beside the run's outputs."""
    out_dir = Path(out)
    summary: dict = {"arms": {}}
    with Ledger(ledger_path) as ledger:
        for name in ("base_pool", "base_heldout", "sft_pool", "sft_heldout"):
            path = out_dir / f"{name}.json"
            if path.is_file():
                summary["arms"][name] = arm(ledger, json.loads(path.read_text()))
        summary["prefix_property"] = prefix_property(ledger)
    for name in ("sft", "grpo"):
        path = out_dir / f"{name}.json"
        if path.is_file() and path.stat().st_size:
            result = json.loads(path.read_text())
            summary[name] = {k: result[k] for k in ("adapter", "guard", "metrics", "parent")}
            summary[name]["sessions"] = len(result["session_ids"])
    metrics = out_dir / "grpo.metrics.jsonl"
    if metrics.is_file() and metrics.read_text().strip():
        row = json.loads(metrics.read_text().splitlines()[-1])
        summary["grpo_step"] = {
            k: row.get(k)
            for k in ("reward", "reward_std", "frac_reward_zero_std",
                      "frac_reward_zero_std/outcome", "frac_reward_zero_std/shaped", "groups",
                      "sequences", "policy_loss", "grad_norm", "clip_ratio",
                      "importance_ratio/mean", "sampling_logp_difference/max", "step_time")
        }  # fmt: skip
    (out_dir / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    print(json.dumps(summary, indent=2))


if __name__ == "__main__":
    main(*sys.argv[1:3])
