"""The gate's operating characteristics, its decision time, and the interval's coverage.

Operating characteristics (`pipecat_rl.gate.operating`: the gate's own reward decision,
vectorised, seeded): pass/fail runs under two scenario models, spread (incumbent pass probability
uniform on [0, 1]) and bimodal (Beta(0.15, 0.15), like the clinic), at 8 and 24 scenarios and 2
and 8 repeats, and at the clinic matrix's 72 and 100 scenarios run once, with the default
configuration:

- identical arms (20,000 trials): how often the gate PROMOTEs (target <= 2.5%) and REJECTs
  (target <= 5%);
- every scenario +0.2 and +0.3 (4,000 trials each): P(PROMOTE) against P(the interval alone
  clears min_delta) (target: at least 0.9 of it);
- two of 24 scenarios broken outright (pass 1 -> 0) while 12 (or all 22 others) gain +0.4
  (4,000 trials): P(PROMOTE) at each number of repeats, with the default pooled regression test
  and with per-scenario tests added (refused below the 9 repeats they need), and the smallest K at
  which P(PROMOTE) <= 10%.

Timing: 24 scenarios x 8 repeats x 2 policies read from a throwaway ledger (4 turns with token
usage and latencies each), every statistic (10,000-resample latency bootstraps, the t interval,
the sign-flip test, the regression family) and the verdict, target < 2 s; the HTML page apart.

Coverage: identical arms, 20,000 trials per size, binary rewards, 8 repeats: how often the 95%
t interval covers 0 and clears it on the promote side, against the percentile cluster bootstrap
the gate used before (2,000 trials, 1,000 resamples).

    python benchmarks/gate_decision.py [--out docs/results/gate-decision/gate_decision.json]

Prints the tables (Markdown, as in the README) and writes everything as JSON to --out.
"""

import argparse
import json
import tempfile
import time
from pathlib import Path

import numpy as np

from pipecat_rl.errors import ConfigError
from pipecat_rl.gate import GateConfig, evaluate, ledger_lineage, load_ledger_runs
from pipecat_rl.gate.operating import (
    broken,
    draw_runs,
    identical,
    interval_clears,
    rates,
    reward_decisions,
    shifted,
)
from pipecat_rl.gate.receipt import render_markdown
from pipecat_rl.gate.report_html import render_html
from pipecat_rl.gate.stats import t_bounds
from pipecat_rl.ledger import LatencyRecord, Ledger, SessionRecord, TurnRecord

SCENARIOS, REPEATS, TURNS = 24, 8, 4
POLICIES = {"candidate-v2": (0.65, 720.0), "base": (0.5, 700.0)}
MODELS = ("spread", "bimodal")
SIZES = ((8, 2), (8, 8), (24, 2), (24, 8), (72, 1), (100, 1))
"""(scenarios, repeats): a user's 8, the hand-written clinic's 24, and the clinic matrix's
main job (its fixed sample of 72 held-out scenarios, one run each) and loop-full.yaml (all 100)."""
GAINS = (0.2, 0.3)
BROKEN_REPEATS = (2, 4, 8, 9, 12, 16)
OUT = Path(__file__).resolve().parents[1] / "docs" / "results" / "gate-decision"


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
                        timestamps={"llm_request": t0 + i, "llm_done": t0 + i + 0.8},
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


def timing() -> dict:
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
    return {
        "scenarios": SCENARIOS, "repeats": REPEATS, "policies": len(POLICIES),
        "sessions": len(data.runs), "turns_per_session": TURNS,
        "resamples": receipt.thresholds.resamples, "read_ledger_s": round(loaded - start, 3),
        "statistics_and_verdict_s": round(decided - loaded, 3),
        "decision_s": round(decided - start, 3), "html_render_s": round(html_done - decided, 3),
        "target_s": 2.0, "meets_target": decided - start < 2.0, "verdict": receipt.verdict,
    }  # fmt: skip


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


def operating(config: GateConfig) -> dict:
    """Identical arms and uniform gains (+0.2, +0.3), per scenario model and size."""
    out = {}
    for model in MODELS:
        for n, k in SIZES:
            rng = np.random.default_rng(1000 * n + 10 * k + MODELS.index(model))
            cand, inc = draw_runs(*identical(model, rng, 20_000, n), k, rng)
            same = rates(reward_decisions(cand, inc, config))
            row = {
                "identical_promote": round(same["PROMOTE"], 4),
                "identical_reject": round(same["REJECT"], 4),
            }
            for effect in GAINS:
                cand, inc = draw_runs(*shifted(model, rng, 4000, n, effect), k, rng)
                gain = rates(reward_decisions(cand, inc, config))["PROMOTE"]
                clears = float(np.mean(interval_clears(cand, inc, config)))
                row[f"gain_{effect}_promote"] = round(gain, 4)
                row[f"gain_{effect}_interval_clears"] = round(clears, 4)
                row[f"gain_{effect}_power_kept"] = round(gain / clears, 3) if clears else None
            out[f"{model} n={n} K={k}"] = row
    return out


