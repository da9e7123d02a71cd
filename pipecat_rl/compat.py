"""Every reliance on a private Pipecat name, in one place, each tested in `tests/test_compat.py`.

Pipecat gives no public way to do these few things, so we reach into it here and nowhere else:
when an upgrade renames one, this module (and its test) is the one place that breaks.
`tests/test_compat_wall.py` fails when any other module touches a private Pipecat name.

- `Pipeline._processors` and `Pipeline._link_processors()`: swap a processor in place
  (the simulator's text mode bypasses STT/TTS).
- `BaseOpenAILLMService._client` and `create_client()`: the service's OpenAI client (the
  recorder's vLLM probe; the simulator points a bot's LLM at the served model).
- `OpenAIResponsesLLMService._api_key`, and turning the WebSocket Responses service into its HTTP
  sibling in place: the simulator serves a Responses bot from vLLM's `/v1/responses`.
- `BaseOpenAILLMService._settings`: the live settings a request is built from (the simulator
  sets the model and caps max_tokens).
- `BaseObject._register_event_handler` / `_call_event_handler`: our own events (recorder, live
  adapter, the simulator's text and audio transports).
- `LLMUserAggregator._params.vad_analyzer`: whether a bot's user aggregator runs its own VAD
  (audio mode keeps the bot's own turn-taking).
- `get_chat_completions` calls `build_chat_completion_params` for each streamed request, and
  both are looked up on the instance: the recorder's tee replaces them there (`llm_tee`).
- `OpenAIResponsesHttpLLMService._create_stream(params)` opens each streamed Responses request
  and is looked up on the instance: the Responses tee replaces it there (`responses_tee`).
- aioice's `ice.get_host_addresses` (aiortc's ICE, brought by `pipecat-ai[webrtc]`), which leaves
  127.0.0.1 out: while a loopback WebRTC call gathers its candidates it offers 127.0.0.1 only
  (`loopback_ice`), so the simulator's calls never leave the machine, nor need a network.

Nothing here imports Pipecat at module level: the functions take Pipecat objects.
"""

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

STREAM_METHODS = ("build_chat_completion_params", "get_chat_completions", "_create_stream")
"""The service methods the LLM tee replaces on an instance (see `replace_method`)."""


# -- pipeline processor lists -------------------------------------------------------------------


def child_processors(processor: Any) -> list[Any]:
    """The processors directly inside `processor` (a pipeline's chain, a parallel's branches)."""
    return list(processor.processors)


def replace_processor(pipeline: Any, index: int, new: Any) -> None:
    """Put `new` at `index` of `pipeline`'s chain and relink the chain around it."""
    processors = pipeline._processors  # the chain Pipecat links and runs
    processors[index] = new
    pipeline._link_processors()


def set_pipeline_chain(pipeline: Any, chain: list[Any]) -> None:
    """Make `chain` (source and sink kept at its ends) `pipeline`'s chain, and relink it."""
    pipeline._processors[:] = chain
    pipeline._link_processors()


def pipeline_chain(pipeline: Any) -> list[Any]:
    """A pipeline's chain as Pipecat links it (its source and sink included)."""
    return list(pipeline._processors)


# -- service clients and settings ---------------------------------------------------------------


_MISSING = object()


def llm_client(llm: Any, default: Any = _MISSING) -> Any:
    """The OpenAI client an OpenAI-compatible LLM service sends its requests with.

    With `default`, a service that has no such client (another provider's) gives `default`.
    """
    if default is _MISSING:
        return llm._client
    return getattr(llm, "_client", default)


def set_llm_client(llm: Any, client: Any) -> None:
    """Make a service send with `client` (an OpenAI client the simulator built)."""
    llm._client = client


def set_responses_api_key(llm: Any, api_key: str) -> None:
    """The key an OpenAI Responses service puts in its own requests (it keeps it apart)."""
    llm._api_key = api_key


def switch_class(obj: Any, cls: type) -> None:
    """Turn `obj` into an instance of `cls` in place (a sibling class with the same state).

    The simulator turns a WebSocket Responses service into its HTTP sibling: the object, its
    registered functions and every reference a bot or Flows holds to it stay the same.
    """
    obj.__class__ = cls


def llm_base_url(llm: Any) -> str:
    """Where an OpenAI-compatible LLM service sends its requests (ends in /v1 for vLLM)."""
    return str(llm._client.base_url).rstrip("/")


def llm_api_key(llm: Any) -> str | None:
    """The API key an OpenAI-compatible LLM service sends (None if it has no client key)."""
    return getattr(llm._client, "api_key", None)


def redirect_llm(llm: Any, *, base_url: str, api_key: str) -> None:
    """Point an OpenAI-compatible LLM service at another server, as its constructor would."""
    llm._client = llm.create_client(api_key=api_key, base_url=base_url)


def llm_settings(llm: Any) -> Any:
    """The settings object the service builds each request from (mutations take effect)."""
    return llm._settings


# -- event-handler calls ------------------------------------------------------------------------


def register_event(obj: Any, name: str) -> None:
    """Declare an event `obj` fires, so users can `@obj.event_handler(name)` it."""
    obj._register_event_handler(name)


async def call_event(obj: Any, name: str, *args: Any) -> None:
    """Fire one of `obj`'s events, running every handler users added for it."""
    await obj._call_event_handler(name, *args)


# -- replaced methods ---------------------------------------------------------------------------


def replace_method(obj: Any, name: str, make: Callable[[Callable], Callable]) -> None:
    """Replace `obj.name` on the instance by `make(original)`; the class is left alone.

    Pipecat looks these methods up on the instance at each request, so the replacement sees
    every call that service makes, and no other service is touched.
    """
    if name not in STREAM_METHODS:
        raise ValueError(f"{name} is not a method pipecat-rl relies on replacing")
    setattr(obj, name, make(getattr(obj, name)))


# -- audio mode: whether a bot's user aggregator runs its own VAD -------------------------------


def user_aggregator_vad(aggregator: Any) -> Any:
    """The VAD analyzer an `LLMUserAggregator` was built with (its params are private), or None."""
    params = getattr(aggregator, "_params", None)
    return getattr(params, "vad_analyzer", None)


# -- aiortc's ICE (pipecat-ai[webrtc]) ---------------------------------------------------------

_loopback_users = 0


@contextlib.contextmanager
def loopback_ice() -> Iterator[None]:
    """WebRTC peers that gather candidates inside this block offer 127.0.0.1 only.

    Re-entrant across concurrent calls in one process: the original is put back when the last
    block exits.
    """
    global _loopback_users
    from aioice import ice

    if _loopback_users == 0:
        ice.pipecat_rl_host_addresses = ice.get_host_addresses
        ice.get_host_addresses = lambda use_ipv4, use_ipv6: ["127.0.0.1"] if use_ipv4 else []
    _loopback_users += 1
    try:
        yield
    finally:
        _loopback_users -= 1
        if _loopback_users == 0:
            ice.get_host_addresses = ice.pipecat_rl_host_addresses
