"""Channel perturbations (seeded, measurable) and what low SNR does to digit-heavy slots."""

import asyncio

import numpy as np
import pytest

from pipecat_rl.scenarios.scenario import Channel
from pipecat_rl.simulator.audio.channel import (
    FRAME_SAMPLES,
    SAMPLE_RATE,
    ChannelPerturbation,
    mulaw_round_trip,
)
from pipecat_rl.simulator.rewards import _misheard, _norm

DIGIT_SLOTS = [
    "DX-48213-77065", "1984-03-12", "1961-01-20", "BSD-0001-00012", "KR-30917-55208",
    "My number is 0161 496 0832.", "Confirmation 72 61 94.", "DX-90455-13087",
]  # fmt: skip
"""Slots of the clinic's digit-heavy scenarios (confirmation numbers, dates of birth, phones)."""


def _tone(seconds: float = 1.0, amplitude: float = 6000.0) -> bytes:
    t = np.arange(int(SAMPLE_RATE * seconds)) / SAMPLE_RATE
    return (amplitude * np.sin(2 * np.pi * 220 * t)).astype(np.int16).tobytes()


def _db(signal: np.ndarray, noise: np.ndarray) -> float:
    return 10 * np.log10(np.mean(signal**2) / np.mean(noise**2))


def test_noise_is_mixed_at_the_requested_snr_and_is_seeded():
    clean = np.frombuffer(_tone(), np.int16).astype(float)
    for snr in (20.0, 5.0, -5.0):
        noisy, mask = ChannelPerturbation(Channel(mode="audio", snr_db=snr), seed=3)(_tone())
        got = np.frombuffer(noisy, np.int16).astype(float)
        assert _db(clean, got - clean) == pytest.approx(snr, abs=0.3)
        assert all(mask) and len(mask) == len(clean) // FRAME_SAMPLES
    again = ChannelPerturbation(Channel(mode="audio", snr_db=5.0), seed=3)(_tone())[0]
    other = ChannelPerturbation(Channel(mode="audio", snr_db=5.0), seed=4)(_tone())[0]
    assert again == ChannelPerturbation(Channel(mode="audio", snr_db=5.0), seed=3)(_tone())[0]
    assert again != other


def test_packet_loss_zeroes_whole_frames_at_the_rate():
    pcm = _tone(10.0)
    lossy, _ = ChannelPerturbation(Channel(mode="audio", packet_loss=0.2), seed=1)(pcm)
    frames = np.frombuffer(lossy, np.int16).reshape(-1, FRAME_SAMPLES)
    lost = np.mean(np.all(frames == 0, axis=1))
    assert lost == pytest.approx(0.2, abs=0.04)


def test_telephony_band_limits_to_4_khz_and_keeps_speech_band():
    t = np.arange(SAMPLE_RATE) / SAMPLE_RATE
    low = 8000 * np.sin(2 * np.pi * 1000 * t)
    high = 8000 * np.sin(2 * np.pi * 6000 * t)
    assert np.std(mulaw_round_trip(high)) < 0.05 * np.std(high)  # above Nyquist of 8 kHz
    out = mulaw_round_trip(low)
    assert np.corrcoef(out[200:-200], low[200:-200])[0, 1] > 0.99  # mu-law keeps the tone


