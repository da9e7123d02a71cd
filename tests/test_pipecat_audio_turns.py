"""Pipecat scripted turns played from recordings (`audio:`): loaded, checked, run in audio mode.

A recorded turn parses with its path resolved against the scenario file; a missing or
unreadable recording fails the load naming the file, the line and the field; text mode skips
the scenario saying to run it with --mode audio; what neither mode can send (DTMF, images) is
a skip naming the field. The slow test plays a Piper-made WAV to an agent that says back what
its Whisper heard, over the paced audio call.
"""

import re
import textwrap
from pathlib import Path

import numpy as np
import pytest
import soundfile
from pipecat.frames.frames import (
    LLMFullResponseEndFrame,
    LLMFullResponseStartFrame,
    LLMTextFrame,
    TTSSpeakFrame,
)
from pipecat.tests.utils import run_test

from pipecat_rl.errors import ScenarioError, UnsupportedScenarioError
from pipecat_rl.ledger import Ledger
from pipecat_rl.scenarios import load_scenario_file, load_scenarios
from pipecat_rl.scenarios.loading import runnable
from pipecat_rl.simulator import SimulationConfig, load_bot, simulate
from pipecat_rl.simulator.audio.recordings import RecordingFrame
from pipecat_rl.simulator.audio.transport import AudioTransportPair, CallerLineTap
from tests import audio_turn_bot
from tests.pipecat_helpers import SCENARIOS, logged_warnings

BOT = f"{Path(audio_turn_bot.__file__)}:run_bot"
RATE = 24000  # not the call's 16 kHz: the caller's output must resample it


def _tone(path: Path, seconds: float = 0.3) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    t = np.arange(int(RATE * seconds)) / RATE
    soundfile.write(path, (0.3 * np.sin(2 * np.pi * 440 * t) * 32767).astype(np.int16), RATE)
    return path


def _recorded(tmp_path: Path, audio: str = "clips/ask.wav", extra: str = "") -> Path:
    path = tmp_path / "recorded.yaml"
    path.write_text(
        textwrap.dedent(f"""\
            name: recorded
            user: {{modality: audio}}
            scenarios:
              - name: ask
                turns:
                  - user: "Book a table, please."
                    audio: {audio}
                    expect:
                      - {{event: response, text_contains: table}}
            """)  # fmt: skip
        + extra
    )
    return path


def test_a_recorded_turn_parses_with_its_path_resolved_against_the_file(tmp_path):
    wav = _tone(tmp_path / "clips" / "ask.wav")
    (scenario,), warned = logged_warnings(lambda: load_scenario_file(_recorded(tmp_path)))
    (turn,) = scenario.parsed_turns
    assert Path(turn.audio) == wav.resolve() and turn.user == "Book a table, please."
    assert "user.modality" not in warned  # a recording is what `modality: audio` plays


def test_a_missing_recording_fails_the_load_naming_the_file_and_the_field(tmp_path):
    path = _recorded(tmp_path, audio="clips/gone.wav")
    with pytest.raises(ScenarioError) as failed:
        load_scenarios([path])
    message = str(failed.value)
    assert f"{path}: line 7: scenarios.0.turns.0.audio: no such audio file" in message
    assert str((tmp_path / "clips" / "gone.wav").resolve()) in message


def test_a_file_that_is_not_audio_fails_the_load(tmp_path):
    (tmp_path / "clips").mkdir()
    (tmp_path / "clips" / "ask.wav").write_text("not a recording")
    with pytest.raises(ScenarioError, match=r"scenarios\.0\.turns\.0\.audio: not an audio file"):
        load_scenarios([_recorded(tmp_path)])


async def test_text_mode_skips_a_recorded_scenario_saying_to_run_it_in_audio(tmp_path):
    _tone(tmp_path / "clips" / "ask.wav")
    recorded = _recorded(tmp_path)
    both = load_scenarios([recorded, SCENARIOS / "scripted.yaml"])
    kept, warned = logged_warnings(lambda: runnable(both, "text"))
    assert [s.id for s in kept] == ["scripted_capital/two_turns"]
    assert f"skipped {recorded}: recorded/ask: turn 1 plays a recording" in warned
    assert "run with --mode audio" in warned
    assert len(runnable(both, "audio")) == 2
    only = load_scenarios([recorded])
    with pytest.raises(ScenarioError, match="run with --mode audio"):  # before any episode
        await simulate(only, load_bot(BOT), SimulationConfig(), Ledger(tmp_path / "l.db"))


@pytest.mark.parametrize(
    ("turn", "field"),
    [('{dtmf: "1"}', "`dtmf:` (keypresses)"), ('{user: "Look", image: cat.png}', "`image:`")],
)
def test_what_neither_mode_can_send_is_a_skip_naming_the_field(tmp_path, turn, field):
    path = tmp_path / "cannot.yaml"
    path.write_text(f"name: cannot\nscenarios:\n  - name: one\n    turns:\n      - {turn}\n")
    with pytest.raises(UnsupportedScenarioError, match=re.escape(f"turn 1 uses {field}")):
        load_scenario_file(path)


