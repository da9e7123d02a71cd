"""Every verdict path of `pipecat-rl gate`, decided from scores files."""

import hashlib
import json
import math
import statistics
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from pipecat_rl.cli import app
from pipecat_rl.cli.common import EXIT_DATA, EXIT_USAGE
from pipecat_rl.gate import load_receipt
from pipecat_rl.gate.receipt import receipt_sha256
from pipecat_rl.ledger import Ledger

SCENARIOS, REPEATS, TURNS = 12, 4, 3


def _lines(
    policy: str,
    reward: Callable[[int, int], float],
    *,
    latency_ms: float | None = 700.0,
    writes: Callable[[int, int], int] = lambda s, r: 0,
    seed: int = 0,
    repeats: int = REPEATS,
) -> list[dict]:
    rng = np.random.default_rng(seed)
    out = []
    for s in range(SCENARIOS):
        for r in range(repeats):
            line = {
                "scenario": f"scn-{s:02d}",
                "policy": policy,
                "run": r,
                "seed": 1000 * s + r,
                "reward": reward(s, r),
                "unauthorized_writes": writes(s, r),
            }
            if latency_ms is not None:
                line["v2v_ms"] = rng.normal(latency_ms, 30, size=TURNS).round(1).tolist()
            out.append(line)
    return out


def _write(path: Path, *groups: list[dict]) -> Path:
    path.write_text("".join(json.dumps(x) + "\n" for g in groups for x in g))
    return path


def _gate(tmp_path: Path, scores: Path, *args: str):
    out = tmp_path / "receipt"  # one folder, replaced by each call (--force): verdicts, not files
    result = CliRunner().invoke(
        app,
        ["gate", "--candidate", "cand", "--incumbent", "inc", "--scores", str(scores),
         "--out", str(out), "--force", "--ledger", str(tmp_path / "ledger.db"), "--json", *args],
    )  # fmt: skip
    receipt = json.loads(result.stdout) if result.stdout.strip() else None
    return result, receipt


def _check(receipt: dict, name: str) -> dict:
    return next(c for c in receipt["checks"] if c["name"] == name)


def better(s: int, r: int) -> float:
    return 1.0


def coin(s: int, r: int) -> float:
    return float(r % 2)


def test_promote(tmp_path):
    scores = _write(tmp_path / "s.jsonl", _lines("cand", better), _lines("inc", coin, seed=1))
    result, receipt = _gate(tmp_path, scores)
    assert result.exit_code == 0, result.output
    assert receipt["verdict"] == "PROMOTE"
    assert receipt["paired"]["mean_delta"] == pytest.approx(0.5)
    # every scenario +0.5: the interval has no width, and the exact sign-flip test decides
    assert receipt["paired"]["ci95"] == pytest.approx([0.5, 0.5])
    assert receipt["paired"]["zero_width"] is True
    assert receipt["paired"]["sign_flip"]["p_greater"] == pytest.approx(2**-SCENARIOS)
    assert "sign-flip test" in _check(receipt, "paired_reward")["detail"]
    assert receipt["paired"]["method"] == "student_t"
    assert _check(receipt, "training_guard")["status"] == "unavailable"
    assert "scores file" in _check(receipt, "training_guard")["detail"]
    unchecked = receipt["reason"].split("(")[-1]
    assert unchecked == "LLM latency and training guard not checked)."
    assert receipt["reasons"][-1].startswith("Training guard (not checked): Guard unavailable")
    for name in ("receipt.json", "receipt.md", "receipt.html"):
        assert (tmp_path / "receipt" / name).is_file()
    assert "PROMOTE" in result.stderr


