"""Demonstrations: the turns of a scripted or non-OpenAI LLM service, recorded for SFT.

The LLM tee sees only OpenAI-compatible services. A scripted expert (`ScriptedLLMService`) or a
hosted model behind another API still answers a context the way a served model would; when the
call ends we read that context (through Pipecat's public `LLMContextAggregator.context` and the
service's own adapter, so the system instruction and tools are exactly what an OpenAI request
would carry) and write one turn per reply: the request as the model would have seen it and the
reply with its tool calls, marked `demonstration`. They have no sampled ids: the trainer renders
them with the served model's own chat template (`render_demonstration`), so a demonstration trains
any model, never GRPO or OPSD. Nothing here imports torch or transformers.
"""

import json
import time
from dataclasses import dataclass
from typing import Any

from pipecat.processors.aggregators.llm_response_universal import LLMContextAggregator
from pipecat.services.llm_service import LLMService
from pipecat.services.openai.base_llm import BaseOpenAILLMService

from pipecat_rl.ledger import TurnRecord


@dataclass
class DemonstrationSource:
    """A non-OpenAI LLM service and the context it answers."""

    llm: LLMService
    aggregator: LLMContextAggregator | None

    @property
    def model(self) -> str:
        """The service's model name (e.g. `scripted`)."""
        model = getattr(self.llm.settings, "model", None)
        return str(model) if model else type(self.llm).__name__

    async def request(self) -> dict[str, Any] | None:
        """The whole call as one OpenAI-style request: system instruction, messages, tools."""
        if self.aggregator is None:
            return None
        settings = self.llm.settings
        instruction = getattr(settings, "system_instruction", None)
        params = await self.llm.get_llm_adapter().get_llm_invocation_params(
            self.aggregator.context,
            system_instruction=instruction if isinstance(instruction, str) else None,
            convert_developer_to_user=True,
        )
        tools = params.get("tools")
        return {
            "model": self.model,
            "messages": json.loads(json.dumps(list(params["messages"]), default=str)),
            "tools": json.loads(json.dumps(tools, default=str)) if isinstance(tools, list) else [],
        }


def demonstration_sources(processors: list[Any]) -> list[DemonstrationSource]:
    """Every LLM service in `processors` that the OpenAI tee does not record, with its context.

    The context is the one of the pipeline's first context aggregator (Pipecat's pair shares one).
    """
    llms = [
        p
        for p in processors
        if isinstance(p, LLMService) and not isinstance(p, BaseOpenAILLMService)
    ]
    aggregator = next((p for p in processors if isinstance(p, LLMContextAggregator)), None)
    return [DemonstrationSource(llm, aggregator) for llm in llms]


def _reply_of(messages: list[dict[str, Any]], start: int) -> tuple[dict[str, Any], int]:
    """Consecutive assistant messages from `start` merged into one reply; returns (reply, end)."""
    text, calls, end = [], [], start
    while end < len(messages) and messages[end].get("role") == "assistant":
        m = messages[end]
        if m.get("content"):
            text.append(str(m["content"]))
        calls.extend(m.get("tool_calls") or [])
        end += 1
    reply: dict[str, Any] = {"role": "assistant", "content": " ".join(text)}
    if calls:
        reply["tool_calls"] = calls
    return reply, end


def demonstration_turns(
    session_id: str, request: dict[str, Any], *, start_index: int = 0
) -> list[TurnRecord]:
    """One demonstration turn per assistant reply of a finished call's request."""
    messages: list[dict[str, Any]] = request["messages"]
    turns, i, now = [], 0, time.time()
    while i < len(messages):
        if messages[i].get("role") != "assistant":
            i += 1
            continue
        reply, end = _reply_of(messages, i)
        calls = [
            {
                "id": c.get("id"),
                "name": c["function"]["name"],
                "arguments": c["function"]["arguments"],
            }
            for c in reply.get("tool_calls", [])
        ]
        turns.append(
            TurnRecord(
                session_id=session_id,
                index=start_index + len(turns),
                adapter=request["model"],
                created_at=now,
                request={**request, "messages": messages[:i]},
                generated_text=reply["content"],
                tool_calls=calls,
                finish_reason="tool_calls" if calls else "stop",
                demonstration=True,
            )
        )
        i = end
    return turns


def _ids(rendered: Any) -> list[int]:
    ids = rendered["input_ids"] if not isinstance(rendered, list) else rendered
    return list(ids)


def render_demonstration(turn: TurnRecord, tokenizer: Any) -> tuple[list[int], list[int]]:
    """(prompt ids, completion ids) of a demonstration under `tokenizer`'s chat template.

    The completion is what the model would have had to sample: the reply up to and including the
    template's end-of-turn token (so the model learns to stop), nothing after it.

    Raises:
        ValueError: the template does not render the prompt as a prefix of the whole turn.
    """
    messages = list(turn.request.get("messages") or [])
    tools = turn.request.get("tools") or None
    reply: dict[str, Any] = {"role": "assistant", "content": turn.generated_text or ""}
    if turn.tool_calls:
        reply["tool_calls"] = [
            {
                "id": c.get("id"),
                "type": "function",
                "function": {"name": c["name"], "arguments": c["arguments"]},
            }
            for c in turn.tool_calls
        ]
    prompt = _ids(
        tokenizer.apply_chat_template(
            messages, tools=tools, add_generation_prompt=True, tokenize=True
        )
    )
    full = _ids(tokenizer.apply_chat_template([*messages, reply], tools=tools, tokenize=True))
    if full[: len(prompt)] != prompt:
        raise ValueError(
            f"the chat template does not render demonstration {turn.session_id}#{turn.index}'s "
            "prompt as a prefix of the turn; fix the template's generation prompt"
        )
    completion = full[len(prompt) :]
    eos = tokenizer.eos_token_id
    if eos in completion:
        completion = completion[: len(completion) - completion[::-1].index(eos)]
    return prompt, completion


async def collect_demonstrations(
    sources: list[DemonstrationSource], session_id: str, redactor: Any = None
) -> list[TurnRecord]:
    """The demonstration turns of a finished call (redacted when the recorder redacts)."""
    turns: list[TurnRecord] = []
    for source in sources:
        request = await source.request()
        if not request:
            continue
        for turn in demonstration_turns(session_id, request, start_index=len(turns)):
            if redactor is not None:
                turn = turn.model_copy(
                    update={
                        "request": redactor.value(turn.request),
                        "generated_text": redactor.text(turn.generated_text),
                        "tool_calls": redactor.value(turn.tool_calls),
                        "redacted": True,
                    }
                )
            turns.append(turn)
    return turns
