"""Replaying a fork (`scenarios.fork`): the recorded turns forced, the caller's lines said again.

One `ForkRun` per episode holds the replay's state for both sides of the call:

- **the agent's side**: the bot's served LLM gets an OpenAI client whose HTTP transport stands
  in front of the server (`ForkRun.http_client`, installed by `botloader.point_llm`; the bot is
  not touched). Each streamed chat completion is a turn. Turns 1..at are answered from the
  recording, once the server's own `/tokenize` renders the request (messages and tools, under
  the served chat template) to exactly the recorded prompt ids. Turn at+1, the candidate's
  first, goes to the server once its request renders to the recorded context of that turn and
  the world shows exactly the changes the recorded tool calls made; later turns pass through.
  A forced turn streams no token ids or logprobs, so the recorder keeps it as text only: the
  fork's session trains only on what its own policy sampled.
- **the caller's side**: `ForkReplay`, in front of the persona's LLM, answers each agent line
  with the recorded caller's next line, verbatim (no ASR noise: the recording holds what the
  agent heard), until the candidate has the call; then the persona answers, its context
  holding the whole conversation so far.
- **the world**: the forced turns' tool calls run on the episode's fresh world (the pack's own
  tools), so replaying them restores it; a live call without a pack is served its recorded
  results instead (`world.fixtures_pack`).

Any difference (a prompt that renders otherwise, a world that differs) ends the call as a
harness error naming the turn (`ForkRun.problem`): a fork that does not reproduce its call is
never compared.
"""

import importlib
import json
import time
from collections.abc import Callable
from types import ModuleType
from typing import Any

import httpx
import openai
from loguru import logger
from pipecat.frames.frames import (
    Frame,
    LLMContextFrame,
    LLMFullResponseEndFrame,
    LLMFullResponseStartFrame,
    LLMTextFrame,
)
from pipecat.processors.frame_processor import FrameDirection, FrameProcessor

from pipecat_rl.scenarios.fork import ForcedTurn, ForkSpec
from pipecat_rl.serving.server import VLLMAdmin
from pipecat_rl.simulator.world import World

TOKENIZE_TIMEOUT_S = 60.0
"""How long the server gets to render one request's prompt (generous: a loaded 2-core box)."""


def _http_module() -> ModuleType:
    """The HTTP library the installed openai SDK speaks: httpx, or httpx2 from openai 3.

    The forcing transport must hand the SDK that library's own requests and responses.
    """
    client = next(c for c in openai.DefaultAsyncHttpxClient.__mro__ if c.__name__ == "AsyncClient")
    return importlib.import_module(client.__module__.partition(".")[0])


def _first_difference(a: list[int], b: list[int]) -> int:
    pairs = enumerate(zip(a, b, strict=False))
    return next((i for i, (x, y) in pairs if x != y), min(len(a), len(b)))


def forced_stream(turn: ForcedTurn, model: str, n: int) -> bytes:
    """A recorded turn as the server would stream it (one tool call per chunk, as vLLM does)."""
    head = {"id": f"fork-turn-{n}", "object": "chat.completion.chunk",
            "created": int(time.time()), "model": model}  # fmt: skip
    choices: list[dict[str, Any]] = [{"delta": {"role": "assistant", "content": turn.text}}]
    choices += [
        {"delta": {"tool_calls": [{"index": i, "id": call.id, "type": "function",
                                   "function": {"name": call.name, "arguments": call.arguments}}]}}
        for i, call in enumerate(turn.tool_calls)
    ]  # fmt: skip
    finish = turn.finish_reason or ("tool_calls" if turn.tool_calls else "stop")
    choices.append({"delta": {}, "finish_reason": finish})
    prompt, completion = len(turn.prompt_token_ids), len(turn.completion_token_ids)
    usage = {"prompt_tokens": prompt, "completion_tokens": completion,
             "total_tokens": prompt + completion}  # fmt: skip
    events = [{**head, "choices": [{"index": 0, "finish_reason": None, **c}]} for c in choices]
    events.append({**head, "choices": [], "usage": usage})
    return "".join(f"data: {json.dumps(e)}\n\n" for e in events).encode() + b"data: [DONE]\n\n"