def test_speaking_rate_changes_duration():
    fast, mask = ChannelPerturbation(Channel(mode="audio", speaking_rate=1.25), seed=0)(_tone(2))
    assert len(fast) // 2 == pytest.approx(2 * SAMPLE_RATE / 1.25, abs=2)
    assert len(mask) == pytest.approx(len(fast) // 2 / FRAME_SAMPLES, abs=1)


def test_spoken_digits_spelled_names_and_dates_are_not_mishearings():
    assert not _misheard("nine one one four two", "91142")
    assert not _misheard("M-A-R-I-A L-O-P-E-Z", "Maria Lopez")
    assert not _misheard("March 12th, 1984", "1984-03-12")
    assert _misheard("DX-48230-77065", "DX-48213-77065")
    assert _norm("It's DX 48213 77065") != _norm("DX-48213-77065")


def _heard_rate(snr_db: float | None, seed: int = 7) -> float:
    """Share of digit slots Whisper mishears after Piper speaks them down this channel."""
    from faster_whisper import WhisperModel
    from piper import PiperVoice

    from pipecat_rl.simulator.audio.services import PIPER_VOICE, piper_voice_dir, whisper_model_dir

    voice = PiperVoice.load(piper_voice_dir() / f"{PIPER_VOICE}.onnx")
    model = WhisperModel(str(whisper_model_dir()), device="cpu", compute_type="int8")
    channel = Channel(mode="audio", snr_db=snr_db)
    perturb = ChannelPerturbation(channel, seed=seed)
    import soxr

    wrong = 0
    for slot in DIGIT_SLOTS:
        pcm = b"".join(c.audio_int16_bytes for c in voice.synthesize(slot))
        audio = np.frombuffer(pcm, np.int16).astype(np.float32)
        audio16 = soxr.resample(audio, voice.config.sample_rate, SAMPLE_RATE)
        pcm16 = audio16.astype(np.int16).tobytes()
        if channel.perturbed:
            pcm16, _ = perturb(pcm16)
        heard_audio = np.frombuffer(pcm16, np.int16).astype(np.float32) / 32768.0
        segments, _ = model.transcribe(heard_audio, language="en")
        heard = " ".join(s.text for s in segments)
        wrong += _norm(slot) not in _norm(heard)
    return wrong / len(DIGIT_SLOTS)


@pytest.mark.slow
@pytest.mark.shares_machine
def test_low_snr_raises_the_misheard_rate_on_digit_slots():
    # Measured here: 4/8 slots misheard clean (Whisper tiny's digit formatting), 7/8 at 5 dB,
    # 8/8 at 0 dB; the channel model is seeded, so this is a fixed comparison, not a timing.
    clean, noisy = _heard_rate(None), _heard_rate(0.0)
    assert noisy >= clean + 0.25, (clean, noisy)


@pytest.mark.slow
@pytest.mark.shares_machine
def test_the_windowed_whisper_hears_what_pipecats_does_for_a_fraction_of_the_cpu():
    import time

    import soxr
    from faster_whisper import WhisperModel
    from piper import PiperVoice

    from pipecat_rl.simulator.audio.services import PIPER_VOICE, piper_voice_dir, whisper_model_dir
    from pipecat_rl.simulator.audio.whisper import WindowedWhisperSTTService

    voice = PiperVoice.load(piper_voice_dir() / f"{PIPER_VOICE}.onnx")
    full = WhisperModel(str(whisper_model_dir()), device="cpu", compute_type="int8")
    windowed = WindowedWhisperSTTService(model_dir=whisper_model_dir())

    def segment(text: str, silence_s: float = 0.5) -> np.ndarray:
        pcm = b"".join(c.audio_int16_bytes for c in voice.synthesize(text))
        rate = voice.config.sample_rate
        speech = soxr.resample(np.frombuffer(pcm, np.int16) / 32768.0, rate, SAMPLE_RATE)
        pad = np.zeros(int(silence_s * SAMPLE_RATE))
        return np.concatenate([pad, speech, pad]).astype(np.float32)  # as a VAD segment is

    lines = ["I want to talk to a real person, please.", "My name is Tom Baker."]
    spent = {"full": 0.0, "windowed": 0.0}
    for text in lines:
        audio = segment(text)
        started = time.process_time()
        segments, _ = full.transcribe(audio, language="en")  # what Pipecat's service calls
        heard_full = " ".join(s.text.strip() for s in segments)
        spent["full"] += time.process_time() - started
        started = time.process_time()
        heard = windowed.transcribe(audio)
        spent["windowed"] += time.process_time() - started
        assert heard == heard_full == text
    assert spent["windowed"] < 0.6 * spent["full"], spent  # measured: about a quarter
    assert windowed.transcribe(np.zeros(3 * SAMPLE_RATE, np.float32)) == ""
    long = np.concatenate([segment(lines[0], 1.0), np.zeros(30 * SAMPLE_RATE), segment(lines[1])])
    heard_long = windowed.transcribe(long.astype(np.float32))  # past Whisper's own 30 s window
    assert "real person" in heard_long and "Tom Baker" in heard_long


def _episodes(labels_per_episode):
    from types import SimpleNamespace

    return [SimpleNamespace(outcome="fail", labels=labels) for labels in labels_per_episode]


def test_the_channel_gap_is_rate_per_label_and_difference():
    from pipecat_rl.simulator.audio.gap import channel_gap

    text = _episodes([[], [], ["tool_error"], []])
    audio = _episodes([["misheard_slot"], ["misheard_slot", "tool_error"], [], []])
    audio.append(type(audio[0])(outcome="error", labels=["misheard_slot"]))  # not counted
    gap = channel_gap(text, audio)
    rows = {r.label: r for r in gap.labels}
    assert (gap.text_episodes, gap.audio_episodes) == (4, 4)
    assert (rows["misheard_slot"].text_rate, rows["misheard_slot"].audio_rate) == (0.0, 0.5)
    assert rows["misheard_slot"].difference == 0.5
    assert rows["tool_error"].difference == 0.0 and rows["dead_loop"].audio_rate == 0.0
    assert list(rows) == ["misheard_slot", "tool_error", "dead_loop", "unauthorised_write"]


def test_the_channel_gap_page_renders_in_headless_chromium(tmp_path):
    from tests.chromium import CHROMIUM, render

    if CHROMIUM is None:
        pytest.skip("needs chromium")
    from pipecat_rl.simulator.audio.gap import channel_gap, write_gap_page

    gap = channel_gap(_episodes([[], ["tool_error"]]), _episodes([["misheard_slot"], []]))
    page = write_gap_page(gap, tmp_path / "gap.html")
    shot, dom, console = render(page, tmp_path, size=(1000, 700))
    assert not console
    assert "Channel gap" in dom and "misheard_slot" in dom and "+50 pp" in dom
    # The orange audio bar of misheard_slot is drawn (not a blank page); pixels are 0..1 floats.
    r, g, b = shot[..., 0], shot[..., 1], shot[..., 2]
    orange = (r > 0.8) & (g > 0.4) & (g < 0.63) & (b < 0.43)
    assert orange.sum() > 200


def test_the_heard_gap_runs_from_the_callers_last_voiced_frame_to_the_agents_first():
    from pipecat_rl.simulator.audio.transport import FRAME_S, HeardLatencyMeter

    meter = HeardLatencyMeter()
    meter.agent_frame(True, 0.1)  # the greeting answers no caller line: no gap
    meter.caller_line(0)
    for i in range(50):
        meter.caller_frame(True, i * FRAME_S)
    for i in range(50, 80):
        meter.caller_frame(False, i * FRAME_S)
        meter.agent_frame(False, i * FRAME_S)
    meter.agent_frame(True, 1.5)
    meter.agent_frame(True, 1.52)  # only the first voiced frame counts
    assert meter.gaps_ms == {0: pytest.approx(500.0)}


def test_a_heard_gap_splits_into_stages_that_add_up_to_it():
    from pipecat_rl.simulator.audio.stages import StageTimeline
    from pipecat_rl.simulator.audio.transport import HeardLatencyMeter

    timeline = StageTimeline()
    meter = HeardLatencyMeter(on_gap=timeline.heard)
    timeline.clock(100.05, 0.0)  # an observer that ran 50 ms behind the push ...
    timeline.clock(100.0, 0.0)  # ... and one that did not: the pipeline clock is 100 s behind
    for line, start in ((0, 1.0), (1, 5.0)):
        meter.caller_line(line)
        timeline.caller_line(line)
        timeline.agent("tts_audio", start - 100.0 - 0.5)  # the tail of the previous reply
        meter.caller_frame(True, start)  # its voice ends at start + 20 ms
        timeline.agent("vad_stop", start - 100.0 + 0.1)  # a pause inside the line
        timeline.agent("vad_stop", start - 100.0 + 0.3)  # the line's end: the latest counts
        timeline.agent("stt_final", start - 100.0 + 0.7)
        if line == 0:
            timeline.agent("turn_end", start - 100.0 + 0.75)
        timeline.agent("reply", start - 100.0 + 0.8)
        timeline.agent("tts_audio", start - 100.0 + 1.0)
        timeline.agent("tts_audio", start - 100.0 + 1.05)  # later chunks: the first counts
        timeline.agent("bot_started", start - 100.0 + 1.02)
        meter.agent_frame(True, start + 1.1)
    first = timeline.stage_ms(0)
    assert first == pytest.approx(
        {
            "endpointing_ms": 280.0,
            "stt_ms": 400.0,
            "turn_ms": 50.0,
            "reply_ms": 50.0,
            "tts_first_audio_ms": 200.0,
            "playout_ms": 20.0,
            "transport_ms": 80.0,
        }
    )
    assert sum(first.values()) == pytest.approx(meter.gaps_ms[0])
    second = timeline.stage_ms(1)  # no turn analyzer: its share is folded into the reply's
    assert second["turn_ms"] == 0.0 and second["reply_ms"] == pytest.approx(100.0)
    assert sum(second.values()) == pytest.approx(meter.gaps_ms[1])
    assert timeline.stage_ms(2) is None


async def test_embedded_speech_settings_reach_the_tasks_started_in_their_block():
    from pipecat_rl.simulator.audio.services import (
        EmbeddedSpeech,
        current_speech,
        embedded_speech,
    )

    async def built() -> EmbeddedSpeech:
        return current_speech()

    chosen = EmbeddedSpeech(whisper_window_s=10.0)
    with embedded_speech(chosen):
        inside = await asyncio.create_task(built())
    assert inside == chosen
    assert await asyncio.create_task(built()) == EmbeddedSpeech()


async def test_a_mouth_paces_speech_then_silence_at_20_ms():
    import asyncio
    import time

    from pipecat_rl.simulator.audio.transport import SILENCE, Mouth, frames_of

    got: list[tuple[bytes, float]] = []
    enough = asyncio.Event()

    async def deliver(pcm: bytes, at: float) -> None:
        got.append((pcm, at))
        if len(got) >= 30:
            enough.set()

    mouth = Mouth(deliver)
    speech = frames_of(_tone(0.4))  # 20 frames
    mouth.queue(speech)
    started = time.monotonic()
    mouth.start()
    await asyncio.wait_for(enough.wait(), timeout=60)  # a hang guard only
    await mouth.stop()
    assert [pcm for pcm, _ in got[:20]] == speech and got[20][0] == SILENCE
    span = got[29][1] - got[0][1]
    # Paced: never faster than real time (an unpaced mouth hands 30 frames over in a millisecond).
    # Above it only by a loaded runner's lag, which the bound leaves room for.
    assert 29 * 0.02 - 0.005 <= span < 29 * 0.02 + 0.5, span
    assert got[0][1] - started < 0.5


def test_the_caller_hangs_up_after_its_line_and_a_second_of_quiet():
    from pipecat_rl.simulator.audio.transport import FRAME_S, AudioTransportPair

    pair = AudioTransportPair()
    pair.request_hang_up()
    pair.caller_speaking = True  # its goodbye is still on its way to the TTS
    for i in range(100):
        pair.caller_sent(False, i * FRAME_S)
    assert not pair.done.is_set()
    pair.caller_speaking = False
    pair.caller_sent(True, 2.0)  # the goodbye is played
    t = 2.0
    while not pair.done.is_set() and t < 4.0:
        t += FRAME_S
        pair.caller_sent(False, t)
    assert pair.end_reason == "caller_hung_up" and t == pytest.approx(3.02, abs=0.03)


@pytest.mark.parametrize(
    ("written", "spoken"),
    [
        ("It's DX-48213-77065.", "It's D X 4 8 2 1 3 7 7 0 6 5."),
        ("My number is 555-123-4567.", "My number is 5 5 5 1 2 3 4 5 6 7."),
        ("Call 5551234567 please", "Call 5 5 5 1 2 3 4 5 6 7 please"),
        # what a caller does not spell: years, short numbers, times, ISO dates
        ("Born in 1984, on 1984-03-12.", "Born in 1984, on 1984-03-12."),
        ("Slot 13 at 18:00.", "Slot 13 at 18:00."),
    ],
)
async def test_the_caller_reads_codes_and_long_numbers_character_by_character(written, spoken):
    from pipecat_rl.simulator.audio.spoken import read_codes_aloud

    assert await read_codes_aloud(written, "sentence") == spoken


async def test_an_audio_call_hands_the_bot_the_scenarios_context_after_it_connects():
    """Pipecat's harness sends `context:` once the bot is set up; so do both audio transports."""
    from pipecat.frames.frames import ClientConnectedFrame, Frame, LLMMessagesUpdateFrame
    from pipecat.pipeline.pipeline import Pipeline
    from pipecat.pipeline.worker import PipelineWorker
    from pipecat.processors.frame_processor import FrameProcessor
    from pipecat.workers.runner import WorkerRunner

    from pipecat_rl.simulator.audio.transport import AgentHearingObserver, AudioTransportPair

    pair = AudioTransportPair()
    pair.agent_context = [{"role": "user", "content": "I booked yesterday."}]
    seen: list[str] = []
    updated = asyncio.Event()

    class Seen(FrameProcessor):
        async def process_frame(self, frame: Frame, direction):
            await super().process_frame(frame, direction)
            if isinstance(frame, ClientConnectedFrame):
                seen.append("connected")
            elif isinstance(frame, LLMMessagesUpdateFrame):
                seen.append(frame.messages[0]["content"])
                updated.set()
            await self.push_frame(frame, direction)

    agent = pair.agent
    worker = PipelineWorker(
        Pipeline([agent.input(), Seen(), agent.output()]),
        observers=[AgentHearingObserver(pair)],
        cancel_on_idle_timeout=False,
    )

    @agent.event_handler("on_client_connected")
    async def greet(_transport, _client):
        seen.append("bot handler")

    runner = WorkerRunner(handle_sigint=False)
    await runner.add_workers(worker)
    run = asyncio.create_task(runner.run())
    pair.caller_connected.set()  # the caller dials in
    await asyncio.wait_for(updated.wait(), 60)  # hang guards only
    await worker.cancel()
    await asyncio.wait_for(run, 60)
    assert seen == ["bot handler", "connected", "I booked yesterday."]  # after the bot set up
