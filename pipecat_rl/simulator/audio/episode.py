"""Audio mode for one episode: the agent's speech slots, the persona's ear and mouth.

Agent side (`agent_speech_swap`): the bot's own STT and TTS are kept when they run offline
(Whisper, Piper, ...); others (Deepgram, Cartesia, ...) are stood in for by the embedded
Whisper / Piper, or by the keyed service the scenario's `channel` (or a flag) names. The bot's
VAD and turn settings (its user aggregator's analyzer, smart-turn strategy) are left as they
are; only when the pipeline has no VAD at all (a bot that relied on Deepgram's endpointing) is
Pipecat's `VADProcessor` with Silero put in front of the stand-in Whisper, which cuts segments
on VAD events.

Persona side (`persona_audio_stages`): Silero VAD -> STT (`persona_ear`) -> `PersonaHearing`
before the persona's turn logic, and `CallerLineTap` -> TTS after its LLM; the TTS reads codes
and long numbers character by character, as a caller does (`spoken`). A scripted scenario's
recorded turns (`audio:`) are played instead of being spoken (`recordings`), and the caller's
turn-taking moves (barge-ins, backchannels, side speech, pauses: a scripted scenario's turns',
a `script:` rule's, `caller:`) are timed by `moves`.

With `record_audio` (`--record-audio DIR`) the call is also written, both sides on one clock,
to a stereo WAV in that folder (`recorder`), closed with the episode.
"""

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from pipecat.audio.vad.silero import SileroVADAnalyzer
from pipecat.pipeline.pipeline import Pipeline
from pipecat.processors.aggregators.llm_response_universal import LLMUserAggregator
from pipecat.processors.audio.vad_processor import VADProcessor
from pipecat.processors.frame_processor import FrameProcessor
from pipecat.services.stt_service import SegmentedSTTService, STTService
from pipecat.services.tts_service import TTSService

from pipecat_rl.compat import user_aggregator_vad
from pipecat_rl.errors import ConfigError
from pipecat_rl.scenarios import Scenario
from pipecat_rl.scenarios.turns import recordings, spoken
from pipecat_rl.simulator.audio import check_recording
from pipecat_rl.simulator.audio.channel import ChannelPerturbation
from pipecat_rl.simulator.audio.moves import CallerMoves, pausing_lines
from pipecat_rl.simulator.audio.recorder import CallRecording, recording_path
from pipecat_rl.simulator.audio.services import (
    OFFLINE_STT,
    OFFLINE_TTS,
    SttName,
    TtsName,
    persona_ear,
    piper_voice_dir,
    require_key,
    stand_in_stt,
    tts_service,
    whisper_model_dir,
)
from pipecat_rl.simulator.audio.spoken import read_codes_aloud
from pipecat_rl.simulator.audio.transport import (
    AgentHearingObserver,
    AudioTransportPair,
    CallerLineTap,
    PersonaHearing,
)
from pipecat_rl.simulator.botloader import Episode


@dataclass(frozen=True)
class SpeechChoice:
    """Which STT and TTS stand in for online services, and speak and hear for the persona."""

    stt: SttName = "whisper"
    tts: TtsName = "piper"

    @classmethod
    def for_scenario(
        cls, scenario: Scenario, stt: SttName | None = None, tts: TtsName | None = None
    ) -> "SpeechChoice":
        """A flag wins over the scenario's `channel` block, which wins over the embedded pair."""
        return cls(
            stt=stt or scenario.channel.stt or "whisper",
            tts=tts or scenario.channel.tts or "piper",
        )

    def check_keys(self) -> None:
        """A `ConfigError` naming the variable of any keyed service that has no key."""
        for name in (self.stt, self.tts):
            if name in ("deepgram", "cartesia"):
                require_key(name)


def _has_vad(root: FrameProcessor) -> bool:
    if isinstance(root, VADProcessor):
        return True
    if isinstance(root, LLMUserAggregator) and user_aggregator_vad(root) is not None:
        return True
    return any(_has_vad(child) for child in root.processors)


@dataclass
class AgentSpeech:
    """Builds the swap for one bot worker; `notes` says what was stood in for or added."""

    choice: SpeechChoice
    notes: list[str] = field(default_factory=list)
    _needs_vad: bool = True

    def for_pipeline(self, pipeline: Pipeline) -> "AgentSpeech":
        """Look at the bot's pipeline once, before swapping."""
        self._needs_vad = not _has_vad(pipeline)
        return self

    def __call__(self, processor: FrameProcessor) -> list[FrameProcessor]:
        """What stands where `processor` (an STT or TTS service) stood."""
        name = type(processor).__name__
        if isinstance(processor, STTService):
            stt = processor if name in OFFLINE_STT else stand_in_stt(self.choice.stt)
            if stt is not processor:
                self.notes.append(f"{name} -> {type(stt).__name__}")
            if self._needs_vad:
                self._needs_vad = False
                self.notes.append("added VADProcessor(SileroVADAnalyzer) before the STT")
                return [VADProcessor(vad_analyzer=SileroVADAnalyzer()), stt]
            return [stt]
        if isinstance(processor, TTSService):
            if name in OFFLINE_TTS:
                return [processor]
            tts = tts_service(self.choice.tts)
            self.notes.append(f"{name} -> {type(tts).__name__}")
            return [tts]
        raise ConfigError(f"not a speech service: {name}")  # the walker only passes STT/TTS