def broken_scenarios(gaining: int) -> dict:
    """P(PROMOTE) by repeats when 2 of 24 scenarios break outright and `gaining` gain +0.4."""
    configs = {
        "pooled (default)": GateConfig(),
        "pooled + per-scenario": GateConfig(regression_tests=("pooled", "scenarios")),
    }
    out: dict = {}
    for model in MODELS:
        rows: dict = {}
        for k in BROKEN_REPEATS:
            rng = np.random.default_rng(k + 100 * gaining + 10_000 * MODELS.index(model))
            p = broken(model, rng, 4000, 24, broken=2, gaining=gaining, gain=0.4)
            cand, inc = draw_runs(*p, k, rng)
            row = {}
            for name, config in configs.items():
                try:
                    row[name] = round(rates(reward_decisions(cand, inc, config))["PROMOTE"], 4)
                except ConfigError:
                    row[name] = None  # refused: the per-scenario tests cannot fire at k
            rows[k] = row
        smallest = {
            name: next(
                (k for k, r in rows.items() if r[name] is not None and r[name] <= 0.10), None
            )
            for name in configs
        }
        out[model] = {"promote_by_repeats": rows, "smallest_repeats_at_most_10pct": smallest}
    return out


def _pct(x: float | None) -> str:
    return "refused" if x is None else f"{100 * x:.1f}%"


def tables(result: dict) -> str:
    lines = [
        "| model | scenarios | repeats | identical: PROMOTE | identical: REJECT | "
        + " | ".join(f"+{g}: PROMOTE | +{g}: interval alone" for g in GAINS)
        + " | power kept |",
        "|---|---|---|---|---|" + "---|---|" * len(GAINS) + "---|",
    ]
    for key, r in result["operating"].items():
        model, n, k = key.replace("n=", "").replace("K=", "").split()
        gains = " | ".join(
            f"{_pct(r[f'gain_{g}_promote'])} | {_pct(r[f'gain_{g}_interval_clears'])}"
            for g in GAINS
        )
        kept = min(r[f"gain_{g}_power_kept"] or 1.0 for g in GAINS)
        lines.append(
            f"| {model} | {n} | {k} | {_pct(r['identical_promote'])} | "
            f"{_pct(r['identical_reject'])} | {gains} | {kept:.2f} |"
        )
    for gaining, label in ((12, "12 gain +0.4"), (22, "the other 22 gain +0.4")):
        block = result[f"broken_2_gaining_{gaining}"]
        lines += [
            "",
            f"Two of 24 scenarios broken (pass 1 -> 0), {label}: P(PROMOTE) by repeats K",
            "",
            "| model | tests | "
            + " | ".join(f"K={k}" for k in BROKEN_REPEATS)
            + " | smallest K <= 10% |",
            "|---|---|" + "---|" * len(BROKEN_REPEATS) + "---|",
        ]
        for model, b in block.items():
            for name in next(iter(b["promote_by_repeats"].values())):
                cells = " | ".join(_pct(r[name]) for r in b["promote_by_repeats"].values())
                smallest = b["smallest_repeats_at_most_10pct"][name]
                lines.append(f"| {model} | {name} | {cells} | {smallest or 'none'} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=OUT / "gate_decision.json")
    args = parser.parse_args()
    started = time.perf_counter()
    result = {
        "benchmark": "gate_decision",
        "operating": operating(GateConfig()),
        "broken_2_gaining_12": broken_scenarios(12),
        "broken_2_gaining_22": broken_scenarios(22),
        "timing": timing(),
        "identical_arms_coverage": {
            f"n={n}": {
                "student_t": coverage(n, 20_000, "student_t"),
                "percentile_bootstrap": coverage(n, 2_000, "percentile"),
            }
            for n in (8, 16, 24)
        },
    }
    result["wall_s"] = round(time.perf_counter() - started, 1)
    print(tables(result))
    print()
    print(json.dumps(result["timing"], indent=2))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
