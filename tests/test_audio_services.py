"""The embedded speech services as the simulator sets them up, on a machine too busy to keep up."""

import time

from pipecat.frames.frames import (
    ErrorFrame,
    LLMFullResponseEndFrame,
    LLMFullResponseStartFrame,
    LLMTextFrame,
    TTSAudioRawFrame,
    TTSStoppedFrame,
)
from pipecat.tests.utils import run_test

from pipecat_rl.simulator.audio.services import piper_tts

LINE = "Are you open on Saturday mornings?"
SLOW_S = 3.5
"""Longer than Pipecat's default wait for a TTS's audio (3 s): what a line took on a busy CPU."""


async def test_a_line_piper_synthesises_slowly_is_still_spoken_whole(monkeypatch):
    from piper import PiperVoice

    synthesize = PiperVoice.synthesize

    def slowly(self, *args, **kwargs):
        time.sleep(SLOW_S)  # Piper runs in a worker thread: this is its CPU starved
        yield from synthesize(self, *args, **kwargs)

    monkeypatch.setattr(PiperVoice, "synthesize", slowly)
    reply = [LLMFullResponseStartFrame(), LLMTextFrame(LINE), LLMFullResponseEndFrame()]
    down, up = await run_test(piper_tts(), frames_to_send=reply)

    assert not [f for f in [*down, *up] if isinstance(f, ErrorFrame)]  # "completed with no audio"
    audio = [i for i, f in enumerate(down) if isinstance(f, TTSAudioRawFrame)]
    seconds = sum(len(down[i].audio) for i in audio) / 2 / down[audio[0]].sample_rate
    assert seconds > 1.0, seconds  # the whole line, not a fragment
    stops = [i for i, f in enumerate(down) if isinstance(f, TTSStoppedFrame)]
    assert len(stops) == 1 and stops[0] > audio[-1]  # one utterance, closed after its audio
