"""Token-exact capture of an OpenAI Responses-API service's calls against vLLM.

`OpenAIResponsesHttpLLMService` (the Pipecat Flows default, served over HTTP) opens each streaming
request with `_create_stream(params)`. We replace that method on the instance: it asks vLLM for
the token ids (`enable_response_messages`, only when the server is vLLM: others reject the field)
and hands the service a stream of the very same events while it copies them (`llm_tee`'s tee).

vLLM's Responses stream carries the prompt ids and every sampled id (the stop token included) on
its final event, but logprobs only for tokens that decode to text: the stop token and every token
of a tool call have none. So once the stream has closed, one `/v1/completions` request to the same
server and model (adapter) re-scores prompt + sampled ids (`prompt_logprobs`), which gives the
sampler's logprobs for every id. It runs as its own task: the service has already moved on, so
the bot's reply waits for nothing. The call's `settling` is that task; a turn whose re-score
fails is recorded as text only.

The recorded request is the Chat-Completions view of the Responses request (`chat_view`): the
messages and tools vLLM builds from `instructions`, `input` and `tools` before it applies the chat
template, so transcripts, OPSD hints and the guard's template check read these turns as they read
chat turns. The request as sent is kept under `request["responses"]`.
"""

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from loguru import logger

from pipecat_rl import compat
from pipecat_rl.recording.demonstration import DemonstrationSource
from pipecat_rl.recording.llm_tee import LLMCall, _jsonable, _TeeStream, tee_state

RESCORE_TIMEOUT_S = 60.0
"""How long one re-score may take before its turn is recorded as text only."""


@dataclass
class ResponsesCall(LLMCall):
    """One Responses-API call, filled from its stream's events; logprobs come from the re-score."""

    def add(self, event: Any) -> None:
        """Copy what one streamed event carries."""
        kind = getattr(event, "type", None)
        if kind == "response.output_text.delta":
            self._first_token()
            self.text_parts.append(event.delta)
        elif kind in ("response.output_item.added", "response.output_item.done"):
            item = event.item
            if getattr(item, "type", None) != "function_call":
                return
            self._first_token()
            entry = self.tool_calls.setdefault(
                event.output_index, {"id": None, "name": "", "arguments": ""}
            )
            entry["id"], entry["name"] = item.call_id, item.name
            if kind == "response.output_item.done" or item.arguments:
                entry["arguments"] = item.arguments
        elif kind == "response.function_call_arguments.delta":
            if event.output_index in self.tool_calls:
                self.tool_calls[event.output_index]["arguments"] += event.delta
        elif kind == "response.function_call_arguments.done":
            if event.output_index in self.tool_calls:
                self.tool_calls[event.output_index]["arguments"] = event.arguments
        elif kind in ("response.completed", "response.incomplete"):
            self._final(event.response)
        elif kind == "response.failed":
            error = event.response.error
            self.error = f"response failed: {error.message if error else 'no reason given'}"
        elif kind == "error":
            self.error = f"response error: {event.message}"

    def _first_token(self) -> None:
        if self.first_token_at is None:
            self.first_token_at = time.time()

    def _final(self, response: Any) -> None:
        usage = response.usage
        if usage is not None:
            self.usage = {
                "prompt_tokens": usage.input_tokens,
                "completion_tokens": usage.output_tokens,
            }
        if response.status == "incomplete":
            details = response.incomplete_details
            reason = details.reason if details else None
            self.finish_reason = "length" if reason in (None, "max_output_tokens") else reason
        else:
            self.finish_reason = "tool_calls" if self.tool_calls else "stop"
        # vLLM's extra fields (kept by the SDK): one raw prompt and one raw completion for a
        # plain sample; anything else (Harmony messages, several rounds) is not one sample.
        prompt = _raw_tokens(getattr(response, "input_messages", None))
        sampled = _raw_tokens(getattr(response, "output_messages", None))
        if prompt is not None and sampled is not None:
            self.prompt_token_ids, self.token_ids = prompt, sampled


def _raw_tokens(messages: Any) -> list[int] | None:
    """The ids of vLLM's `[{"type": "raw_message_tokens", "tokens": [...]}]`, if just one."""
    if not isinstance(messages, list) or len(messages) != 1:
        return None
    (message,) = messages
    tokens = message.get("tokens") if isinstance(message, dict) else None
    if not isinstance(tokens, list) or not all(isinstance(t, int) for t in tokens):
        return None
    return tokens


# -- the Chat-Completions view ------------------------------------------------------------------


