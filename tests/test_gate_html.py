"""receipt.html is self-contained, opens in headless Chromium without errors and shows its plots."""

import json
import re
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from pipecat_rl.cli import app
from tests.chromium import CHROMIUM, render

CANDIDATE_BLUE = np.array([0x1F, 0x6F, 0xEB]) / 255


@pytest.fixture(scope="module")
def page(tmp_path_factory) -> Path:
    tmp = tmp_path_factory.mktemp("html")
    rng = np.random.default_rng(0)
    lines = []
    for s in range(10):
        for r in range(4):
            for policy, p_win, lat in (("cand", 0.8, 750), ("inc", 0.5, 700)):
                v2v = rng.normal(lat, 120, size=4).tolist()
                lines.append({
                    "scenario": f"scenario-{s}", "policy": policy, "run": r,
                    "reward": float(rng.random() < p_win), "v2v_ms": v2v,
                    "stages_ms": {"stt_ms": [x * 0.2 for x in v2v],
                                  "llm_ttft_ms": [x * 0.5 for x in v2v],
                                  "tts_ttfb_ms": [x * 0.2 for x in v2v]},
                })  # fmt: skip
    scores = tmp / "scores.jsonl"
    scores.write_text("".join(json.dumps(x) + "\n" for x in lines))
    result = CliRunner().invoke(
        app, ["gate", "--candidate", "cand", "--incumbent", "inc", "--scores", str(scores),
              "--out", str(tmp / "out"), "--ledger", str(tmp / "ledger.db")]
    )  # fmt: skip
    assert result.exit_code in (0, 1, 2), result.output
    return tmp / "out" / "receipt.html"


def test_the_page_is_self_contained_with_three_inline_plots(page):
    text = page.read_text()
    assert text.count("<svg") == 3
    assert "<script" not in text
    assert not re.search(r"""(src|href)=["'](?!#)""", text), "no external resources"
    assert "Paired per-scenario deltas" in text and "Voice-to-voice latency CDF" in text


@pytest.mark.skipif(CHROMIUM is None, reason="needs chromium (apt-get install chromium)")
def test_the_page_renders_in_headless_chromium(page, tmp_path):
    image, dom, console = render(page, tmp_path)
    assert console == [], console
    assert dom.count("<svg") == 3
    assert image.shape[:2] == (2600, 1200)
    blue = np.all(np.abs(image - CANDIDATE_BLUE) < 0.05, axis=-1)
    assert blue.sum() > 500, "the plots' candidate series are visible"
    assert image.std() > 0.1
