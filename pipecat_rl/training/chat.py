"""A recorded request's prompt as the server rendered it: vLLM's rule for tool-call arguments.

vLLM does not hand a request's messages to the chat template as sent. An assistant message's
tool calls arrive with `arguments` as an OpenAI JSON string; the server decodes it into an object
before rendering, and arguments that are empty, not valid JSON (free text), or valid JSON but not
an object (a string, an array, a number) become `{}`; an empty `tool_calls` list is dropped
(`vllm/renderers/chat_utils.py::_postprocess_messages`). So a call the policy wrote with
malformed arguments reads `"arguments": {}` in every later prompt, and a template that writes
a string as it is would render something else. The trainer re-renders a recorded prompt (the
guard's template check) only through `server_messages`, so a policy's malformed calls stay
training data instead of reading as template drift.
"""

import copy
import json
from collections.abc import Sequence
from typing import Any


def server_arguments(arguments: Any) -> dict[str, Any]:
    """A tool call's `arguments` as vLLM hands them to the template: an object, else `{}`."""
    if not arguments:
        return {}
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments)
        except json.JSONDecodeError:
            return {}
    return arguments if isinstance(arguments, dict) else {}


def server_messages(messages: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """A copy of `messages` as vLLM renders them (tool-call arguments decoded, see the module).

    Entries vLLM would refuse (a tool call that is not an object, or not of type `function`)
    are left as sent: the server answered the request, so a recorded turn never holds one.
    """
    out = copy.deepcopy(list(messages))
    for message in out:
        if not isinstance(message, dict) or message.get("role") != "assistant":
            continue
        calls = message.get("tool_calls")
        if not isinstance(calls, list):
            continue
        if not calls:
            del message["tool_calls"]  # keeps the template on its plain assistant path
            continue
        for call in calls:
            function = call.get("function") if isinstance(call, dict) else None
            if isinstance(function, dict):
                function["arguments"] = server_arguments(function.get("arguments"))
    return out


def rendered_prompt(tokenizer: Any, request: dict[str, Any]) -> list[int] | None:
    """The prompt ids the server rendered for `request`, a turn's request as sent.

    None when it holds no messages (a completions request: there is no template to check).
    """
    messages = request.get("messages")
    if not messages:
        return None
    rendered = tokenizer.apply_chat_template(
        server_messages(messages), tools=request.get("tools") or None,
        add_generation_prompt=True, tokenize=True,
    )  # fmt: skip
    return list(rendered["input_ids"] if not isinstance(rendered, list) else rendered)