class ForkRun:
    """One episode's replay of a fork: the turn count, the hand-off, and what went wrong."""

    def __init__(
        self,
        spec: ForkSpec,
        fork_id: str,
        *,
        world: World,
        llm_url: str | None,
        pair: Any,
        end_call: Callable[[], None],
    ):
        self.spec = spec
        self.fork_id = fork_id
        self.requests = 0
        """Streamed chat completions the agent has asked for: its turns so far."""
        self.problem: str | None = None
        self.world_at_handoff: dict[str, list[dict[str, Any]]] | None = None
        self._world = world
        self._admin = VLLMAdmin(llm_url) if llm_url else None
        self._pair = pair
        self._end_call = end_call
        self._noise = getattr(pair, "noise", None)
        if self._noise is not None:
            pair.noise = None  # the recorded lines are what the agent heard: said as they are
        self._said: set[int] = set()
        self.persona_has_call = False
        """Whether the persona has taken over the caller's side."""

    # -- the caller's side ------------------------------------------------------------------------

    @property
    def opening(self) -> str | None:
        """The line the caller opened the recorded call with, if it spoke first."""
        return self.spec.lines_before(1) or None

    def caller_line(self) -> str | None:
        """The recorded answer to the agent's line just heard ("" for none); None: the persona's.

        After turn c the recorded caller said what precedes turn c + 1; once the candidate has
        answered (or, at the hand-off, where the recording has nothing to say) the persona does.
        """
        after = self.requests
        line = self.spec.lines_before(after + 1) if after <= self.spec.at else ""
        if after < self.spec.at or (after == self.spec.at and line):
            if after in self._said:
                return ""  # a second agent line before its next turn: the caller said its line
            self._said.add(after)
            return line
        if not self.persona_has_call:
            self.persona_has_call = True
            if self._noise is not None:
                self._pair.noise = self._noise
        return None

    # -- the agent's side -------------------------------------------------------------------------

    def http_client(self) -> Any:
        """An HTTP client for the bot's OpenAI client: the forcing transport over the server's."""
        http = _http_module()
        return openai.DefaultAsyncHttpxClient(transport=_ForcingTransport(self, http))

    def fail(self, problem: str) -> None:
        """Record why the replay is not the recorded call (the first reason wins), end the call."""
        if self.problem is None:
            self.problem = problem
            logger.warning(problem)
        self._end_call()

    async def check(self, turn: int, body: dict[str, Any]) -> str | None:
        """Why turn `turn`'s request is not the recorded one, or None (see the module docstring)."""
        at = self.spec.at
        if turn == at + 1:
            self.world_at_handoff = self._world.snapshot()
            if (why := self._world_differs()) is not None:
                return why
        if turn > at + 1:
            return None
        expected = (
            self.spec.turns[turn - 1].prompt_token_ids
            if turn <= at
            else self.spec.next_prompt_token_ids
        )
        if expected is None:
            return None
        try:
            rendered = await self._render(body)
        except (httpx.HTTPError, ValueError, KeyError) as e:
            return (
                f"fork {self.fork_id}: turn {turn}: the server could not render the request "
                f"(/tokenize: {type(e).__name__}: {e}), so its context cannot be checked"
            )
        if rendered == expected:
            return None
        i = _first_difference(rendered, expected)
        return (
            f"fork {self.fork_id}: turn {turn}: the request renders under the served template to "
            f"{len(rendered)} tokens that differ from the recorded prompt's {len(expected)} from "
            f"token {i} (recorded {expected[i : i + 6]}, now {rendered[i : i + 6]}): the replay is "
            "not the recorded call (a served template or model other than the recording's, a "
            "tool result or bot prompt that changes between calls); fork the call against the "
            "server and bot it was recorded with"
        )

    def _world_differs(self) -> str | None:
        expected = self.spec.world_changes
        if expected is None:
            return None
        now = World.diff(self._world.initial, self.world_at_handoff or {})
        want = {t: c.model_dump(mode="json") for t, c in expected.items()}
        if json.dumps(now, sort_keys=True, default=str) == json.dumps(want, sort_keys=True):
            return None
        tables = sorted(t for t in set(now) | set(want) if now.get(t) != want.get(t))
        return (
            f"fork {self.fork_id}: the world after replaying turns 1..{self.spec.at} is not the "
            f"recorded one (tables {', '.join(tables)} differ): the pack or its initial rows "
            "changed, or a fault fired otherwise; the candidate would answer another world"
        )

    async def _render(self, body: dict[str, Any]) -> list[int]:
        """The prompt ids the server renders this chat request to (its `/tokenize`)."""
        if self._admin is None:
            raise ValueError("no served model to render the request (a fork needs one)")
        keys = ("model", "messages", "tools", "chat_template", "chat_template_kwargs",
                "add_generation_prompt", "continue_final_message")  # fmt: skip
        payload = {k: body[k] for k in keys if body.get(k) is not None}
        async with httpx.AsyncClient(timeout=TOKENIZE_TIMEOUT_S) as client:
            response = await client.post(
                f"{self._admin.root}/tokenize", json=payload, headers=self._admin.headers
            )
            response.raise_for_status()
        return [int(t) for t in response.json()["tokens"]]

    def report(self) -> dict[str, Any]:
        """What the session's metadata keeps of the replay."""
        return {
            "session": self.spec.session,
            "at": self.spec.at,
            "turns_forced": min(self.requests, self.spec.at),
            "candidate_answered": self.requests > self.spec.at,
            "world": self.world_at_handoff,
            "problem": self.problem,
        }

    def failure(self) -> str | None:
        """Why this episode is no replay of its fork: a difference, or no hand-off at all."""
        if self.problem is not None:
            return self.problem
        if self.requests <= self.spec.at:
            return (
                f"fork {self.fork_id}: the call ended after {self.requests} of the "
                f"{self.spec.at} forced turn(s), before the candidate answered: nothing to "
                "compare (is the bot's LLM a served OpenAI Chat service?)"
            )
        return None


