"""The example bot's turn setting, measured through the simulator: a Pipecat setting, no code.

`examples/turn-taking/bot.py` runs the same pipeline (its Silero VAD, Pipecat's turn strategies,
the embedded Whisper and Piper standing in for its Deepgram and Cartesia) with only its user turn
start strategies changed. Pipecat decides what it does; the caller's side measures it. The
bounds are those a wrong measurement misses by seconds: a bot that yields stops within Pipecat's
VAD start plus its pipeline's hops (well under a second), one that does not talks through the
rest of a 12 s reply (the barge-in comes 2 s into it).
"""

from pathlib import Path

import pytest

from pipecat_rl.scoring.turntaking import MISSED_BARGE_IN_MS, read

EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "turn-taking"
BOT = EXAMPLE / "bot.py"
SCENARIOS = EXAMPLE / "scenarios.yaml"


async def _turn_starts(strategies, frames) -> list[bool]:
    """Feed `frames` to each start strategy; each turn it starts: whether it interrupts."""
    started: list[bool] = []
    for strategy in strategies:
        strategy.add_event_handler(
            "on_user_turn_started", lambda _s, params: started.append(params.enable_interruptions)
        )
        for frame in frames:
            await strategy.process_frame(frame)
    return started


async def test_each_variant_is_a_pipecat_setting_only():
    from pipecat.frames.frames import (
        BotStartedSpeakingFrame,
        TranscriptionFrame,
        VADUserStartedSpeakingFrame,
    )

    from pipecat_rl.simulator.botloader import import_module_spec

    bot = import_module_spec(str(BOT))
    variants = {name: bot.user_turn_strategies(name) for name in bot.STRATEGIES}
    stops = {tuple(type(s) for s in v.stop) for v in variants.values()}
    assert len(stops) == 1  # Pipecat's default stop strategy in each
    voice = [BotStartedSpeakingFrame(), VADUserStartedSpeakingFrame()]
    assert await _turn_starts(variants["default"].start, voice) == [True]
    assert await _turn_starts(variants["no_interruptions"].start, voice) == [False]
    assert await _turn_starts(variants["min_words"].start, voice) == []

    def said(text: str) -> list:
        return [BotStartedSpeakingFrame(), TranscriptionFrame(text, "caller", "now")]

    assert await _turn_starts(bot.user_turn_strategies("min_words").start, said("okay")) == []
    words = said("what about Saturday")
    assert await _turn_starts(bot.user_turn_strategies("min_words").start, words) == [True]
    with pytest.raises(ValueError, match="choose one of default, no_interruptions, min_words"):
        bot.user_turn_strategies("never")


async def _barge_in(tmp_path, variant: str):
    from pipecat_rl.ledger import Ledger
    from pipecat_rl.scenarios import load_scenarios
    from pipecat_rl.simulator import SimulationConfig, load_bot, simulate

    scenarios = load_scenarios([SCENARIOS])
    picked = [s for s in scenarios if s.name == "turn_taking/barge_in"]
    only = scenarios.model_copy(update={"scenarios": picked})
    ledger = Ledger(tmp_path / f"{variant}.db")
    config = SimulationConfig(persona="scripted", mode="audio", concurrency=1)
    report = await simulate(only, load_bot(f"{BOT}:{variant}"), config, ledger)
    (episode,) = report.episodes
    heard = [(x.speaker, x.text) for x in episode.transcript]
    assert episode.error is None and episode.end_reason == "caller_hung_up", (episode.error, heard)
    record = read(ledger.session(episode.session_id).metadata)
    assert record == episode.turn_taking and record.measured, record
    return episode, record, heard


@pytest.mark.slow
@pytest.mark.shares_machine
@pytest.mark.integration
async def test_pipecat_yields_to_a_barge_in_by_default_and_not_with_interruptions_off(
    tmp_path, monkeypatch
):
    for key in ("DEEPGRAM_API_KEY", "CARTESIA_API_KEY", "OPENAI_API_KEY", "OPENAI_BASE_URL"):
        monkeypatch.delenv(key, raising=False)
    episode, default, heard = await _barge_in(tmp_path, "default")
    assert default.barge_ins == 1 and default.missed_barge_ins == 0, (default, heard)
    (tty,) = default.time_to_yield_ms  # within the bound (not missed): VAD start + hops
    agents = [x for x in episode.transcript if x.speaker == "agent"]
    assert any(x.text.endswith("[interrupted]") for x in agents), heard
    talker, kept, heard = await _barge_in(tmp_path, "no_interruptions")
    assert kept.barge_ins == 1 and kept.missed_barge_ins == 1, (kept, heard)
    # It talked on past the bound, and nothing cut its output. How long it went on before a gap
    # of 0.5 s ended its stretch is the machine's: Piper, loaded, leaves gaps between sentences.
    (talked,) = kept.time_to_yield_ms
    assert talked > MISSED_BARGE_IN_MS and talked > tty, (kept, heard)
    assert not any(x.text.endswith("[interrupted]") for x in talker.transcript), heard
    # the caller's line went over the agent for longer; the default's overlap ended at its yield
    assert kept.overlap_ms > default.overlap_ms, (kept, default, heard)