def test_pauses_text_mode_cannot_keep_are_a_warning(tmp_path):
    _tone(tmp_path / "clips" / "ask.wav")
    pausing = """\
              - name: pausing
                turns:
                  - user: ["So I", {pause_ms: 800}, "would like a table."]
    """
    path = _recorded(tmp_path, extra=textwrap.indent(textwrap.dedent(pausing), "  "))
    path.write_text(path.read_text().replace("{modality: audio}", "{modality: audio, speech: {}}"))
    _, warned = logged_warnings(lambda: load_scenario_file(path))
    pauses = "recorded/pausing: turns.0.user: its pauses (`pause_ms:`) are kept in audio mode only"
    assert pauses in warned
    assert "user.speech: not used: turns without `audio:` are spoken by the channel's TTS" in warned


def _reply(text: str) -> list:
    said = [LLMTextFrame(text)] if text else []
    return [LLMFullResponseStartFrame(), *said, LLMFullResponseEndFrame()]


async def test_a_recorded_turn_goes_unspoken_and_its_recording_follows(tmp_path):
    wav = _tone(tmp_path / "ask.wav")
    opening = _tone(tmp_path / "hello.wav", seconds=0.1)
    pair = AudioTransportPair()
    pair.caller_line("Hello.")  # the opening line, as the caller's input says it
    down, _ = await run_test(
        CallerLineTap(pair, {1: str(opening), 3: str(wav)}),
        frames_to_send=[
            TTSSpeakFrame("Hello."),
            *_reply(""),  # waiting: no line, so the next reply still says turn 2
            *_reply("Two."),
            *_reply("Book a table."),
        ],
    )
    played = [f for f in down if isinstance(f, RecordingFrame)]
    assert [(f.path, f.sample_rate) for f in played] == [(str(opening), RATE), (str(wav), RATE)]
    assert len(played[1].audio) == 2 * int(RATE * 0.3)  # 16-bit mono, every sample
    texts = [f for f in down if isinstance(f, LLMTextFrame)]
    assert [(f.text, f.skip_tts) for f in texts] == [("Two.", None), ("Book a table.", True)]
    assert not any(isinstance(f, TTSSpeakFrame) for f in down)  # the opening was not spoken
    assert [line.text for line in pair.transcript] == ["Hello.", "Two.", "Book a table."]


def _piper_wav(path: Path, text: str) -> Path:
    """`text` spoken by the packaged Piper voice, written at `RATE` (not Piper's own 22.05 kHz)."""
    import soxr
    from piper import PiperVoice

    from pipecat_rl.simulator.audio.services import PIPER_VOICE, piper_voice_dir

    voice = PiperVoice.load(piper_voice_dir() / f"{PIPER_VOICE}.onnx")
    pcm = b"".join(chunk.audio_int16_bytes for chunk in voice.synthesize(text))
    audio = np.frombuffer(pcm, dtype=np.int16).astype(np.float32)
    soundfile.write(
        path, soxr.resample(audio, voice.config.sample_rate, RATE).astype(np.int16), RATE
    )
    return path


@pytest.mark.slow
@pytest.mark.shares_machine
@pytest.mark.integration
async def test_a_recorded_turn_is_heard_by_the_agent_in_audio_mode(tmp_path, monkeypatch):
    for key in ("DEEPGRAM_API_KEY", "CARTESIA_API_KEY", "OPENAI_API_KEY", "OPENAI_BASE_URL"):
        monkeypatch.delenv(key, raising=False)
    # The recording says more than its `user:` text: only a played recording puts "tonight"
    # in the agent's ears (a synthesised `user:` line would not).
    _piper_wav(tmp_path / "booking.wav", "Please book a table for tonight.")
    path = tmp_path / "booking.yaml"
    path.write_text(textwrap.dedent("""\
        name: booking
        user: {modality: audio, speech: {service: piper}}
        scenarios:
          - name: table
            turns:
              - user: "Book a table, please."
                audio: booking.wav
                expect:
                  - {event: response, text_contains: tonight}
              - user: "Thank you, goodbye."
                expect:
                  - {event: response, text_contains: bye}  # Whisper writes "goodbye" or "Good bye"
    """))  # fmt: skip
    config = SimulationConfig(persona="scripted", mode="audio", concurrency=1)
    ledger = Ledger(tmp_path / "l.db")
    report = await simulate(load_scenarios([path]), load_bot(BOT), config, ledger)
    (episode,) = report.episodes
    assert episode.error is None, episode.error
    callers = [line for line in episode.transcript if line.speaker == "caller"]
    assert [line.text for line in callers] == ["Book a table, please.", "Thank you, goodbye."]
    assert "tonight" in callers[0].heard.lower(), callers  # Whisper heard the recording
    assert "bye" in callers[1].heard.lower(), callers  # and Piper's spoken turn
    assert episode.reward_parts["metric:turn1.1.llm_response"] == 1.0, episode.reward_parts
    assert episode.outcome == "pass" and episode.end_reason == "caller_hung_up"
    session = ledger.session(episode.session_id)
    heard = [x["heard"] for x in session.metadata["transcript"] if x["speaker"] == "caller"]
    assert "tonight" in heard[0].lower()
