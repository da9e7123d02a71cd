"""Gate decision time from the ledger, and the paired interval's measured coverage.

Timing: 24 scenarios x 8 repeats x 2 policies (target < 2 s). Builds a throwaway ledger with
realistic sessions (4 turns with token usage and latencies each), then times reading the runs,
every statistic (10,000-resample latency bootstraps, the t interval, the sign tests) and the
verdict. The receipt's Markdown and JSON are included; the HTML page (matplotlib) separately.

Coverage: identical arms (true mean delta 0), 20,000 seeded trials per size, binary pass/fail
rewards with per-scenario pass rates, 8 paired repeats: how often the 95% interval covers 0 and
how often its lower bound clears 0 (a false PROMOTE side), for the Student t interval the gate
uses and the percentile cluster bootstrap it used before (2,000 trials, 1,000 resamples).

    python benchmarks/gate_decision.py
"""

import json
import tempfile
import time
from pathlib import Path

import numpy as np

from pipecat_rl.gate import GateConfig, evaluate, ledger_lineage, load_ledger_runs
from pipecat_rl.gate.receipt import render_markdown
from pipecat_rl.gate.report_html import render_html
from pipecat_rl.gate.stats import t_bounds
from pipecat_rl.ledger import LatencyRecord, Ledger, SessionRecord, TurnRecord

SCENARIOS, REPEATS, TURNS = 24, 8, 4
POLICIES = {"candidate-v2": (0.65, 720.0), "base": (0.5, 700.0)}


def build(ledger: Ledger) -> None:
    rng = np.random.default_rng(0)
    for policy, (p_pass, v2v_ms) in POLICIES.items():
        for s in range(SCENARIOS):
            for r in range(REPEATS):
                sid = f"{policy}-{s}-{r}"
                t0 = 1_000.0 + 100 * s + r
                session = SessionRecord(
                    id=sid, source="gate", started_at=t0, ended_at=t0 + 45, split="heldout",
                    scenario_id=f"scn-{s:02d}", scenario_hash=f"h{s}", heldout_set_id="bench",
                    policy=policy, seed=100 * s + r, repeat=r,
                    reward=(passed := float(rng.random() < p_pass)) + 0.2,
                    reward_parts={"verifier": passed, "tool_credit": 0.2},
                )  # fmt: skip
                turns = [
                    TurnRecord(
                        session_id=sid,
                        index=i,
                        adapter=policy,
                        created_at=t0 + i,
                        request={"messages": [{"role": "user", "content": "x" * 400}]},
                        prompt_token_ids=list(range(600)),
                        completion_token_ids=list(range(40)),
                        logprobs=[-0.1] * 40,
                        token_exact=True,
                        usage={"prompt_tokens": 600, "completion_tokens": 40},
                    )  # fmt: skip
                    for i in range(TURNS)
                ]
                lats = [
                    LatencyRecord.from_timestamps(
                        sid,
                        i,
                        user_stopped_at=t0 + 10 * i,
                        bot_started_at=t0 + 10 * i + rng.normal(v2v_ms, 150) / 1000,
                        bot_stopped_at=t0 + 10 * i + 4,
                        stt_ms=150.0,
                        llm_ttft_ms=300.0,
                    )  # fmt: skip
                    for i in range(TURNS)
                ]
                ledger.write_session(session, turns=turns, latencies=lats)


def coverage(n: int, trials: int, method: str) -> dict[str, float]:
    """Coverage of 0 and promote-side clears of 0, for identical arms at n scenarios."""
    rng = np.random.default_rng(1000 + n)
    shape = (trials, n, REPEATS)
    p = rng.uniform(0, 1, size=(trials, n, 1))
    deltas = ((rng.random(shape) < p).astype(float) - (rng.random(shape) < p)).mean(axis=2)
    if method == "student_t":
        _, low, high, _ = t_bounds(deltas)
    else:
        idx = rng.integers(0, n, size=(trials, 1000, n))
        means = np.take_along_axis(deltas[:, None, :], idx, axis=2).mean(axis=2)
        low, high = np.quantile(means, [0.025, 0.975], axis=1)
    return {
        "coverage": round(float(np.mean((low <= 0) & (high >= 0))), 4),
        "promote_side_clears": round(float(np.mean(low > 0)), 4),
    }


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp, Ledger(Path(tmp) / "bench.db") as ledger:
        build(ledger)
        start = time.perf_counter()
        data = load_ledger_runs(ledger, "candidate-v2", "base")
        loaded = time.perf_counter()
        receipt = evaluate(
            data,
            GateConfig(),
            ledger_lineage(ledger, "candidate-v2", "candidate-v2"),
            ledger_lineage(ledger, "base", "base"),
        )
        receipt.model_dump_json()
        render_markdown(receipt)
        decided = time.perf_counter()
        render_html(receipt)
        html_done = time.perf_counter()
    seconds = decided - start
    print(
        json.dumps(
            {
                "benchmark": "gate_decision",
                "scenarios": SCENARIOS,
                "repeats": REPEATS,
                "policies": len(POLICIES),
                "sessions": len(data.runs),
                "turns_per_session": TURNS,
                "resamples": receipt.thresholds.resamples,
                "read_ledger_s": round(loaded - start, 3),
                "statistics_and_verdict_s": round(decided - loaded, 3),
                "decision_s": round(seconds, 3),
                "html_render_s": round(html_done - decided, 3),
                "target_s": 2.0,
                "meets_target": seconds < 2.0,
                "verdict": receipt.verdict,
                "identical_arms_coverage": {
                    f"n={n}": {
                        "student_t": coverage(n, 20_000, "student_t"),
                        "percentile_bootstrap": coverage(n, 2_000, "percentile"),
                    }
                    for n in (8, 16, 24)
                },
            },
            indent=2,
        )
    )


if __name__ == "__main__":
    main()
