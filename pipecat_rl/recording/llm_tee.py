"""Token-exact capture of an OpenAI-compatible LLM service's calls, by teeing its stream.

Pipecat's `BaseOpenAILLMService` streams chat completions and throws away what vLLM returns
beyond text: `prompt_token_ids`, each chunk's sampled `token_ids` and per-token logprobs. We wrap
two methods of the service *instance*: `build_chat_completion_params`, to ask vLLM for those
(only when the server is vLLM: other providers reject unknown fields), and
`get_chat_completions`, to hand the service a stream that yields the very same chunk objects,
in the same order and at the same time, while it copies what it needs. The bot sees no change.

The parameters of a request are handed from the one method to the other in a context variable
owned by the streaming call's task, never on the service: Pipecat's own non-streaming inference
(context summaries) builds its parameters with the same method, possibly at the same time.
"""

import asyncio
import json
import time
from collections.abc import AsyncIterator, Callable
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any

import httpx
from loguru import logger
from pipecat.services.openai.base_llm import BaseOpenAILLMService

from pipecat_rl import compat
from pipecat_rl.serving.server import llm_api_key

_VLLM_PROBES: dict[str, bool] = {}


@dataclass
class LLMCall:
    """Everything one chat completion produced, as the server returned it."""

    request: dict[str, Any]
    started_at: float
    token_ids_requested: bool
    first_token_at: float | None = None
    done_at: float | None = None
    prompt_token_ids: list[int] | None = None
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    text_parts: list[str] = field(default_factory=list)
    tool_calls: dict[int, dict[str, Any]] = field(default_factory=dict)
    finish_reason: str | None = None
    usage: dict[str, int] = field(default_factory=dict)
    error: str | None = None
    settling: asyncio.Task | None = None
    """Work that completes the call after its stream closed (the Responses tee's re-score)."""

    @property
    def text(self) -> str:
        """The generated text (content deltas joined)."""
        return "".join(self.text_parts)

    @property
    def token_exact(self) -> bool:
        """True when the server gave prompt ids, one logprob per sampled id, and usage agrees.

        A sampled-id count that differs from `usage.completion_tokens` means chunks were lost
        or merged, so the ids are not the sample.
        """
        counted = self.usage.get("completion_tokens")
        return (
            self.token_ids_requested
            and bool(self.prompt_token_ids)
            and bool(self.token_ids)
            and len(self.token_ids) == len(self.logprobs)
            and (counted is None or counted == len(self.token_ids))
        )

    def add(self, chunk: Any) -> None:
        """Copy what one streamed chunk carries."""
        if self.prompt_token_ids is None:
            prompt_ids = getattr(chunk, "prompt_token_ids", None)
            if prompt_ids:
                self.prompt_token_ids = list(prompt_ids)
        if chunk.usage:
            self.usage = {
                "prompt_tokens": chunk.usage.prompt_tokens,
                "completion_tokens": chunk.usage.completion_tokens,
            }
        if not chunk.choices:
            return
        choice = chunk.choices[0]
        ids = getattr(choice, "token_ids", None)
        if ids:
            if self.first_token_at is None:
                self.first_token_at = time.time()
            self.token_ids.extend(ids)
        if choice.logprobs and choice.logprobs.content:
            self.logprobs.extend(t.logprob for t in choice.logprobs.content)
        delta = choice.delta
        if delta is not None:
            if delta.content:
                if self.first_token_at is None:
                    self.first_token_at = time.time()
                self.text_parts.append(delta.content)
            for call in delta.tool_calls or ():
                entry = self.tool_calls.setdefault(
                    call.index, {"id": None, "name": "", "arguments": ""}
                )
                if call.id:
                    entry["id"] = call.id
                if call.function and call.function.name:
                    entry["name"] += call.function.name
                if call.function and call.function.arguments:
                    entry["arguments"] += call.function.arguments
        if choice.finish_reason:
            self.finish_reason = choice.finish_reason


class _TeeStream:
    """Yields the wrapped stream's chunks unchanged, copying each into an `LLMCall`."""

    def __init__(self, stream: Any, call: LLMCall, done: Callable[[LLMCall], None]):
        self._stream = stream
        self._call = call
        self._done = done

    def __aiter__(self) -> AsyncIterator[Any]:
        return self._chunks()

    async def _chunks(self) -> AsyncIterator[Any]:
        try:
            async for chunk in self._stream:
                try:
                    self._call.add(chunk)
                except Exception as e:  # never let capture break the stream
                    self._call.error = f"capture failed: {e}"
                yield chunk
        except BaseException as e:
            # A consumer that stops after the sample ended (cancelled while it handled the final
            # event, or closing instead of reading the stream's end) cut nothing: the ids are whole.
            if self._call.finish_reason is None:
                self._call.error = self._call.error or type(e).__name__
            raise
        finally:
            self._call.done_at = time.time()
            try:
                self._done(self._call)
            except Exception as e:
                logger.error(f"pipecat-rl: recording an LLM call failed: {e}")

    async def close(self) -> None:
        """Close the underlying HTTP stream."""
        await self._stream.close()


