"""What the agent said reads as it was said: one joining rule for the recorder and simulators.

A transcript showed "Certainly.May I have your name?" for two spoken sentences (issue 38): the
recorder glued the TTS's sentence frames with "". Pipecat marks each text frame with whether it
carries its own spaces; `join_spoken` follows that mark, and the recorder's `spoken_text`, the
text simulator's caller and the audio simulator's transcript all use it. Each case here is a
real Pipecat `TTSService` in one of the shapes users' TTS services push text in: a sentence per
frame, a word per frame (word timestamps), token streaming (whose second sentence starts with
its space), and Chinese a character per frame, marked as carrying its own spacing (none), as
ElevenLabs and Cartesia report it.
"""

import pytest
from pipecat.frames.frames import (
    Frame,
    LLMFullResponseEndFrame,
    LLMFullResponseStartFrame,
    LLMTextFrame,
    TTSAudioRawFrame,
)
from pipecat.services.settings import TTSSettings
from pipecat.services.tts_service import TextAggregationMode, TTSService
from pipecat.tests.utils import run_test

from pipecat_rl.recording.spoken import join_spoken

SAID = "Certainly. May I have your name?"
TOKENS = ["Cert", "ainly", ".", " May", " I", " have", " your", " name", "?"]
"""How an LLM streams `SAID`: the spaces ride on the tokens."""
SAID_CJK = "好的。请问您叫什么名字？"
TOKENS_CJK = ["好的", "。", "请问", "您", "叫", "什么", "名字", "？"]


class FakeTTS(TTSService):
    """A TTS service that speaks a beat of silence per text and reports text as it was told.

    `words`: report each word with a timestamp (Pipecat's word-timestamp path) instead of the
    whole sentence once played; `characters`: report each character, marked as carrying its
    own spacing (none), as ElevenLabs and Cartesia do for Chinese and Japanese.
    """

    def __init__(self, *, words: bool = False, characters: bool = False, **kwargs):
        super().__init__(
            sample_rate=16000,
            push_text_frames=not (words or characters),
            settings=TTSSettings(model=None, voice=None, language=None),
            **kwargs,
        )
        self._words, self._characters = words, characters

    async def run_tts(self, text: str, context_id: str):
        """One frame of silence, then the words it was told (on the word-timestamp path)."""
        yield TTSAudioRawFrame(b"\0\0" * 1600, 16000, 1, context_id=context_id)
        if self._words or self._characters:
            words = list(text.strip()) if self._characters else text.split()
            await self.add_word_timestamps(
                [(w, 0.01 * i) for i, w in enumerate(words)],
                context_id,
                includes_inter_frame_spaces=self._characters or None,
                pre_merge_tokens=self._characters,  # "的", "。" -> "的。", as Cartesia does
            )


TTS_SHAPES = {
    "sentences": (dict(), TOKENS, SAID),
    "words": (dict(words=True), TOKENS, SAID),
    "token streaming": (dict(text_aggregation_mode=TextAggregationMode.TOKEN), TOKENS, SAID),
    "characters": (dict(characters=True), TOKENS_CJK, SAID_CJK),
}
"""How each shape of TTS is built, what the LLM streams to it, and what the caller heard."""


@pytest.mark.parametrize(
    ("parts", "joined"),
    [
        ([("Certainly.", False), ("May I have your name?", False)], SAID),
        ([("Certainly.", False), (" May I have your name?", False)], SAID),
        ([("Cert", True), ("ainly.", True), (" May", True), (" I", True)], "Certainly. May I"),
        ([("Sure, ", True), ("one moment.", True), ("Hello.", False)], "Sure, one moment. Hello."),
        ([("Hello.", False), ("", False), ("Bye.", True)], "Hello. Bye."),
        ([("Hi", False), ("[interrupted]", False)], "Hi [interrupted]"),
        ([("好的。", False), ("请问您叫什么名字？", False)], "好的。请问您叫什么名字？"),
        ([("はい。", False), ("お名前は？", False)], "はい。お名前は？"),
        ([("네.", False), ("이름이 뭐예요?", False)], "네. 이름이 뭐예요?"),
        ([("감사합니다", False), ("다음", False)], "감사합니다 다음"),
    ],
)
def test_join_spoken_spaces_where_frames_do_not_carry_their_own(parts, joined):
    assert join_spoken(parts) == joined


@pytest.mark.parametrize("shape", TTS_SHAPES)
async def test_the_recorder_keeps_the_spaces_between_what_the_tts_said(tmp_path, shape):
    from pipecat_rl.ledger import Ledger
    from pipecat_rl.recording import RLRecorder
    from tests.fake_openai import serve_fake_openai
    from tests.recording_helpers import Call, vllm_llm

    tts, tokens, said = TTS_SHAPES[shape]
    path = tmp_path / "calls.db"
    recorder = RLRecorder(path, call_id="spaced")
    async with serve_fake_openai(tokens, vllm=True) as url:
        async with Call([recorder], llm=vllm_llm(url), after=[FakeTTS(**tts)]) as call:
            await call.say("Hello?", limit_s=30)
    await recorder.flush()
    with Ledger(path) as ledger:
        (turn,) = ledger.turns("spaced")
    assert turn.generated_text == said
    assert turn.spoken_text == said


def _reply(tokens: list[str]) -> list[Frame]:
    return [LLMFullResponseStartFrame(), *map(LLMTextFrame, tokens), LLMFullResponseEndFrame()]


@pytest.mark.parametrize("shape", TTS_SHAPES)
async def test_the_text_simulators_caller_hears_what_the_tts_said_spaced_alike(shape):
    from pipecat.pipeline.pipeline import Pipeline

    from pipecat_rl.simulator.transport import _PairOutput

    tts, tokens, said = TTS_SHAPES[shape]
    heard: list[str] = []
    output = _PairOutput(lambda text, first: heard.append(text))
    await run_test(Pipeline([FakeTTS(**tts), output]), frames_to_send=_reply(tokens))
    assert heard == [said]


@pytest.mark.parametrize("shape", TTS_SHAPES)
async def test_the_audio_simulators_transcript_spaces_what_the_tts_said_alike(shape):
    from pipecat.observers.base_observer import FramePushed
    from pipecat.processors.frame_processor import FrameDirection

    from pipecat_rl.simulator.audio.transport import AgentHearingObserver, AudioTransportPair

    tts, tokens, said = TTS_SHAPES[shape]
    service = FakeTTS(**tts)
    down, _ = await run_test(service, frames_to_send=_reply(tokens))
    pair = AudioTransportPair()
    observer = AgentHearingObserver(pair)
    output = pair.agent.output()  # where the agent's TTS text enters its output transport
    for frame in down:
        pushed = FramePushed(service, output, frame, FrameDirection.DOWNSTREAM, 0)
        await observer.on_push_frame(pushed)
    assert pair.agent_turn_heard("(what the caller's STT heard)")
    assert pair.transcript[-1].text == said
