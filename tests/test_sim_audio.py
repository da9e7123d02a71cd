"""Audio mode: offline Whisper + Piper, the paced local call, the caller-side heard gap.

Each episode here is a real-time call of a few seconds, run through Pipecat pipelines on both
sides (Silero VAD, smart-turn, Whisper tiny.en, Piper), so these tests are `slow`.
"""

import asyncio
import dataclasses
import statistics
import textwrap
from pathlib import Path

import pytest

from pipecat_rl.errors import ConfigError
from pipecat_rl.ledger import Ledger
from pipecat_rl.simulator import SimulationConfig, load_bot, load_scenarios, simulate
from pipecat_rl.simulator.audio import episode as audio_episode
from tests import audio_bots

ROOT = Path(__file__).resolve().parents[1]
POOL = ROOT / "examples" / "clinic" / "handwritten" / "pool"
EXPERT = str(ROOT / "examples" / "clinic" / "expert.py")
BOTS = str(Path(audio_bots.__file__))
AUDIO = SimulationConfig(persona="scripted", mode="audio", concurrency=1)


@pytest.fixture
def no_keys(monkeypatch):
    for key in ("DEEPGRAM_API_KEY", "CARTESIA_API_KEY", "OPENAI_API_KEY", "OPENAI_BASE_URL"):
        monkeypatch.delenv(key, raising=False)


async def _simulate(paths, bot, ledger_path, config=AUDIO):
    ledger = Ledger(ledger_path)
    return await simulate(load_scenarios(paths), load_bot(bot), config, ledger), ledger


@pytest.mark.slow
@pytest.mark.shares_machine
@pytest.mark.integration
async def test_audio_clinic_episode_offline(tmp_path, no_keys):
    report, ledger = await _simulate([POOL / "handoff_request.yaml"], EXPERT, tmp_path / "l.db")
    (episode,) = report.episodes
    session = ledger.session(episode.session_id)
    transcript = session.metadata["transcript"]
    heard = [(x["speaker"], x.get("heard"), x.get("text")) for x in transcript]
    assert episode.error is None and episode.end_reason == "caller_hung_up", heard
    # once seen failing on a loaded CI machine; what each side heard is the evidence
    assert episode.outcome == "pass", (session.metadata.get("checks"), heard)
    assert (
        episode.speech[:2]
        == [
            "DeepgramSTTService -> WhisperSTTService",
            "added VADProcessor(SileroVADAnalyzer) before the STT",
        ]
        or "DeepgramSTTService -> WhisperSTTService" in episode.speech
    )
    callers = [x for x in transcript if x["speaker"] == "caller"]
    agents = [x for x in transcript if x["speaker"] == "agent"]
    assert callers and agents
    # The agent's STT heard every caller line it answered (Whisper text, not the persona's own);
    # the hang-up line ("Thank you.") can still be in its STT when the caller drops the line.
    answered_lines = max(x["answers"] for x in agents)
    assert answered_lines >= 1 and all(x["heard"].strip() for x in callers[:answered_lines])
    assert "real person" in callers[0]["heard"].lower()
    # The agent's spoken text (its TTS) and what the caller's Whisper made of it.
    assert "bright smile" in agents[0]["text"].lower() and agents[0]["heard"].strip()
    # A heard gap per agent turn that answers a caller line, in the ledger's latency rows.
    answered = agents[1:]
    assert all(x["latency_ms"] is not None and x["latency_ms"] > 0 for x in answered)
    # ... and where it went: the agent's stages, adding up to it (VAD and TTS always take time).
    for x in answered:
        assert sum(x["stages_ms"].values()) == pytest.approx(x["latency_ms"], abs=0.5)
        assert x["stages_ms"]["endpointing_ms"] > 0 and x["stages_ms"]["tts_first_audio_ms"] > 0
    rows = ledger.latencies(session.id)
    assert [r.heard_gap_ms for r in rows] == [
        pytest.approx(x["latency_ms"], abs=0.01) for x in answered
    ]
    # Pipecat's own voice-to-voice figure where its pipeline measured one (a turn whose VAD stop
    # came after the bot began, on a loaded machine, has none: unknown, never a wrong figure);
    # the text-mode response gap never in an audio call.
    figures = [(r.heard_gap_ms, r.v2v_ms, r.response_gap_ms) for r in rows]
    assert all(r.response_gap_ms is None for r in rows), figures
    assert any(r.v2v_ms is not None for r in rows), figures
    assert all(r.v2v_ms > 0 for r in rows if r.v2v_ms is not None), figures
    assert episode.call_s and episode.duration_s < 3 * episode.call_s + 10