def _jsonable(params: dict[str, Any]) -> dict[str, Any]:
    """The request as sent: openai's NOT_GIVEN/omit markers dropped, the rest copied via JSON."""
    sent = {
        k: v for k, v in params.items() if not type(v).__name__.startswith(("NotGiven", "Omit"))
    }
    return json.loads(json.dumps(sent, default=str))


@dataclass
class _TeeState:
    on_call: Callable[[LLMCall], None]
    token_ids: bool


@dataclass
class _Pending:
    """The parameters of the one streaming request its task is building."""

    task: asyncio.Task | None
    params: dict[str, Any] | None = None


_pending: ContextVar[_Pending | None] = ContextVar("pipecat_rl_llm_request", default=None)


def tee_state(llm: Any, on_call: Callable[[LLMCall], None], token_ids: bool) -> _TeeState | None:
    """A new tee's state on `llm`, or None when `llm` is teed already (its callback swapped)."""
    state: _TeeState | None = getattr(llm, "_pipecat_rl_tee", None)
    if state is not None:
        state.on_call, state.token_ids = on_call, token_ids
        return None
    llm._pipecat_rl_tee = _TeeState(on_call, token_ids)
    return llm._pipecat_rl_tee


def tee_llm_service(
    llm: BaseOpenAILLMService, on_call: Callable[[LLMCall], None], *, token_ids: bool
) -> None:
    """Capture every call `llm` makes; `on_call` gets each finished `LLMCall`.

    Installing twice only swaps the callback (a service re-used by a later call records into the
    later call's session).
    """
    state = tee_state(llm, on_call, token_ids)
    if state is None:
        return

    def wrap_build(build: Callable) -> Callable:
        def build_chat_completion_params(params_from_context: Any) -> dict:
            params = build(params_from_context)
            pending = _pending.get()
            if pending is None or pending.task is not _current_task():
                return params  # not our streaming request (e.g. Pipecat's own inference)
            if state.token_ids:
                params["logprobs"] = True
                params["extra_body"] = {
                    **(params.get("extra_body") or {}),
                    "return_token_ids": True,
                }
            pending.params = params
            return params

        return build_chat_completion_params

    def wrap_get(get: Callable) -> Callable:
        async def get_chat_completions(context: Any) -> Any:
            started = time.time()
            pending = _Pending(_current_task())
            token = _pending.set(pending)
            try:
                stream = await get(context)
            finally:
                _pending.reset(token)
            try:
                request = _jsonable(pending.params or {})
            except Exception as e:
                logger.error(f"pipecat-rl: could not copy the LLM request: {e}")
                request = {}
            call = LLMCall(request=request, started_at=started, token_ids_requested=state.token_ids)
            return _TeeStream(stream, call, state.on_call)

        return get_chat_completions

    compat.replace_method(llm, "build_chat_completion_params", wrap_build)
    compat.replace_method(llm, "get_chat_completions", wrap_get)


def _current_task() -> asyncio.Task | None:
    try:
        return asyncio.current_task()
    except RuntimeError:  # no running loop
        return None


async def serves_token_ids(llm: BaseOpenAILLMService) -> bool:
    """Whether `llm` talks to a vLLM server (which returns token ids); probed once per URL.

    The probe sends the service's own API key, else the project's (`PIPECAT_RL_LLM_API_KEY`).
    """
    base_url = compat.llm_base_url(llm)
    if base_url not in _VLLM_PROBES:
        key = compat.llm_api_key(llm)
        key = key if key and key != "none" else llm_api_key()
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        try:
            async with httpx.AsyncClient(timeout=3.0) as client:
                response = await client.get(f"{base_url}/models", headers=headers)
            owners = {m.get("owned_by") for m in response.json().get("data", [])}
            _VLLM_PROBES[base_url] = "vllm" in owners
        except Exception as e:  # not cached: the server may just not be up yet
            # A call recorded as text cannot train: say so where an operator looks.
            logger.warning(
                f"pipecat-rl: {base_url} did not answer /models within 3 s ({e}); this call's "
                "turns are recorded as text only (no token ids, so they cannot train)"
            )
            return False
        if not _VLLM_PROBES[base_url]:
            logger.warning(
                f"pipecat-rl: {base_url} is not a vLLM server (its /models names no vllm owner): "
                "its turns are recorded as text only (no token ids, so they cannot train)"
            )
    return _VLLM_PROBES[base_url]
