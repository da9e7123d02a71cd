"""A scripted LLM service: a Pipecat `LLMService` whose replies come from a Python function.

It behaves like a real LLM service in the pipeline (response start/end frames, text frames,
function calls run through Pipecat's own machinery, so `register_function` handlers, results
and re-runs all happen as with a served model), which makes deterministic episodes possible: a
scripted persona, or a scripted expert agent acting on the world.
"""

import dataclasses
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from pipecat.frames.frames import (
    Frame,
    FunctionCallFromLLM,
    LLMContextFrame,
    LLMFullResponseEndFrame,
    LLMFullResponseStartFrame,
    LLMTextFrame,
)
from pipecat.processors.frame_processor import FrameDirection
from pipecat.services.llm_service import LLMService
from pipecat.services.settings import LLMSettings


@dataclass
class ScriptedReply:
    """What a scripted LLM says, and the tools it calls (name, arguments), in order."""

    text: str = ""
    tool_calls: list[tuple[str, dict[str, Any]]] = field(default_factory=list)


Policy = Callable[[list[dict[str, Any]]], ScriptedReply]
"""Maps the context's messages (OpenAI format) to the next reply."""


def last_message(messages: list[dict[str, Any]], role: str) -> dict[str, Any] | None:
    """The last message of `role` in an OpenAI-format message list."""
    return next((m for m in reversed(messages) if m.get("role") == role), None)


def message_text(message: dict[str, Any] | None) -> str:
    """A message's text content (joined parts), or "" for none."""
    if message is None:
        return ""
    content = message.get("content")
    if isinstance(content, list):
        return " ".join(str(p.get("text", "")) for p in content if isinstance(p, dict))
    return str(content or "")


def _settings() -> LLMSettings:
    """Complete settings (every field given), as Pipecat expects of a service."""
    fields = {f.name: None for f in dataclasses.fields(LLMSettings) if f.name != "extra"}
    return LLMSettings(**{**fields, "model": "scripted"})


class ScriptedLLMService(LLMService):
    """An LLM service that answers each context with `policy(messages)`.

    Every function call is run through `run_function_calls`, exactly as a served model's would
    be, so handlers registered with `register_function` execute and their results re-run the
    policy on the updated context.
    """

    def __init__(self, policy: Policy, **kwargs):
        """Create the service.

        Args:
            policy: Called with the context's messages; returns the reply.
            **kwargs: Passed to `LLMService`.
        """
        kwargs.setdefault("settings", _settings())
        super().__init__(**kwargs)
        self._policy = policy

    async def process_frame(self, frame: Frame, direction: FrameDirection):
        """Answer `LLMContextFrame`s with the policy's reply; pass every other frame on."""
        await super().process_frame(frame, direction)
        if not isinstance(frame, LLMContextFrame):
            await self.push_frame(frame, direction)
            return
        reply = self._policy(frame.context.get_messages())
        await self.push_frame(LLMFullResponseStartFrame())
        if reply.text:
            await self.push_frame(LLMTextFrame(reply.text))
        calls = [
            FunctionCallFromLLM(
                function_name=name,
                tool_call_id=f"call_{uuid.uuid4().hex[:12]}",
                arguments=arguments,
                context=frame.context,
            )
            for name, arguments in reply.tool_calls
        ]
        await self.run_function_calls(calls)
        await self.push_frame(LLMFullResponseEndFrame())