CLINIC_PACK = ROOT / "examples" / "clinic" / "world.py"


THANKS_THEN_BYE = (
    '{when: ".", say: "Thank you very much.", times: 2}',
    '{when: ".", say: "Goodbye.", end_call: true}',
)


def _scenario(
    tmp_path: Path,
    name: str = "delay_probe",
    opening: str = "I would like to check my booking.",
    rules: tuple[str, ...] = THANKS_THEN_BYE,
) -> Path:
    path = tmp_path / f"{name}.yaml"
    path.write_text(
        textwrap.dedent(
            """
            name: NAME
            persona: A caller checking a booking.
            goal: Check the booking, then hang up.
            success: The agent answered.
            max_turns: 4
            script:
              opening: OPENING
              rules:
            RULES
            """
        )
        .replace("NAME", name)
        .replace("OPENING", opening)
        .replace("RULES", "\n".join(f"    - {rule}" for rule in rules))
        # a world to verify (the gate pairs verified runs only): nothing may change in it
        + f"world: {{pack: {CLINIC_PACK}, state: {{patients: [{{id: 1, name: Maria Lopez}}]}}}}\n"
        + "verify:\n  - unchanged: [patients]\n"
    )
    return path


@pytest.mark.slow
@pytest.mark.shares_machine
@pytest.mark.integration
async def test_a_known_agent_delay_moves_the_heard_gap_by_that_much(tmp_path, no_keys):
    scenario = _scenario(tmp_path)
    gaps, v2v, stages = {}, {}, {}
    for name, entry in (("fast", f"{BOTS}:run_bot"), ("slow", f"{BOTS}:run_bot_delayed")):
        report, ledger = await _simulate([scenario], entry, tmp_path / f"{name}.db")
        (episode,) = report.episodes
        assert episode.error is None, episode.error
        rows = ledger.latencies(episode.session_id)
        assert len(rows) >= 2, [vars(x) for x in episode.transcript]
        assert all(r.heard_gap_ms is not None for r in rows)
        gaps[name] = statistics.median(r.heard_gap_ms for r in rows)
        v2v[name] = statistics.median(r.v2v_ms for r in rows if r.v2v_ms is not None)
        split = [x.stages_ms for x in episode.transcript if x.latency_ms is not None]
        stages[name] = {k: statistics.median(s[k] for s in split) for k in split[0]}
    # Each edge lands on a 20 ms audio frame on each clock, and a loaded 2-core runner adds
    # event-loop lag (CI once moved the gap by 378 ms for the 400 planted). A figure taken from
    # the wrong edge is wrong by a whole stage (hundreds of ms: STT, TTS, the delay itself).
    tolerance_ms = 50.0
    moved = gaps["slow"] - gaps["fast"]
    assert abs(moved - audio_bots.DELAY_S * 1000) <= tolerance_ms, (gaps, v2v)
    # The in-agent figure is reported beside it and sees the same delay (its own clock).
    assert abs(v2v["slow"] - v2v["fast"] - audio_bots.DELAY_S * 1000) <= tolerance_ms, (gaps, v2v)
    # The stages put the delay where the bot added it: between its VAD stop and its audio.
    delta = {k: stages["slow"][k] - stages["fast"][k] for k in stages["fast"]}
    assert abs(delta["tts_first_audio_ms"] - audio_bots.DELAY_S * 1000) <= tolerance_ms, stages
    others = [v for k, v in delta.items() if k != "tts_first_audio_ms"]
    assert all(abs(v) <= tolerance_ms for v in others), stages


def _slow_ear(persona_ear, delay_s: float):
    """The persona's STT, answering each segment `delay_s` late (Whisper on a busy machine)."""

    def build(name):
        service = persona_ear(name)
        run_stt = service.run_stt

        async def late(audio: bytes):
            await asyncio.sleep(delay_s)
            async for frame in run_stt(audio):
                yield frame

        service.run_stt = late
        return service

    return build


