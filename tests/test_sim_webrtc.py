"""`--transport webrtc`: the agent behind Pipecat's SmallWebRTCTransport, the caller an aiortc peer.

The first test is a bare connection (no pipelines, about a second); the episodes are real-time
audio calls through Opus and aiortc's jitter buffer, so they are `slow`.
"""

import asyncio
import re
import statistics

import pytest

from pipecat_rl.ledger import Ledger
from pipecat_rl.simulator import SimulationConfig, load_bot, load_scenarios, simulate
from tests import audio_bots
from tests.test_sim_audio import BOTS, EXPERT, POOL, _scenario

pytest.importorskip("aiortc")

WEBRTC = SimulationConfig(persona="scripted", mode="audio", transport="webrtc", concurrency=1)


def _candidate_hosts(sdp: str) -> set[str]:
    return {m.group(1) for m in re.finditer(r"a=candidate:\S+ \d+ udp \d+ (\S+) \d+", sdp)}


async def test_the_caller_connects_on_loopback_and_its_hang_up_reaches_the_agent():
    from pipecat_rl.simulator.audio.webrtc import WebRTCAudioPair

    pair = WebRTCAudioPair(max_turns=4)
    connected, closed = asyncio.Event(), asyncio.Event()

    @pair.connection.event_handler("connected")
    async def on_connected(_connection):
        connected.set()

    @pair.connection.event_handler("closed")
    async def on_closed(_connection):
        closed.set()

    await pair.connection.connect()  # what the agent's transport does when its pipeline starts
    await pair.connect_caller()
    await asyncio.wait_for(connected.wait(), 60)  # the agent side is on the call too
    assert pair.caller_connected.is_set() and pair.connection.is_connected()
    offer, answer = pair.peer.localDescription.sdp, pair.connection.get_answer()["sdp"]
    assert _candidate_hosts(offer) == {"127.0.0.1"} == _candidate_hosts(answer)
    assert "opus/48000" in answer.lower()
    pair.end("caller_hung_up")
    await asyncio.wait_for(closed.wait(), 60)  # the agent side saw the caller leave
    await pair.close()
    assert pair.end_reason == "caller_hung_up" and pair.peer.connectionState == "closed"


def test_a_bot_modules_own_webrtc_params_are_used():
    from pathlib import Path

    fixture = Path(__file__).parent / "fixtures" / "pipecat" / "bots" / "function_calling.py"
    entry = load_bot(str(fixture))
    assert entry.webrtc_params is not None and entry.webrtc_params().audio_in_enabled
    assert entry.webrtc_params() is not entry.webrtc_params()  # fresh per call
    assert load_bot(EXPERT).webrtc_params is None  # its params live inside bot(): defaults


@pytest.mark.slow
@pytest.mark.shares_machine
@pytest.mark.integration
async def test_a_webrtc_clinic_episode_exchanges_audio_both_ways_and_ends_cleanly(tmp_path):
    from loguru import logger

    said: list[str] = []
    sink = logger.add(lambda m: said.append(m.record["message"]), level="DEBUG")
    ledger = Ledger(tmp_path / "l.db")
    scenarios = load_scenarios([POOL / "handoff_request.yaml"])
    try:
        report = await simulate(scenarios, load_bot(EXPERT), WEBRTC, ledger)
    finally:
        logger.remove(sink)
    (episode,) = report.episodes
    # The bot's own handlers saw the caller arrive and leave over SmallWebRTC, and it stopped on
    # its own: the simulator never had to cancel it (its time is load's, not a bound on it).
    assert "Client connected" in said and "Client disconnected" in said
    assert not [m for m in said if m.startswith("the bot did not stop")], said
    assert episode.error is None and episode.end_reason == "caller_hung_up"
    assert episode.outcome == "pass"
    session = ledger.session(episode.session_id)
    assert session.metadata["transport"] == "webrtc" and session.outcome == "pass"
    transcript = session.metadata["transcript"]
    callers = [x for x in transcript if x["speaker"] == "caller"]
    agents = [x for x in transcript if x["speaker"] == "agent"]
    # Caller -> agent: the agent's Whisper heard the caller through Opus.
    assert "real person" in callers[0]["heard"].lower()
    # Agent -> caller: the caller's Whisper heard the agent's greeting through Opus.
    assert "bright smile" in agents[0]["heard"].lower()
    rows = ledger.latencies(session.id)
    assert rows and all(r.heard_gap_ms and r.heard_gap_ms > 0 and r.v2v_ms for r in rows)


@pytest.mark.slow
@pytest.mark.shares_machine
@pytest.mark.integration
async def test_over_webrtc_a_known_agent_delay_moves_the_heard_gap_by_that_much(tmp_path):
    scenario = _scenario(tmp_path)
    gaps = {}
    for name, entry in (("fast", "run_bot"), ("slow", "run_bot_delayed")):
        ledger = Ledger(tmp_path / f"{name}.db")
        report = await simulate(
            load_scenarios([scenario]), load_bot(f"{BOTS}:{entry}"), WEBRTC, ledger
        )
        (episode,) = report.episodes
        assert episode.error is None, episode.error
        rows = ledger.latencies(episode.session_id)
        assert len(rows) >= 2 and all(r.heard_gap_ms is not None for r in rows)
        gaps[name] = statistics.median(r.heard_gap_ms for r in rows)
    # The codec and both jitter buffers add the same to each run; the delay shows through whole.
    moved = gaps["slow"] - gaps["fast"]
    assert abs(moved - audio_bots.DELAY_S * 1000) <= 30.0, gaps


def test_heard_gaps_over_different_transports_are_not_compared():
    from pipecat_rl.gate.config import GateConfig
    from pipecat_rl.gate.evaluate import evaluate
    from pipecat_rl.gate.inputs import GateData, InputSource, RunResult
    from pipecat_rl.gate.lineage import base_lineage

    def runs(cand_transport):
        return tuple(
            RunResult(
                scenario=f"s{i}", policy=p, run=0, reward=1.0, channel="audio",
                transport=cand_transport if p == "cand" else "local",
                heard_gap_ms=(800.0 if p == "cand" and cand_transport == "webrtc" else 500.0,),
                v2v_ms=(400.0,),
            )  # fmt: skip
            for i in range(8)
            for p in ("cand", "inc")
        )

    def receipt(cand_transport):
        data = GateData(
            candidate="cand", incumbent="inc", runs=runs(cand_transport),
            source=InputSource(kind="ledger", path="mem"),
        )  # fmt: skip
        return evaluate(data, GateConfig(), base_lineage("cand"), base_lineage("inc"))

    same = receipt("local")
    assert same.latency.gated_on == "heard_gap"
    mixed = receipt("webrtc")  # 300 ms "slower" only because WebRTC sits in the candidate's path
    assert mixed.latency.gated_on == "v2v"
    assert any("different transports" in n for n in mixed.notes)
    checks = {c.name: c for c in mixed.checks}
    assert checks["p95_vs_incumbent"].status == "pass"  # the agents did the same work


def test_without_aiortc_webrtc_is_a_clear_error_naming_the_extra(monkeypatch):
    import sys

    from pipecat_rl.errors import ConfigError
    from pipecat_rl.simulator.audio.webrtc import require_webrtc

    monkeypatch.setitem(sys.modules, "aiortc", None)  # as if pipecat-rl[webrtc] were not installed
    with pytest.raises(ConfigError, match=r"aiortc is missing.*pipecat-rl\[webrtc\]"):
        require_webrtc()
