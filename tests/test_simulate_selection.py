"""Choosing scenarios as pytest and `pipecat eval` users do: -s NAME, -p GLOB, -r for repeats."""

import json
from pathlib import Path

import pytest

from pipecat_rl.cli.common import EXIT_OK, EXIT_USAGE
from pipecat_rl.ledger import Ledger
from tests.cli_helpers import invoke

CLINIC = Path(__file__).resolve().parents[1] / "examples" / "clinic"


@pytest.fixture
def no_keys(monkeypatch):
    for key in ("DEEPGRAM_API_KEY", "CARTESIA_API_KEY", "OPENAI_API_KEY", "OPENAI_BASE_URL"):
        monkeypatch.delenv(key, raising=False)


def _simulate(tmp_path: Path, *args: str):
    ledger = tmp_path / "l.db"
    result = invoke(
        "simulate", str(CLINIC / "handwritten" / "pool"), "--bot", str(CLINIC / "expert.py"),
        "--persona", "scripted", "--no-server", "--ledger", str(ledger), "--json", *args,
    )  # fmt: skip
    return result, ledger


def _ran(ledger: Path) -> list[str]:
    with Ledger(ledger, read_only=True) as store:
        return sorted(s.scenario_id for s in store.sessions())


def test_a_name_and_a_glob_choose_the_scenarios_and_r_sets_repeats(tmp_path, no_keys):
    result, ledger = _simulate(
        tmp_path, "-s", "routine_booking", "-p", "cancel_*", "-r", "2", "-c", "4"
    )
    assert result.exit_code == EXIT_OK, result.stderr
    assert _ran(ledger) == ["cancel_long_confirmation"] * 2 + ["cancel_wrong_number"] * 2 + [
        "routine_booking"
    ] * 2
    assert json.loads(result.stdout)["episodes"]


def test_a_name_that_matches_nothing_names_the_closest(tmp_path, no_keys):
    result, ledger = _simulate(tmp_path, "-s", "routine_bookin")
    assert result.exit_code == EXIT_USAGE
    assert "no such scenario" in result.stderr and "routine_booking" in result.stderr
    assert not ledger.exists()


def test_k_is_retired_with_a_message_not_read_as_repeats(tmp_path, no_keys):
    result, ledger = _simulate(tmp_path, "-k", "2")
    assert result.exit_code == EXIT_USAGE
    assert "-k is retired" in result.stderr and "-r/--repeats" in result.stderr
    assert not ledger.exists()