class _ForcingTransport:
    """The HTTP transport of a forked bot's OpenAI client (see the module docstring)."""

    def __init__(self, run: ForkRun, http: ModuleType):
        self._run = run
        self._http = http
        self._inner = http.AsyncHTTPTransport()

    async def handle_async_request(self, request: Any) -> Any:
        """Answer or check a streamed chat completion; pass anything else on unchanged."""
        if request.method != "POST" or not request.url.path.endswith("/chat/completions"):
            return await self._inner.handle_async_request(request)
        body = json.loads(await request.aread())
        if not body.get("stream"):  # not a turn (the recorder tees streams only)
            return await self._inner.handle_async_request(request)
        run = self._run
        if request.headers.get("x-stainless-retry-count", "0") == "0":  # the SDK's retry: same turn
            run.requests += 1
        turn = run.requests
        problem = run.problem or await run.check(turn, body)
        if problem is not None:
            run.fail(problem)
            return self._http.Response(  # 400: a status the SDK does not retry
                400, json={"error": {"message": problem, "type": "fork_mismatch"}}, request=request
            )
        if turn <= run.spec.at:
            content = forced_stream(run.spec.turns[turn - 1], str(body.get("model")), turn)
            headers = {"content-type": "text/event-stream"}
            return self._http.Response(200, headers=headers, content=content, request=request)
        return await self._inner.handle_async_request(request)

    async def aclose(self) -> None:
        """Close the connections to the server."""
        await self._inner.aclose()


class ForkReplay(FrameProcessor):
    """The recorded caller, before the persona's LLM: its lines until the hand-off, then none.

    Until the candidate has the call (`ForkRun.caller_line`) it answers each agent line with the
    recorded one, as an LLM response comes out (so the persona's context keeps it); after, it
    lets the persona's LLM answer.
    """

    def __init__(self, run: ForkRun, **kwargs):
        super().__init__(**kwargs)
        self._run = run

    async def process_frame(self, frame: Frame, direction: FrameDirection):
        """Answer a persona turn with the recorded line, as an LLM response would come out."""
        await super().process_frame(frame, direction)
        if isinstance(frame, LLMContextFrame) and direction == FrameDirection.DOWNSTREAM:
            line = self._run.caller_line()
            if line is not None:
                await self.push_frame(LLMFullResponseStartFrame())
                if line:
                    await self.push_frame(LLMTextFrame(line))
                await self.push_frame(LLMFullResponseEndFrame())
                return
        await self.push_frame(frame, direction)