@pytest.mark.slow
@pytest.mark.shares_machine
@pytest.mark.integration
@pytest.mark.parametrize("ear_delay_s", [0.0, 1.5], ids=["ear", "slow_ear"])
async def test_a_reply_that_stalls_between_sentences_is_heard_as_one_turn(
    tmp_path, no_keys, monkeypatch, ear_delay_s
):
    # What failed on a loaded CI machine: the caller took a pause inside the agent's greeting
    # (its TTS starved between sentences, or the caller's Whisper late with the second one) for
    # the end of the turn, matched no rule on half a greeting and hung up.
    monkeypatch.setattr(
        audio_episode, "persona_ear", _slow_ear(audio_episode.persona_ear, ear_delay_s)
    )
    rules = ('{when: "help", say: "Goodbye.", end_call: true}',)
    scenario = _scenario(tmp_path, "stall_probe", rules=rules)
    report, _ = await _simulate([scenario], f"{BOTS}:run_bot_stalling", tmp_path / "l.db")
    (episode,) = report.episodes
    heard = [(x.speaker, x.heard, x.text) for x in episode.transcript]
    assert episode.error is None and episode.end_reason == "caller_hung_up", heard
    callers = [x.text for x in episode.transcript if x.speaker == "caller"]
    assert callers == ["I would like to check my booking.", "Goodbye."], heard
    (agent,) = [x for x in episode.transcript if x.speaker == "agent"]
    assert "one moment" in agent.heard.lower() and "help" in agent.heard.lower(), heard
    assert agent.text == f"{audio_bots.REPLY} {audio_bots.QUESTION}"


async def test_a_keyed_service_without_its_key_is_a_clear_error(tmp_path, no_keys):
    config = SimulationConfig(persona="scripted", mode="audio", stt="deepgram")
    with pytest.raises(ConfigError, match="DEEPGRAM_API_KEY"):
        await _simulate([POOL / "handoff_request.yaml"], EXPERT, tmp_path / "l.db", config)


@pytest.mark.slow
@pytest.mark.shares_machine
@pytest.mark.integration
async def test_an_audio_gate_gates_p95_on_the_heard_gap(tmp_path, no_keys):
    from pipecat_rl.gate.config import GateConfig
    from pipecat_rl.gate.evaluate import evaluate
    from pipecat_rl.gate.inputs import load_ledger_runs
    from pipecat_rl.gate.lineage import base_lineage

    openings = {
        "delay_booking": "I would like to check my booking.",
        "delay_time": "What time is my appointment on Friday?",
        "delay_hours": "Are you open on Saturday mornings?",
    }
    paths = []
    for name, opening in openings.items():
        path = _scenario(tmp_path, name, opening)
        path.write_text(path.read_text() + "split: heldout\n")
        paths.append(path)
    ledger = Ledger(tmp_path / "gate.db")
    scenarios = load_scenarios(paths)
    for policy, entry in (("slow", "run_bot_late"), ("fast", "run_bot")):
        config = SimulationConfig(
            persona="scripted", mode="audio", adapter=policy, source="gate", repeats=2,
            concurrency=3,
        )  # fmt: skip  # a call per scenario at once: 12 calls one by one took 230 s
        report = await simulate(scenarios, load_bot(f"{BOTS}:{entry}"), config, ledger)
        assert all(e.error is None for e in report.episodes), [e.error for e in report.episodes]
    data = load_ledger_runs(ledger, "slow", "fast", source="gate")
    assert all(r.channel == "audio" and r.heard_gap_ms for r in data.runs)
    # A budget the slow bot's every heard gap is over (each carries the planted delay, plus the
    # caller's end of speech), so even its P95's lower bound from a dozen turns is. Not one read
    # off the fast bot: one late frame on a loaded CI box once put its max at 1,220 ms.
    budget = audio_bots.LATE_S * 1000
    receipt = evaluate(
        data,
        GateConfig(resamples=10_000, p95_budget_ms=budget),
        base_lineage("slow"),
        base_lineage("fast"),
    )
    latency = receipt.latency
    assert latency.gated_on == "heard_gap" and latency.in_agent_v2v_p95 is not None
    difference = latency.v2v_p95.difference
    # Not held to the planted 2 s: beside a training run (both cores busy) it came out at
    # 1,380 ms [1,345, 1,604], the undelayed bot's heard gap growing with the load more than the
    # delayed one's. How far a delay moves the heard gap, on a machine as busy as CI's, is
    # `test_a_known_agent_delay_moves_the_heard_gap_by_that_much`'s to hold.
    assert 0 < difference.low <= difference.estimate <= difference.high, difference
    checks = {c.name: c for c in receipt.checks}
    budget_check = checks["p95_budget"]
    assert budget_check.status == "fail" and "heard gap P95" in budget_check.detail, budget_check
    # 2 s slower than a 100 ms margin. Paired over 3 scenarios, the interval's low end is the
    # smallest scenario's difference: with 400 ms planted, one 300 ms stall of the fast bot in one
    # scenario (a loaded CI runner) once made this `uncertain`.
    assert checks["p95_vs_incumbent"].status == "fail", checks["p95_vs_incumbent"]
    # The fast bot within a generous budget: a dozen turns cannot bound a P95 from above.
    reverse = evaluate(
        dataclasses.replace(data, candidate="fast", incumbent="slow"),
        GateConfig(resamples=10_000, p95_budget_ms=60_000),
        base_lineage("fast"),
        base_lineage("slow"),
    )
    (budget_check,) = [c for c in reverse.checks if c.name == "p95_budget"]
    assert budget_check.status == "uncertain" and "too few turns" in budget_check.detail