def test_receipt_records_inputs_thresholds_and_every_scenario(tmp_path):
    scores = _write(tmp_path / "s.jsonl", _lines("cand", better), _lines("inc", coin, seed=1))
    _, receipt = _gate(tmp_path, scores, "--min-delta", "0.1", "--seed", "5")
    assert receipt["schema_version"] == 5
    assert receipt["input"]["kind"] == "scores"
    assert receipt["input"]["sha256"] == hashlib.sha256(scores.read_bytes()).hexdigest()
    assert receipt["thresholds"]["min_delta"] == 0.1
    assert receipt["thresholds"]["seed"] == receipt["latency"]["v2v_p95"]["difference"]["seed"] == 5
    assert receipt["thresholds"]["resamples"] >= 10_000
    assert receipt["paired"]["method"] == "student_t" and receipt["paired"]["df"] == SCENARIOS - 1
    assert receipt["repeats"] == REPEATS
    assert len(receipt["scenarios"]) == SCENARIOS
    assert receipt["scenarios"][0]["seeds"] == [0, 1, 2, 3]
    assert receipt["paired"]["pass_k"]["candidate"]["4"] == 1.0
    assert receipt["paired"]["pass_k"]["incumbent"]["1"] == pytest.approx(0.5)
    assert receipt["paired"]["pass_k"]["incumbent"]["3"] == 0.0
    assert receipt["latency"]["v2v_p95"]["candidate_sessions"] == SCENARIOS * REPEATS
    loaded = load_receipt(tmp_path / "receipt")
    assert loaded.model_dump(mode="json") == receipt
    assert (tmp_path / "receipt" / "receipt.md").read_text().startswith("# Gate: PROMOTE")
    # the gate recorded the receipt's bytes and verdict in the ledger
    with Ledger(tmp_path / "ledger.db") as ledger:
        row = ledger.gate_receipt(receipt_sha256(tmp_path / "receipt"))
    assert row["verdict"] == "PROMOTE" and row["receipt_id"] == receipt["receipt_id"]
    assert (row["candidate"], row["incumbent"]) == ("cand", "inc")


def test_zero_width_evidence_is_inconclusive_never_reject(tmp_path):
    scores = _write(tmp_path / "s.jsonl", _lines("cand", coin), _lines("inc", coin, seed=1))
    result, receipt = _gate(tmp_path, scores)
    assert result.exit_code == 2, result.output
    assert receipt["verdict"] == "INCONCLUSIVE"
    assert receipt["paired"]["ci95"] == [0.0, 0.0] and receipt["paired"]["zero_width"]
    assert receipt["paired"]["sign_flip"]["p_two_sided"] == 1.0
    assert _check(receipt, "paired_reward")["status"] == "uncertain"
    assert "no width" in _check(receipt, "paired_reward")["detail"]


def test_only_a_surely_worse_candidate_is_rejected_on_the_interval(tmp_path):
    rng = np.random.default_rng(8)
    noise = rng.random((2, SCENARIOS, REPEATS))
    worse = _lines("cand", lambda s, r: float(noise[0, s, r] < 0.2))
    base = _lines("inc", lambda s, r: float(noise[1, s, r] < 0.9), seed=1)
    result, receipt = _gate(tmp_path, _write(tmp_path / "s.jsonl", worse, base))
    assert result.exit_code == 1, result.output
    assert receipt["paired"]["ci95"][1] < 0
    assert "surely worse than the incumbent" in _check(receipt, "paired_reward")["detail"]
    # not shown better by min_delta, and not shown worse either: inconclusive, not a rejection
    same = _lines("cand", lambda s, r: float(noise[1, s, r] < 0.9))
    result, receipt = _gate(tmp_path, _write(tmp_path / "s.jsonl", same, base))
    assert receipt["verdict"] != "REJECT"


def _two_lost(s, r):
    return 0.0 if s < 2 else 1.0  # loses scenarios 0 and 1 in every run, wins the rest


def _two_kept(s, r):
    return 1.0 if s < 2 else 0.0