def chat_view(params: dict[str, Any]) -> dict[str, Any]:
    """A Responses request as the Chat-Completions request vLLM renders it as.

    `model`, `messages`, `tools` and the sampling settings under their chat names (max tokens as
    `max_tokens`); `extra_body` as sent; the whole request as sent under `responses`.
    """
    sent = _jsonable(params)
    view: dict[str, Any] = {
        "model": sent.get("model"),
        "messages": chat_messages(sent.get("instructions"), sent.get("input")),
    }
    tools = chat_tools(sent.get("tools"))
    if tools:
        view["tools"] = tools
    for name, chat_name in _SAMPLING:
        if name in sent:
            view[chat_name] = sent[name]
    view["responses"] = sent
    return view


_SAMPLING = (
    ("temperature", "temperature"),
    ("top_p", "top_p"),
    ("max_output_tokens", "max_tokens"),
    ("stream", "stream"),
    ("extra_body", "extra_body"),
)


def chat_messages(instructions: str | None, items: Any) -> list[dict[str, Any]]:
    """Chat messages from Responses `instructions` and `input`, as vLLM builds them.

    As vLLM's `construct_input_messages`: the instructions become the system message; a
    `function_call` joins the assistant message before it (or opens one); its output becomes a
    `tool` message; an assistant text fills an open tool-call message's content. Then, as vLLM
    does for a chat template that has no `developer` role (most have none), `developer` messages
    become `system` ones, merged into one at the front.
    """
    messages: list[dict[str, Any]] = []
    if instructions:
        messages.append({"role": "system", "content": instructions})
    if isinstance(items, str):
        messages.append({"role": "user", "content": items})
        items = []
    for item in items or ():
        last = messages[-1] if messages and messages[-1].get("role") == "assistant" else None
        kind = item.get("type")
        if kind == "function_call":
            call = {
                "id": item.get("call_id"),
                "function": {"name": item.get("name"), "arguments": item.get("arguments")},
                "type": "function",
            }
            if last is not None:
                last.setdefault("tool_calls", []).append(call)
            else:
                messages.append({"role": "assistant", "tool_calls": [call]})
        elif kind == "function_call_output":
            messages.append(
                {"role": "tool", "content": item.get("output"), "tool_call_id": item.get("call_id")}
            )
        elif item.get("role") == "assistant":
            content = item.get("content")
            text = content[0].get("text") if isinstance(content, list) and content else content
            if last is not None and last.get("content") is None:
                last["content"] = text
            else:
                messages.append({"role": "assistant", "content": text})
        elif "role" in item:
            messages.append({k: v for k, v in item.items() if k != "type"})
    if any(m["role"] == "developer" for m in messages):
        messages = _developer_as_system(messages)
    return messages