def test_a_text_gate_says_it_has_no_voice_to_voice_evidence():
    from pipecat_rl.gate.config import GateConfig
    from pipecat_rl.gate.evaluate import evaluate
    from pipecat_rl.gate.inputs import GateData, InputSource, RunResult
    from pipecat_rl.gate.lineage import base_lineage

    runs = tuple(
        RunResult(scenario=f"s{i}", policy=p, run=0, reward=1.0, channel="text")
        for i in range(4)
        for p in ("cand", "inc")
    )
    data = GateData(
        candidate="cand", incumbent="inc", runs=runs, source=InputSource(kind="ledger", path="mem")
    )
    receipt = evaluate(data, GateConfig(), base_lineage("cand"), base_lineage("inc"))
    assert any("no voice-to-voice evidence" in n for n in receipt.notes)
    checks = {c.name: c for c in receipt.checks}
    assert checks["p95_budget"].status == "unavailable"
    assert "no voice" in checks["p95_budget"].detail
    assert checks["llm_ttft_ratio"].status == "uncertain"  # text mode gates the LLM stages


@pytest.mark.slow
@pytest.mark.shares_machine
@pytest.mark.integration
def test_cli_text_and_audio_report_the_channel_gap(tmp_path, no_keys):
    import json

    from typer.testing import CliRunner

    from pipecat_rl.cli import app

    page = tmp_path / "gap.html"
    args = [
        "simulate", str(POOL / "handoff_request.yaml"), "--bot", EXPERT, "--persona", "scripted",
        "--no-server", "--mode", "text,audio", "--json", "--ledger", str(tmp_path / "l.db"),
        "--gap-html", str(page),
    ]  # fmt: skip
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    out = json.loads(result.stdout[result.stdout.index("{") :])
    assert out["text"]["episodes"][0]["mode"] == "text"
    assert out["audio"]["episodes"][0]["mode"] == "audio"
    labels = [row["label"] for row in out["channel_gap"]["labels"]]
    assert labels == ["misheard_slot", "tool_error", "dead_loop", "unauthorised_write"]
    assert page.is_file() and "Channel gap" in page.read_text()
    ledger = Ledger(tmp_path / "l.db")
    sessions = ledger.sessions()
    assert sorted(s.metadata["mode"] for s in sessions) == ["audio", "text"]
    text_session = next(s for s in sessions if s.metadata["mode"] == "text")
    rows = ledger.latencies(text_session.id)
    assert rows and all(r.response_gap_ms is not None and r.heard_gap_ms is None for r in rows)


@pytest.mark.parametrize(
    "heard",
    [
        "It's DX-48213-77065.",
        "DX 48213 77065.",
        "It's DX48,213-77,065.",  # Whisper's thousands commas
        "D-X four eight two one three seven seven zero six five",
        "DX 4 8 2 1 3 7 7 0 6 5",
    ],
)
def test_the_expert_reads_a_confirmation_number_as_an_stt_writes_it(heard):
    import inspect

    expert = inspect.getmodule(load_bot(EXPERT).fn)
    assert expert.confirmation_number(heard) == "DX-48213-77065"
    assert expert.confirmation_number("It's DX48,230-77,065.") == "DX-48230-77065"  # misheard
    assert expert.confirmation_number("I need to cancel my appointment.") is None


def test_webrtc_without_audio_is_refused_plainly(tmp_path):
    from typer.testing import CliRunner

    from pipecat_rl.cli import app

    args = ["simulate", str(POOL / "handoff_request.yaml"), "--bot", EXPERT, "--transport",
            "webrtc", "--no-server", "--ledger", str(tmp_path / "l.db")]  # fmt: skip
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 64 and "webrtc carries speech" in result.output