def test_per_scenario_regressions_reject_on_their_own_evidence(tmp_path):
    config = tmp_path / "gate.yaml"
    config.write_text("regression_tests: [scenarios]\n")
    # 8 paired runs, all lost: each lost scenario's exact test gives 1/256, Holm over 12 clears
    cand, inc = _lines("cand", _two_lost, repeats=8), _lines("inc", _two_kept, repeats=8)
    scores = _write(tmp_path / "s.jsonl", cand, inc)
    result, receipt = _gate(tmp_path, scores, "--config", str(config))
    assert result.exit_code == 1, result.output
    assert receipt["regressions"]["confirmed"] == 2
    assert [s["regression"] for s in receipt["scenarios"][:3]] == ["regressed", "regressed", "none"]
    assert receipt["scenarios"][0]["regression_p"] == pytest.approx(1 / 256)
    assert receipt["scenarios"][0]["worse_runs"] == 8
    assert _check(receipt, "paired_reward")["status"] == "pass"
    assert _check(receipt, "regressions")["status"] == "fail"
    reason = "REJECT: cand is confirmed worse on 2 units (cap 0: scn-00 and scn-01)."
    assert receipt["reason"] == reason
    assert "Holm" in receipt["regressions"]["control"]
    # The same data passes with the cap raised.
    result, receipt = _gate(tmp_path, scores, "--config", str(config), "--max-regressions", "2")
    assert receipt["verdict"] == "PROMOTE"
    # The default pooled test sees a net gain: it cannot see two broken scenarios, and says so.
    result, receipt = _gate(tmp_path, scores)
    assert receipt["verdict"] == "PROMOTE"
    assert "smallest loss it could confirm" in _check(receipt, "regressions")["detail"]
    assert [s["regression"] for s in receipt["scenarios"][:2]] == ["untested", "untested"]


def test_a_per_scenario_test_the_repeats_cannot_fire_is_refused(tmp_path):
    config = tmp_path / "gate.yaml"
    config.write_text("regression_tests: [scenarios]\n")
    scores = _write(tmp_path / "s.jsonl", _lines("cand", _two_lost), _lines("inc", _two_kept))
    result, receipt = _gate(tmp_path, scores, "--config", str(config))
    assert result.exit_code == EXIT_USAGE, result.output
    assert not (tmp_path / "receipt").exists() and "verdict" not in (receipt or {})
    assert "Run at least 8 repeats" in " ".join(result.output.split())


def test_identical_noisy_arms_never_promote_and_never_reject_on_regressions(tmp_path):
    for trial in range(6):
        rng = np.random.default_rng(100 + trial)
        base = rng.uniform(0.2, 0.8, size=SCENARIOS)
        noise = rng.normal(0, 0.25, size=(2, SCENARIOS, 8))
        rewards = np.clip(base[None, :, None] + noise, 0, 1).tolist()
        cand = _lines("cand", lambda s, r, x=rewards[0]: x[s][r], repeats=8)
        inc = _lines("inc", lambda s, r, x=rewards[1]: x[s][r], seed=1, repeats=8)
        scores = _write(tmp_path / "s.jsonl", cand, inc)
        result, receipt = _gate(tmp_path, scores, "--max-regressions", "0")
        assert receipt["verdict"] != "PROMOTE"
        assert _check(receipt, "regressions")["status"] != "fail", receipt["reason"]


def test_failing_the_verifier_with_many_tool_calls_neither_passes_nor_wins(tmp_path):
    def parts(policy: str):
        lines = _lines(policy, better)
        for line in lines:
            del line["reward"]
            line["reward_parts"] = (
                {"verifier": 0.0, "tool_credit": 0.5}  # five successful lookups, task failed
                if policy == "cand" else {"verifier": 0.0, "tool_credit": 0.0}
            )  # fmt: skip
        return lines

    scores = _write(tmp_path / "s.jsonl", parts("cand"), parts("inc"))
    result, receipt = _gate(tmp_path, scores)
    assert receipt["paired"]["mean_delta"] == 0.0
    assert receipt["paired"]["wins"] == 0
    assert receipt["paired"]["pass_k"]["candidate"]["1"] == 0.0
    assert receipt["verdict"] != "PROMOTE"
    assert "never tool_credit" in receipt["paired"]["score"]