def persona_audio_stages(
    pair: AudioTransportPair,
    choice: SpeechChoice,
    recorded: Mapping[int, str | tuple[str | int, ...]] | None = None,
) -> tuple[list[FrameProcessor], list[FrameProcessor]]:
    """The persona's ear (before its turn logic) and mouth (after its LLM).

    `recorded` (caller line number -> file, or text and pauses) are the turns played whole,
    not spoken by the TTS.
    """
    ear = persona_ear(choice.stt)
    hearing: list[FrameProcessor] = [
        VADProcessor(vad_analyzer=SileroVADAnalyzer()),
        ear,
        PersonaHearing(pair, text_per_segment=isinstance(ear, SegmentedSTTService)),
    ]
    mouth = tts_service(choice.tts, text_transforms=[("*", read_codes_aloud)])
    speaking: list[FrameProcessor] = [CallerLineTap(pair, recorded), mouth]
    return hearing, speaking


@dataclass
class AudioEpisode:
    """The audio parts of one episode: the pair, the agent's speech swap, the persona's stages."""

    pair: AudioTransportPair
    choice: SpeechChoice
    agent_speech: AgentSpeech
    recorded: dict[int, str | tuple[str | int, ...]] = field(default_factory=dict)
    """A scripted scenario's recorded turns (caller line -> file) and lines said with pauses
    (-> their text and pauses), played whole instead of spoken by the TTS."""
    recording: CallRecording | None = None
    """`--record-audio`: the call's WAV, written as the call goes (`recorder`)."""
    _wav: Path | None = field(default=None, init=False, repr=False)

    @classmethod
    def build(
        cls,
        scenario: Scenario,
        seed: int,
        *,
        stt: SttName | None = None,
        tts: TtsName | None = None,
        transport: Literal["local", "webrtc"] = "local",
        agent_params: Any = None,
        record_audio: Path | None = None,
        repeat: int = 0,
        session_id: str = "",
        bot_url: str | None = None,
    ) -> "AudioEpisode":
        """The episode's audio call, with the scenario's channel perturbations seeded by `seed`.

        `transport="webrtc"` carries it over SmallWebRTC on loopback, the agent's transport built
        with `agent_params` (the bot's own `transport_params["webrtc"]`, if it has one).
        `record_audio`: a folder to write the call's WAV in, named for the scenario, `repeat`
        and `session_id` (`recorder.recording_path`). `bot_url`: the call goes to a bot running
        there (`simulator.remote`), and the pair is the caller's side only.
        """
        choice = SpeechChoice.for_scenario(scenario, stt, tts)
        channel = scenario.channel
        perturb = None
        if channel.perturbed:
            noise_file = None
            if channel.background_noise:
                base = scenario.source_path.parent if scenario.source_path else Path.cwd()
                noise_file = base / channel.background_noise
            perturb = ChannelPerturbation(channel, seed, noise_file=noise_file)
        if bot_url is not None:
            from pipecat_rl.simulator.remote import call_pair

            pair: AudioTransportPair = call_pair(
                bot_url, max_turns=scenario.max_turns, perturb=perturb
            )
        elif transport == "webrtc":
            from pipecat_rl.simulator.audio.webrtc import WebRTCAudioPair

            pair = WebRTCAudioPair(
                max_turns=scenario.max_turns, perturb=perturb, agent_params=agent_params
            )
        else:
            pair = AudioTransportPair(max_turns=scenario.max_turns, perturb=perturb)
        if record_audio is not None:
            path = recording_path(record_audio, scenario.id, repeat, session_id)
            pair.recording = CallRecording(path)
        turns = scenario.parsed_turns or []
        moves = CallerMoves.of(scenario)
        pair.moves = moves if moves.any else None
        return cls(
            pair=pair,
            choice=choice,
            agent_speech=AgentSpeech(choice),
            recorded={**pausing_lines(turns), **recordings(spoken(turns))},
            recording=pair.recording,
        )

    def adapt(self, episode: Episode) -> None:
        """Keep the bot's speech services (or stand in for them) and listen to its STT."""
        episode.bypass_speech = False
        episode.speech_swap = self.agent_speech.for_pipeline
        episode.observers.append(AgentHearingObserver(self.pair))

    def persona_stages(self) -> tuple[list[FrameProcessor], list[FrameProcessor]]:
        """The persona's ear and mouth."""
        return persona_audio_stages(self.pair, self.choice, self.recorded)

    def finish_recording(self) -> str | None:
        """Close the call's WAV (idempotent): its path, or None if none was written."""
        if self.recording is not None:
            self.pair.recording = None  # a frame still in flight is not written
            self._wav = self.recording.close()
            self.recording = None
        return None if self._wav is None else str(self._wav)

    async def close(self) -> None:
        """Let go of the call's connections, if it holds any (WebRTC's peers); close its WAV."""
        await self.pair.close()
        self.finish_recording()


def check_audio(
    scenarios: Iterable[Scenario],
    *,
    stt: SttName | None = None,
    tts: TtsName | None = None,
    transport: Literal["local", "webrtc"] = "local",
    record_audio: Path | None = None,
) -> None:
    """A `ConfigError` now for a missing model, key or WebRTC stack, not a failed call later.

    So is a `record_audio` folder that cannot be written (`check_recording`).
    """
    check_recording(["audio"], record_audio)
    if transport == "webrtc":
        from pipecat_rl.simulator.audio.webrtc import require_webrtc

        require_webrtc()
    whisper_model_dir()
    piper_voice_dir()
    for scenario in scenarios:
        SpeechChoice.for_scenario(scenario, stt, tts).check_keys()