def _developer_as_system(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """As vLLM's `_convert_developer_to_system`, then its `_consolidate_system_messages`."""
    messages = [{**m, "role": "system"} if m["role"] == "developer" else m for m in messages]
    systems = [i for i, m in enumerate(messages) if m["role"] == "system"]
    if systems in ([], [0]):
        return messages
    contents = []
    for i in systems:
        content = messages[i].get("content") or ""
        if isinstance(content, list):
            content = "\n".join(
                p["text"] if isinstance(p, dict) else p
                for p in content
                if isinstance(p, str) or (isinstance(p, dict) and "text" in p)
            )
        if content:
            contents.append(content)
    rest = [m for m in messages if m["role"] != "system"]
    return [{"role": "system", "content": "\n\n".join(contents)}, *rest]


def chat_tools(tools: Any) -> list[dict[str, Any]]:
    """Responses function tools `{type, name, description, parameters}` as chat tools.

    As vLLM dumps them for the chat template: `description` present (None when absent), `strict`
    only when set; other tool types (built-in, MCP) are not function tools and are left out.
    """
    out = []
    for tool in tools or ():
        if tool.get("type") != "function":
            continue
        function = {
            "name": tool.get("name"),
            "description": tool.get("description"),
            "parameters": tool.get("parameters"),
        }
        if tool.get("strict") is not None:
            function["strict"] = tool["strict"]
        out.append({"type": "function", "function": function})
    return out


# -- the tee and the re-score -------------------------------------------------------------------


def tee_responses_service(llm: Any, on_call: Callable[[LLMCall], None], *, token_ids: bool) -> None:
    """Capture every streamed call `llm` (an `OpenAIResponsesHttpLLMService`) makes.

    `on_call` gets each `ResponsesCall` when its stream closes, with its re-score (if any) still
    running as `call.settling`. Installing twice only swaps the callback, as `tee_llm_service`.
    """
    state = tee_state(llm, on_call, token_ids)
    if state is None:
        return

    def wrap(create: Callable) -> Callable:
        async def _create_stream(params: dict) -> Any:
            started, asked = time.time(), state.token_ids
            if asked:
                extra = {**(params.get("extra_body") or {}), "enable_response_messages": True}
                params = {**params, "extra_body": extra}
            stream = await create(params)
            try:
                request = chat_view(params)
            except Exception as e:
                logger.error(f"pipecat-rl: could not copy the Responses request: {e}")
                request = {}
            call = ResponsesCall(request=request, started_at=started, token_ids_requested=asked)
            callback = state.on_call
            return _TeeStream(stream, call, lambda done: _settle(llm, done, callback))

        return _create_stream

    compat.replace_method(llm, "_create_stream", wrap)


def _settle(llm: Any, call: LLMCall, on_call: Callable[[LLMCall], None]) -> None:
    """Start the re-score of a call that sampled ids, then hand the call on."""
    if call.token_ids_requested and call.error is None and call.prompt_token_ids and call.token_ids:
        reshaped = reshaping_sampling(call.request)
        if reshaped is None:
            call.settling = asyncio.get_running_loop().create_task(rescore(llm, call))
        else:
            call.prompt_token_ids, call.token_ids = None, []  # text only: said once per service
            if not getattr(llm, "_pipecat_rl_reshaped_warned", False):
                llm._pipecat_rl_reshaped_warned = True
                logger.warning(
                    f"pipecat-rl: {llm} samples with {reshaped}; vLLM re-scores a prompt without "
                    "its sampling settings, so these Responses turns are recorded as text only "
                    "(no token ids, so they cannot train). Sample at temperature 1 without "
                    "top_p/top_k/min_p, or use OpenAILLMService (Chat Completions) to train on them"
                )
    on_call(call)


def reshaping_sampling(request: dict[str, Any]) -> str | None:
    """The sampling settings of `request` that reshape the model's distribution, if any.

    vLLM computes prompt logprobs from the raw logits (its sampling processors never see a
    prompt), while the sampler's logprobs are processed (temperature, top-p/k, min-p applied). The
    two agree only when sampling leaves the distribution as it is: temperature 1 (or 0, greedy,
    where vLLM scales nothing) and no truncation.
    """
    extra = request.get("extra_body") or {}
    settings = {
        "temperature": request.get("temperature"),
        "top_p": request.get("top_p"),
        "top_k": extra.get("top_k"),
        "min_p": extra.get("min_p"),
    }
    identity = {"temperature": (None, 0, 1), "top_p": (None, 1), "top_k": (None, 0, -1),
                "min_p": (None, 0)}  # fmt: skip
    reshaped = [f"{k}={v}" for k, v in settings.items() if v not in identity[k]]
    return ", ".join(reshaped) or None


async def rescore(llm: Any, call: LLMCall) -> None:
    """Fill `call.logprobs` from one prefill of prompt + sampled ids on `llm`'s own server.

    On any failure the logprobs stay empty, so the call is text only (not token-exact), and a
    warning says why; it never raises.
    """
    prompt, sampled = call.prompt_token_ids or [], call.token_ids
    try:
        completion = await compat.llm_client(llm).completions.create(
            model=call.request["model"],
            prompt=[*prompt, *sampled],
            max_tokens=1,
            temperature=0,
            extra_body={"prompt_logprobs": 0},
            timeout=RESCORE_TIMEOUT_S,
        )
        scored = completion.choices[0].prompt_logprobs  # vLLM's field, kept by the SDK
        expected = len(prompt) + len(sampled)
        if not isinstance(scored, list) or len(scored) != expected:
            raise ValueError(f"prompt_logprobs for {len(scored or [])} ids, not {expected}")
        call.logprobs = [
            float(scored[len(prompt) + i][str(token)]["logprob"]) for i, token in enumerate(sampled)
        ]
    except Exception as e:
        logger.warning(
            f"pipecat-rl: re-scoring a Responses turn on {compat.llm_base_url(llm)} failed "
            f"({type(e).__name__}: {e}); the turn is recorded as text only (no token ids, so it "
            "cannot train)"
        )


class ResponsesDemonstration(DemonstrationSource):
    """A Responses service the tee cannot see (the WebSocket one): its replies as demonstrations.

    The call's context through the service's own Responses adapter, as the chat view.
    """

    async def request(self) -> dict[str, Any] | None:
        """The whole call as one chat request: system instruction, messages, tools."""
        if self.aggregator is None:
            return None
        instruction = getattr(self.llm.settings, "system_instruction", None)
        params = await self.llm.get_llm_adapter().get_llm_invocation_params(
            self.aggregator.context,
            system_instruction=instruction if isinstance(instruction, str) else None,
        )
        view = chat_view({"model": self.model, **params})
        # Not the request as sent: it is the whole call, each turn's request is a prefix of it.
        return {key: view.get(key, []) for key in ("model", "messages", "tools")}