def test_judged_metrics_count_only_where_the_config_names_them(tmp_path):
    def parts(policy: str, polite: float):
        lines = _lines(policy, better)
        for line in lines:
            line["reward_parts"] = {"verifier": 1.0, "judge:polite": polite, "tool_credit": 0.3}
        return lines

    scores = _write(tmp_path / "s.jsonl", parts("cand", 1.0), parts("inc", 0.0))
    _, receipt = _gate(tmp_path, scores)
    assert receipt["paired"]["mean_delta"] == 0.0  # not named: only the verifier counts
    config = tmp_path / "gate.yaml"
    config.write_text("judged_metrics:\n  judge:polite: 0.5\n")
    _, receipt = _gate(tmp_path, scores, "--config", str(config))
    assert receipt["paired"]["mean_delta"] == pytest.approx(0.5 / 1.5)
    assert "judge:polite x0.5" in receipt["paired"]["score"]
    config.write_text("judged_metrics:\n  tool_credit: 1.0\n")
    result, _ = _gate(tmp_path, scores, "--config", str(config))
    assert result.exit_code == EXIT_DATA
    assert f"{config}:2: judged_metrics" in " ".join(result.stderr.split())


def test_p95_over_the_absolute_budget_rejects(tmp_path):
    scores = _write(
        tmp_path / "s.jsonl",
        _lines("cand", better, latency_ms=1800),
        _lines("inc", coin, latency_ms=1800, seed=1),
    )
    result, receipt = _gate(tmp_path, scores)
    assert result.exit_code == 1
    assert _check(receipt, "p95_budget")["status"] == "fail"
    assert _check(receipt, "p95_vs_incumbent")["status"] == "pass"


def test_p95_slower_than_the_incumbent_beyond_the_margin_rejects(tmp_path):
    scores = _write(
        tmp_path / "s.jsonl",
        _lines("cand", better, latency_ms=1000),
        _lines("inc", coin, latency_ms=700, seed=1),
    )
    result, receipt = _gate(tmp_path, scores)
    assert result.exit_code == 1
    assert _check(receipt, "p95_budget")["status"] == "pass"
    assert _check(receipt, "p95_vs_incumbent")["status"] == "fail"
    diff = receipt["latency"]["v2v_p95"]["difference"]
    assert diff["low"] > 100


def test_any_unauthorized_write_rejects(tmp_path):
    def one_write(s, r):
        return int(s == 3 and r == 2)

    scores = _write(
        tmp_path / "s.jsonl", _lines("cand", better, writes=one_write), _lines("inc", coin)
    )
    result, receipt = _gate(tmp_path, scores)
    assert result.exit_code == 1
    assert _check(receipt, "unauthorized_writes")["status"] == "fail"
    assert receipt["scenarios"][3]["candidate_unauthorized_writes"] == 1


def test_require_guard_rejects_when_no_guard_can_be_read(tmp_path):
    scores = _write(tmp_path / "s.jsonl", _lines("cand", better), _lines("inc", coin))
    result, receipt = _gate(tmp_path, scores, "--require-guard")
    assert result.exit_code == 1
    assert _check(receipt, "training_guard")["status"] == "fail"
    assert "--require-guard" in receipt["reason"]


def test_a_small_noisy_effect_is_inconclusive_with_the_sample_that_would_decide(tmp_path):
    rng = np.random.default_rng(3)
    cand_rewards = rng.random((SCENARIOS, REPEATS)) < 0.6
    inc_rewards = rng.random((SCENARIOS, REPEATS)) < 0.5
    scores = _write(
        tmp_path / "s.jsonl",
        _lines("cand", lambda s, r: float(cand_rewards[s, r])),
        _lines("inc", lambda s, r: float(inc_rewards[s, r]), seed=1),
    )
    result, receipt = _gate(tmp_path, scores, "--max-regressions", "12")
    assert result.exit_code == 2, result.output
    assert receipt["verdict"] == "INCONCLUSIVE"
    low, high = receipt["paired"]["ci95"]
    assert low <= 0.02 <= high
    sample = receipt["paired"]["sample_size"]
    assert sample["required_scenarios"] > SCENARIOS
    assert f"about {sample['required_scenarios']} scenarios" in receipt["reason"]


