"""Bounded inputs: every malformed score, latency, threshold and count is a clear error.

Each case exits with its documented code (a bad file EXIT_DATA, a bad flag EXIT_USAGE) and one
message naming the file, the line and the field (or the flag); none reaches a verdict.
"""

import json
import math
from pathlib import Path

import pytest
from typer.testing import CliRunner

from pipecat_rl.cli import app
from pipecat_rl.cli.common import EXIT_DATA, EXIT_INCONCLUSIVE, EXIT_NO, EXIT_OK, EXIT_USAGE
from pipecat_rl.gate import GateConfig, GateData, InputSource, RunResult, evaluate
from pipecat_rl.gate.lineage import unknown_lineage
from pipecat_rl.gate.receipt import non_finite_fields
from pipecat_rl.gate.verdict import EXIT_CODES


def lines() -> list[dict]:
    return [
        {"scenario": f"s{s}", "policy": p, "run": r, "reward": float(p == "cand"),
         "v2v_ms": [700.0 + r + k for k in range(11)]}  # enough turns to bound a P95
        for s in range(6) for r in range(2) for p in ("cand", "inc")
    ]  # fmt: skip


def gate(tmp_path: Path, rows: list[dict] | str, *args: str):
    scores = tmp_path / "s.jsonl"
    text = rows if isinstance(rows, str) else "".join(json.dumps(x) + "\n" for x in rows)
    scores.write_text(text)
    result = CliRunner().invoke(
        app,
        ["gate", "--candidate", "cand", "--incumbent", "inc", "--scores", str(scores),
         "--out", str(tmp_path / "r"), "--ledger", str(tmp_path / "l.db"), *args],
    )  # fmt: skip
    return result, scores, " ".join(result.stderr.split())


BAD_LINES = [
    ("NaN reward", {"reward": math.nan}, "reward"),
    ("infinite reward", {"reward": math.inf}, "reward"),
    ("huge reward", {"reward": 1e300}, "reward"),
    ("negative reward", {"reward": -0.5}, "reward"),
    ("negative latency", {"v2v_ms": [700.0, -5.0]}, "v2v_ms.1"),
    ("infinite latency", {"v2v_ms": [math.inf]}, "v2v_ms.0"),
    ("latency in the wrong unit", {"v2v_ms": [7.0e8]}, "v2v_ms.0"),
    ("negative stage", {"stages_ms": {"stt_ms": [-1.0]}}, "stages_ms.stt_ms.0"),
    ("negative writes", {"unauthorized_writes": -1}, "unauthorized_writes"),
    ("negative tokens", {"usage": {"prompt_tokens": -3}}, "usage.prompt_tokens"),
    ("NaN usage", {"usage": {"tts_seconds": math.nan}}, "usage.tts_seconds"),
    ("parts without an authority", {"reward_parts": {"tool_credit": 0.9}}, "reward_parts"),
    ("out-of-range verifier", {"reward_parts": {"verifier": 3.0}}, "reward_parts"),
]


@pytest.mark.parametrize(("case", "change", "field"), BAD_LINES, ids=[c[0] for c in BAD_LINES])
def test_a_bad_scores_line_names_file_line_and_field(tmp_path, case, change, field):
    rows = lines()
    rows[4].update(change)
    result, scores, err = gate(tmp_path, rows)
    assert result.exit_code == EXIT_DATA, err
    assert f"{scores}:5: {field}" in err
    assert not (tmp_path / "r").exists()


BAD_FLAGS = [
    (["--min-delta", "-inf"], "--min-delta"),
    (["--min-delta", "nan"], "--min-delta"),
    (["--min-delta", "-0.9", "--max-regressions", "100"], "--min-delta"),
    (["--max-regressions", "100000"], "--max-regressions"),
    (["--p95-budget-ms", "inf"], "--p95-budget-ms"),
    (["--p95-budget-ms", "0"], "--p95-budget-ms"),
    (["--p95-margin-ms", "-1"], "--p95-margin-ms"),
    (["--tie-band", "2"], "--tie-band"),
    (["--resamples", "1000000000"], "--resamples"),
    (["--resamples", "10"], "--resamples"),
    (["--regression-alpha", "0"], "--regression-alpha"),
    (["--seed", "-1"], "--seed"),
]


@pytest.mark.parametrize(("flags", "named"), BAD_FLAGS, ids=[" ".join(f) for f, _ in BAD_FLAGS])
def test_a_bad_threshold_flag_is_a_usage_error_naming_the_flag(tmp_path, flags, named):
    result, _, err = gate(tmp_path, lines(), *flags)
    assert result.exit_code == EXIT_USAGE, err
    assert named in err
    assert not (tmp_path / "r").exists()


def test_a_bad_config_value_names_file_line_and_field(tmp_path):
    config = tmp_path / "gate.yaml"
    config.write_text("gate:\n  tie_band: 0.05\n  p95_budget_ms: .inf\n")
    result, _, err = gate(tmp_path, lines(), "--config", str(config))
    assert result.exit_code == EXIT_DATA
    assert f"{config}:3: p95_budget_ms" in err


def test_a_bad_scores_file_encoding_is_a_data_error(tmp_path):
    scores_bytes = b'{"scenario": "s\xff"}\n'
    (tmp_path / "s.jsonl").write_bytes(scores_bytes)
    result = CliRunner().invoke(
        app, ["gate", "--candidate", "cand", "--incumbent", "inc", "--scores",
              str(tmp_path / "s.jsonl"), "--ledger", str(tmp_path / "l.db")]
    )  # fmt: skip
    assert result.exit_code == EXIT_DATA


def test_no_receipt_holds_a_null_where_a_number_was_computed(tmp_path):
    result, _, err = gate(tmp_path, lines())
    assert result.exit_code == 0, err
    text = (tmp_path / "r" / "receipt.json").read_text()
    data = json.loads(text)
    # None appears only where nothing was computed (no interval needs filling here)
    assert data["paired"]["ci95"] is not None and data["paired"]["se"] is not None
    assert "NaN" not in text and "Infinity" not in text


def test_a_non_finite_statistic_is_found_before_writing():
    runs = tuple(
        RunResult(scenario=f"s{s}", policy=p, run=0, reward=1.0, passed=True, v2v_ms=(700.0,))
        for s in range(3) for p in ("a", "b")
    )  # fmt: skip
    receipt = evaluate(
        GateData("a", "b", runs, InputSource(kind="scores", path="x")),
        GateConfig(require_latency=False),
        unknown_lineage("a", "a", "t"),
        unknown_lineage("b", "b", "t"),
    )
    assert non_finite_fields(receipt) == []
    broken = receipt.model_copy(
        update={"paired": receipt.paired.model_copy(update={"mean_delta": math.nan})}
    )
    assert non_finite_fields(broken) == ["paired.mean_delta"]


def test_verdict_exit_codes_are_the_cli_table():
    assert EXIT_CODES == {"PROMOTE": EXIT_OK, "REJECT": EXIT_NO, "INCONCLUSIVE": EXIT_INCONCLUSIVE}
    assert len({EXIT_OK, EXIT_NO, EXIT_INCONCLUSIVE, EXIT_DATA, EXIT_USAGE}) == 5