def test_missing_latency_is_inconclusive_unless_not_required(tmp_path):
    scores = _write(
        tmp_path / "s.jsonl",
        _lines("cand", better, latency_ms=None),
        _lines("inc", coin, latency_ms=None),
    )
    result, receipt = _gate(tmp_path, scores)
    assert result.exit_code == 2
    assert _check(receipt, "p95_budget")["status"] == "uncertain"
    assert receipt["latency"]["v2v_p95"] is None
    result, receipt = _gate(tmp_path, scores, "--no-require-latency")
    assert result.exit_code == 0
    assert _check(receipt, "p95_budget")["status"] == "unavailable"


def test_thresholds_from_a_config_file_and_flags_override_it(tmp_path):
    scores = _write(tmp_path / "s.jsonl", _lines("cand", better), _lines("inc", coin))
    config = tmp_path / "gate.yaml"
    config.write_text("gate:\n  p95_budget_ms: 500\n  prices:\n    tts_usd_per_min: 0.2\n")
    result, receipt = _gate(tmp_path, scores, "--config", str(config))
    assert result.exit_code == 1
    assert receipt["thresholds"]["p95_budget_ms"] == 500
    assert receipt["thresholds"]["prices"]["tts_usd_per_min"] == 0.2
    result, receipt = _gate(tmp_path, scores, "--config", str(config), "--p95-budget-ms", "1500")
    assert result.exit_code == 0


def test_a_bad_config_file_is_a_data_error_naming_file_line_and_field(tmp_path):
    scores = _write(tmp_path / "s.jsonl", _lines("cand", better), _lines("inc", coin))
    config = tmp_path / "gate.json"
    config.write_text('{\n  "seed": 1,\n  "resamples": 100\n}')
    result, _ = _gate(tmp_path, scores, "--config", str(config))
    assert result.exit_code == EXIT_DATA
    assert f"{config}:3: resamples" in " ".join(result.stderr.split())


def test_cost_per_success_comes_from_usage(tmp_path):
    cand = _lines("cand", better)
    inc = _lines("inc", coin)
    for line in cand + inc:
        talk = 300 if line["policy"] == "cand" else 100
        line["usage"] = {"prompt_tokens": 1000, "completion_tokens": talk, "tts_seconds": 20}
    scores = _write(tmp_path / "s.jsonl", cand, inc)
    _, receipt = _gate(tmp_path, scores)
    cost = receipt["cost"]
    assert cost["candidate"]["mean_completion_tokens"] == 300
    assert cost["candidate"]["per_call_usd"] > cost["incumbent"]["per_call_usd"]
    assert cost["incumbent"]["successes"] == SCENARIOS * REPEATS // 2
    assert cost["incumbent"]["per_success_usd"] == pytest.approx(
        cost["incumbent"]["total_usd"] / cost["incumbent"]["successes"]
    )


def test_unpaired_runs_are_left_out_and_noted(tmp_path):
    inc = [x for x in _lines("inc", coin) if not (x["scenario"] == "scn-00" and x["run"] == 3)]
    extra = {**_lines("cand", better)[0], "scenario": "only-cand"}
    scores = _write(tmp_path / "s.jsonl", _lines("cand", better), inc, [extra])
    _, receipt = _gate(tmp_path, scores)
    assert receipt["scenarios"][0]["pairs"] == 3
    assert receipt["paired"]["n_scenarios"] == SCENARIOS
    assert any("only-cand" in n for n in receipt["notes"])
    assert any("scn-00" in n and "without a partner" in n for n in receipt["notes"])


def test_a_bad_scores_line_names_the_file_line_and_field(tmp_path):
    lines = _lines("cand", better) + _lines("inc", coin)
    lines[5]["reward"] = "high"
    scores = _write(tmp_path / "s.jsonl", lines)
    result, _ = _gate(tmp_path, scores)
    assert result.exit_code == EXIT_DATA
    assert f"{scores}:6: reward" in " ".join(result.stderr.split())


def test_unknown_policy_names_are_reported(tmp_path):
    scores = _write(tmp_path / "s.jsonl", _lines("cand", better), _lines("other", coin))
    result, _ = _gate(tmp_path, scores)
    assert result.exit_code != 0
    assert "'inc'" in result.stderr


def test_running_simulations_needs_scenarios_and_a_bot(tmp_path):
    (tmp_path / "heldout").mkdir()
    ledger = ["--ledger", str(tmp_path / "ledger.db")]
    result = CliRunner().invoke(
        app, ["gate", "--candidate", "cand", "--scenarios", str(tmp_path / "heldout"), *ledger]
    )
    assert result.exit_code == EXIT_USAGE
    assert "--bot BOT" in result.stderr
    assert "--from-ledger" in result.stderr
    result = CliRunner().invoke(app, ["gate", "--candidate", "cand", *ledger])
    assert result.exit_code == EXIT_USAGE
    assert "--scenarios" in result.stderr


def test_scenario_files_named_with_scores_are_hashed_into_the_receipt(tmp_path):
    folder = tmp_path / "heldout"
    folder.mkdir()
    (folder / "a.yaml").write_text("persona: x\n")
    scores = _write(tmp_path / "s.jsonl", _lines("cand", better), _lines("inc", coin))
    _, receipt = _gate(tmp_path, scores, "--scenarios", str(folder))
    expected = hashlib.sha256(b"persona: x\n").hexdigest()
    assert receipt["input"]["scenario_files"] == {"a.yaml": expected}


def _text_lines(policy: str, reward, ttft_ms: float, seed: int) -> list[dict]:
    rng = np.random.default_rng(seed)
    lines = _lines(policy, reward, latency_ms=None, seed=seed)
    for line in lines:
        line["channel"] = "text"
        line["stages_ms"] = {"llm_ttft_ms": rng.lognormal(np.log(ttft_ms), 0.4, TURNS).tolist()}
        line["llm_turn_ms"] = rng.lognormal(np.log(3 * ttft_ms), 0.4, TURNS).tolist()
    return lines


def test_a_more_accurate_slower_candidate_fails_in_text_mode_saying_why(tmp_path):
    fast = _text_lines("inc", coin, 568.0, seed=1)
    slow = _write(tmp_path / "s.jsonl", _text_lines("cand", better, 5457.0, seed=2), fast)
    result, receipt = _gate(tmp_path, slow)
    assert result.exit_code == 1, result.output
    assert receipt["latency"]["text_mode"] is True
    ttft = _check(receipt, "llm_ttft_ratio")
    assert ttft["status"] == "fail" and _check(receipt, "llm_turn_ratio")["status"] == "fail"
    # a scores file with the caller-turn stage only: the check says so, not "per call"
    assert "The candidate's P50 LLM TTFT per caller turn is 9" in ttft["detail"]
    assert "the incumbent's" in ttft["detail"] and "above the 3.0x limit" in ttft["detail"]
    assert _check(receipt, "p95_budget")["status"] == "unavailable"  # text mode has no voice
    assert _check(receipt, "paired_reward")["status"] == "pass"  # more accurate, and still out
    same_speed = _write(tmp_path / "s.jsonl", _text_lines("cand", better, 568.0, seed=2), fast)
    result, receipt = _gate(tmp_path, same_speed)
    assert result.exit_code == 0, result.output
    assert _check(receipt, "llm_ttft_ratio")["status"] == "pass"


def test_text_mode_without_llm_stages_is_inconclusive_unless_latency_is_not_required(tmp_path):
    def text(policy, reward):
        return [{**line, "channel": "text"} for line in _lines(policy, reward, latency_ms=None)]

    scores = _write(tmp_path / "s.jsonl", text("cand", better), text("inc", coin))
    result, receipt = _gate(tmp_path, scores)
    assert result.exit_code == 2
    assert _check(receipt, "llm_ttft_ratio")["status"] == "uncertain"
    result, receipt = _gate(tmp_path, scores, "--no-require-latency")
    assert result.exit_code == 0


COMMITTED_CYCLE = Path(__file__).resolve().parent / "data" / "cycle-clinic-main-receipt.json"
"""The receipt of the clinic cycle committed before the LoRA ops and per-call TTFT (its LoRA
candidate's first tokens 9.6x the base's), kept as data: its stage quantiles and scenario rows."""


def _spread(p50: float, p95: float, n: int) -> list[float]:
    """n lognormal-shaped turns whose inverted-CDF P50 and P95 are exactly the given ones."""
    z = np.array([statistics.NormalDist().inv_cdf((i + 0.5) / n) for i in range(n)])
    i50, i95 = math.ceil(0.5 * n) - 1, math.ceil(0.95 * n) - 1
    slope = (math.log(p95) - math.log(p50)) / (z[i95] - z[i50])
    return np.exp(math.log(p50) + slope * (z - z[i50])).tolist()


def _share(turns: list[float], session: int, sessions: int) -> list[float]:
    """Session `session`'s turns when `turns` are spread evenly over `sessions` in order."""
    return [t for j, t in enumerate(turns) if j * sessions // len(turns) == session]


def test_the_committed_cycle_regated_says_why_its_ttft_is_not_acceptable(tmp_path):
    """The committed cycle's per-scenario table and TTFT quantiles, re-gated (text mode)."""
    old = json.loads(COMMITTED_CYCLE.read_text())
    ttft = {
        role: _spread(s["llm_ttft_ms"]["p50"], s["llm_ttft_ms"]["p95"], s["llm_ttft_ms"]["n"])
        for role, s in old["latency"]["stages"].items()
    }
    lines = []
    for row in old["scenarios"]:
        for role, policy in (("candidate", "cand"), ("incumbent", "inc")):
            for r in range(row["pairs"]):
                index = len([x for x in lines if x["policy"] == policy])
                lines.append({
                    "scenario": row["scenario"], "policy": policy, "run": r, "seed": r,
                    "reward": float(r < row[f"{role}_passed"]), "channel": "text",
                    "unauthorized_writes": int(role == "candidate" and r == 0 and
                                               row["candidate_unauthorized_writes"] > 0),
                    "stages_ms": {"llm_ttft_ms": _share(ttft[role], index, 48)},
                })  # fmt: skip
    config = tmp_path / "clinic.yaml"
    config.write_text(
        (Path(__file__).resolve().parents[1] / "examples/clinic/handwritten/gate.yaml").read_text()
    )
    result, receipt = _gate(tmp_path, _write(tmp_path / "s.jsonl", lines), "--config", str(config))
    assert result.exit_code == 1, result.output
    ttft_check = _check(receipt, "llm_ttft_ratio")
    assert ttft_check["status"] == "fail"
    assert (
        "P50 LLM TTFT per caller turn is 9.6x the incumbent's (5,457 ms vs 568 ms"
        in ttft_check["detail"]
    )
    assert "above the 3.0x limit" in ttft_check["detail"]
    assert _check(receipt, "paired_reward")["status"] == "pass"  # +0.29: more accurate, and slower
    assert _check(receipt, "unauthorized_writes")["status"] == "fail"
    assert receipt["reason"].startswith("REJECT: cand's P50 LLM TTFT per caller turn is 9.6x inc's")
