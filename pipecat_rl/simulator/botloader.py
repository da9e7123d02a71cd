"""Running the user's bot unmodified: load it, call its `run_bot`, adapt its pipeline.

A bot in Pipecat's example convention defines `async def run_bot(transport, runner_args)`
beside `bot(runner_args)`. Real bots vary (`run_bot(transport)`, `run_bot(transport,
runner_args, wait_for_user)`, `run_bot(transport, handle_sigint, testing)`), so the signature
is inspected and each parameter is filled by its name (`FILLED_PARAMETERS`). Without a
`run_bot`, Pipecat Cloud's `bot(runner_args)` is called with runner arguments that carry the
local transport, which `create_transport` hands back (`install_create_transport`).
`--bot path/to/bot.py:name` (or `package.module:name`) names another entry point.

Before the bot's worker starts, the simulator's setup file (`PIPECAT_SETUP_FILES`) adapts the
pipeline for the episode (`prepare_worker`):

- text mode: every STT and TTS service is replaced in the pipeline by a pass-through, so
  Deepgram, Cartesia and the like never open a connection (the simulator sets placeholder
  API keys for the duration of the run so that their constructors, which insist on a key,
  succeed; nothing is ever sent with them);
- every LLM service is pointed at the served model or refused (`point_llm`): OpenAI Chat
  services (`BaseOpenAILLMService` and its subclasses: Groq, Together, Ollama, ...) get a client
  on `--llm-url` and the adapter (or `base`) as their model; OpenAI Responses services
  (`OpenAIResponsesLLMService`, the Flows examples' default, and its HTTP variant) are served
  over the server's `/v1/responses` (the WebSocket variant is switched to HTTP); any other
  service whose client is an OpenAI client is pointed at it too. Any other provider's service
  (Anthropic, Google, Bedrock, realtime services, ...) is refused: it is taken out of the
  pipeline before a frame reaches it and the run stops with a message naming it; the way out
  is an entry point that builds an OpenAI-compatible service (`--bot file.py:entry`). The
  simulation environment also replaces every provider key with a placeholder and points the
  OpenAI and Anthropic base URLs at the served model (or a closed loopback port), so a stray
  request fails closed;
- the world pack's tools are registered over the bot's handlers of the same name
  (`llm.register_function`), so tool calls execute against the episode's world. The world is
  also on `runner_args.world`, for a bot that passes it to its worker's `app_resources`.
"""

import asyncio
import contextlib
import functools
import importlib
import importlib.util
import inspect
import os
import sys
from collections.abc import Callable, Iterator
from contextvars import ContextVar
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import openai
from loguru import logger
from pipecat.frames.frames import ErrorCategory
from pipecat.observers.base_observer import BaseObserver
from pipecat.pipeline.pipeline import Pipeline
from pipecat.pipeline.worker import PipelineWorker
from pipecat.processors.frame_processor import FrameProcessor
from pipecat.runner.types import RunnerArguments
from pipecat.services.llm_service import FunctionCallParams, LLMService, WebsocketLLMService
from pipecat.services.openai.base_llm import BaseOpenAILLMService
from pipecat.services.openai.responses.llm import (
    OpenAIResponsesHttpLLMService,
    OpenAIResponsesLLMService,
)
from pipecat.services.stt_service import STTService
from pipecat.services.tts_service import TTSService
from pipecat.transports.base_transport import TransportParams

from pipecat_rl import compat
from pipecat_rl.errors import ConfigError, SimulationError
from pipecat_rl.serving.server import client_api_key
from pipecat_rl.simulator.fork import ForkRun
from pipecat_rl.simulator.world import World

PLACEHOLDER_KEYS = (
    "DEEPGRAM_API_KEY", "CARTESIA_API_KEY", "ELEVENLABS_API_KEY", "OPENAI_API_KEY",
    "AZURE_SPEECH_API_KEY", "GOOGLE_API_KEY", "ASSEMBLYAI_API_KEY", "RIME_API_KEY",
    "GROQ_API_KEY", "SPEECHMATICS_API_KEY", "GLADIA_API_KEY", "SONIOX_API_KEY",
)  # fmt: skip
"""Provider keys set to a placeholder while simulating, when absent, so constructors succeed."""

PLACEHOLDER = "pipecat-rl-simulated"

_SECRET_SUFFIXES = ("_API_KEY", "_SECRET_KEY", "_ACCESS_KEY_ID", "_SECRET_ACCESS_KEY", "_TOKEN")
"""Environment variables ending so are provider credentials: replaced while simulating."""

CLOSED_URL = "http://127.0.0.1:9/v1"
"""Where stray OpenAI/Anthropic SDK requests go when no model is served: a closed local port."""


@dataclass
class SimulationRunnerArguments(RunnerArguments):
    """What the simulator hands a bot as `runner_args`: Pipecat's arguments plus the episode."""

    world: World | None = None
    llm_url: str | None = None
    model: str | None = None
    transport: Any = None
    """The local transport, for a `bot(runner_args)` entry: `create_transport` returns it."""


@dataclass
class Episode:
    """What the setup hook needs to adapt the bot's workers for one episode."""

    world: World | None
    llm_url: str | None
    model: str | None
    bypass_speech: bool = True
    max_tokens: int | None = None
    """A cap on the agent's replies, when the bot sets none (keeps a rambling model bounded)."""
    temperature: float | None = None
    """Overrides the bot's sampling temperature (GRPO explores at its own, recorded one)."""
    seed: int | None = None
    """The agent's sampling seed when the bot sets none: the episode's, so run r of two
    policies shares its sampling noise (vLLM honours a per-request `seed`)."""
    workers: list[PipelineWorker] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    """Pipeline errors (ErrorFrames) the bot's workers reported."""
    bypassed: list[str] = field(default_factory=list)
    redirected: list[str] = field(default_factory=list)
    refused: list[str] = field(default_factory=list)
    """Why each refused LLM service was refused (the run stops on the first)."""
    prepared: asyncio.Event = field(default_factory=asyncio.Event)
    """Set once a worker of the bot has been adapted (the pre-flight check waits on it)."""
    speech_swap: "Callable[[FrameProcessor], SpeechSwap] | None" = None
    """Audio mode (`bypass_speech` off): given a worker's pipeline, keeps or stands in for each
    of its STT/TTS services."""
    observers: list[BaseObserver] = field(default_factory=list)
    """Added to every bot worker of the episode (audio mode: what the agent's STT heard)."""
    clients: list[openai.AsyncOpenAI] = field(default_factory=list)
    """The OpenAI clients of the bot's redirected services (the bot's own and ours): the runner
    closes them before the episode's event loop ends, which Pipecat never does."""
    fork: ForkRun | None = None
    """A fork's replay: the redirected client answers its forced turns (`simulator.fork`)."""

    async def close_clients(self) -> None:
        """Close every client in `clients` (in the loop that used them)."""
        for client in self.clients:
            await client.close()
        self.clients.clear()


_episode: ContextVar[Episode | None] = ContextVar("pipecat_rl_episode", default=None)


@contextlib.contextmanager
def episode_context(episode: Episode) -> Iterator[Episode]:
    """Adapt every bot worker set up inside this block (same asyncio task tree) for `episode`."""
    token = _episode.set(episode)
    try:
        yield episode
    finally:
        _episode.reset(token)


class BypassedService(FrameProcessor):
    """Stands where an STT or TTS service stood in a text-mode pipeline: passes frames on."""

    def __init__(self, replaced: FrameProcessor, **kwargs):
        super().__init__(name=f"Bypassed{type(replaced).__name__}", **kwargs)

    async def process_frame(self, frame, direction):
        """Pass every frame on unchanged."""
        await super().process_frame(frame, direction)
        await self.push_frame(frame, direction)


def _replace(
    pipeline: FrameProcessor, swap: Callable[[FrameProcessor], FrameProcessor | None]
) -> None:
    """Replace each processor of `pipeline` (nested too) that `swap` gives a substitute for."""
    if not isinstance(pipeline, Pipeline):
        for child in compat.child_processors(pipeline):
            _replace(child, swap)
        return
    for i, processor in enumerate(compat.pipeline_chain(pipeline)):
        substitute = swap(processor)
        if substitute is not None:
            compat.replace_processor(pipeline, i, substitute)
        else:
            _replace(processor, swap)


SpeechSwap = Callable[[FrameProcessor], list[FrameProcessor]]
"""What stands where an STT or TTS service stood (audio mode: itself, or a stand-in)."""


def _bypass(processor: FrameProcessor) -> list[FrameProcessor]:
    return [BypassedService(processor)]


def _bypass_speech(
    pipeline: FrameProcessor, episode: Episode, swap: SpeechSwap = _bypass
) -> None:
    """Replace STT and TTS services in `pipeline` (and nested pipelines) by `swap`'s output."""
    if not isinstance(pipeline, Pipeline):
        for child in compat.child_processors(pipeline):
            _bypass_speech(child, episode, swap)
        return
    processors = compat.pipeline_chain(pipeline)
    chain: list[FrameProcessor] = []
    for processor in processors:
        if isinstance(processor, (STTService, TTSService)):
            replacement = swap(processor)
            if replacement != [processor]:
                episode.bypassed.append(type(processor).__name__)
            chain.extend(replacement)
        else:
            _bypass_speech(processor, episode, swap)
            chain.append(processor)
    if chain != processors:
        compat.set_pipeline_chain(pipeline, chain)


def _processors(root: FrameProcessor) -> Iterator[FrameProcessor]:
    yield root
    for child in compat.child_processors(root):
        yield from _processors(child)


def _world_handler(world: World) -> Callable:
    async def handler(params: FunctionCallParams) -> None:
        execution = world.execute(
            params.function_name, dict(params.arguments), call_id=params.tool_call_id
        )
        await params.result_callback(
            execution.result if execution.ok else {"error": execution.error}
        )

    return handler


def error_recorder(errors: list[str], *, fatal_only: bool = False) -> Callable:
    """An `on_pipeline_error` handler that appends each error to `errors`.

    A bot's own tool handler that raised (Pipecat reports it as an `APPLICATION` error, and
    settles the call as failed) is a failed tool call, scored as one, not a broken episode.
    `fatal_only` is for the caller's side, our instrument: a non-fatal error there (Pipecat
    reports one TTS line that came out silent, which on a loaded machine happens, as saying
    nothing about the service) is logged; the call goes on, and a caller who truly went quiet
    shows in the call itself.
    """

    async def record(worker: PipelineWorker, frame) -> None:
        if getattr(frame, "category", None) == ErrorCategory.APPLICATION and not frame.fatal:
            logger.debug(f"{worker}: a tool handler failed: {frame.error}")
            return
        if fatal_only and not frame.fatal:
            logger.warning(f"{worker}: {frame.error} (not fatal; the call goes on)")
            return
        errors.append(f"{worker}: {frame.error}")

    return record


_RESPONSES = (OpenAIResponsesLLMService, OpenAIResponsesHttpLLMService)
"""OpenAI's Responses API services (WebSocket and HTTP), and any subclass of them."""

_OWN_MODULES = ("pipecat.services.llm_service", "pipecat.services.ai_service")
"""Pipecat's generic LLM bases: a service built only on them is the user's own (or ours)."""


def _provider_class(processor: LLMService) -> type | None:
    """The first class of `processor` that is a Pipecat provider service, if any."""
    for cls in type(processor).__mro__:
        module = cls.__module__
        if module.startswith("pipecat.services.") and module not in _OWN_MODULES:
            return cls
    return None


def refusal(processor: LLMService, llm_url: str | None) -> str | None:
    """Why `processor` cannot run in a simulation, or None when it can (see `point_llm`)."""
    name = type(processor).__name__
    redirectable = isinstance(processor, (BaseOpenAILLMService, *_RESPONSES))
    client = compat.llm_client(processor, None)
    redirectable = redirectable or isinstance(client, openai.AsyncOpenAI)
    realtime = isinstance(processor, WebsocketLLMService) and not isinstance(
        processor, OpenAIResponsesLLMService
    )
    if redirectable and not realtime:
        if llm_url is None:
            return (
                f"the bot's {name} needs the served model, and this run serves none "
                "(--no-server): drop --no-server, or pass --llm-url"
            )
        return None
    provider = _provider_class(processor)
    if provider is None:
        return None  # the user's own LLMService (or the simulator's scripted one)
    return (
        f"the bot's {name} ({provider.__module__}) cannot be pointed at the served model, and "
        "the simulator never lets a bot call its provider. Give the simulator an entry point "
        "that builds an OpenAI-compatible service instead (OpenAILLMService, or any service "
        "with a base_url), e.g. `--bot file.py:entry` with an entry that passes it to your "
        "run_bot, as examples/clinic/expert.py does"
    )


def point_llm(processor: LLMService, episode: Episode) -> None:
    """Point an OpenAI Chat or Responses service (or any OpenAI client) at the served model."""
    assert episode.llm_url is not None  # checked by `refusal`
    episode.redirected.append(type(processor).__name__)
    if isinstance(processor, OpenAIResponsesLLMService):
        # vLLM serves the Responses API over HTTP, not the WebSocket this variant opens: the
        # instance (its functions, handlers and the references a bot or Flows holds) stays.
        compat.switch_class(processor, OpenAIResponsesHttpLLMService)
    key = client_api_key()
    if isinstance(processor, _RESPONSES):
        compat.set_responses_api_key(processor, key)
    own = compat.llm_client(processor, None)
    forcing = episode.fork.http_client() if episode.fork is not None else None
    client = openai.AsyncOpenAI(api_key=key, base_url=episode.llm_url, http_client=forcing)
    compat.set_llm_client(processor, client)
    episode.clients += [c for c in (own, client) if isinstance(c, openai.AsyncOpenAI)]
    settings = compat.llm_settings(processor)
    if episode.model:
        settings.model = episode.model
    capped = isinstance(getattr(settings, "max_tokens", None), int) or isinstance(
        getattr(settings, "max_completion_tokens", None), int
    )
    if episode.max_tokens and not capped:
        if isinstance(processor, _RESPONSES):
            # A Responses service sends only `max_completion_tokens` (as `max_output_tokens`):
            # `max_tokens` there caps nothing, and an uncapped greeting can run for minutes.
            settings.max_completion_tokens = episode.max_tokens
        else:
            settings.max_tokens = episode.max_tokens
    if episode.temperature is not None:
        settings.temperature = episode.temperature
    unseeded = hasattr(settings, "seed") and not isinstance(settings.seed, int)
    if episode.seed is not None and unseeded:
        settings.seed = episode.seed


def _adapt_llms(worker: PipelineWorker, episode: Episode) -> None:
    def swap(processor: FrameProcessor) -> FrameProcessor | None:
        if not isinstance(processor, LLMService):
            return None
        reason = refusal(processor, episode.llm_url)
        if reason is None and episode.fork is not None and isinstance(processor, _RESPONSES):
            reason = (
                f"the bot's {type(processor).__name__} speaks the Responses API; a fork forces "
                "the recorded turns of an OpenAI Chat Completions service only"
            )
        if reason is None:
            if _provider_class(processor) is not None:
                point_llm(processor, episode)
            return None
        # Out of the pipeline before any frame reaches it: it never opens a connection.
        episode.refused.append(reason)
        episode.errors.append(reason)
        return BypassedService(processor)

    _replace(worker.pipeline, swap)


async def prepare_worker(worker: PipelineWorker) -> None:
    """Adapt a bot's worker for the current episode (a no-op outside the simulator)."""
    episode = _episode.get()
    if episode is None:
        return
    episode.workers.append(worker)
    worker.add_event_handler("on_pipeline_error", error_recorder(episode.errors))
    if episode.bypass_speech:
        _bypass_speech(worker.pipeline, episode)
    elif episode.speech_swap is not None:
        _bypass_speech(worker.pipeline, episode, episode.speech_swap(worker.pipeline))
    for observer in episode.observers:
        worker.add_observer(observer)
    _adapt_llms(worker, episode)
    for processor in _processors(worker.pipeline):
        if isinstance(processor, LLMService) and episode.world is not None:
            handler = _world_handler(episode.world)
            for name in episode.world.tools:
                processor.register_function(name, handler)
    if episode.bypassed:
        logger.debug(f"simulator: replaced {', '.join(episode.bypassed)}")
    episode.prepared.set()


_environment_users = 0
_saved_environment: dict[str, str] = {}


@contextlib.contextmanager
def simulation_environment(llm_url: str | None, setup_files: list[Path]) -> Iterator[None]:
    """Environment for simulated bots: setup files, the LLM URL, and no real provider key.

    `setup_files` go first in `PIPECAT_SETUP_FILES`, before what was there. Simulations that
    overlap in one process (the gate runs two at once) share it: the first one in sets it, the
    last one out restores what was there before any of them.
    """
    global _environment_users, _saved_environment
    if _environment_users == 0:
        _saved_environment = dict(os.environ)
    _environment_users += 1
    existing = [p for p in os.environ.get("PIPECAT_SETUP_FILES", "").split(os.pathsep) if p]
    ours = [str(p) for p in setup_files]
    os.environ["PIPECAT_SETUP_FILES"] = os.pathsep.join(
        ours + [p for p in existing if p not in ours]
    )
    # Fail closed: no real provider key is in reach of a simulated bot, and the SDKs that read
    # a base URL from the environment talk to the served model or to a closed local port.
    for key in [k for k in os.environ if k.upper().endswith(_SECRET_SUFFIXES)]:
        os.environ[key] = PLACEHOLDER
    for key in PLACEHOLDER_KEYS + ("GOOGLE_APPLICATION_CREDENTIALS",):
        os.environ[key] = PLACEHOLDER
    os.environ["OPENAI_BASE_URL"] = llm_url or CLOSED_URL
    os.environ["ANTHROPIC_BASE_URL"] = CLOSED_URL.removesuffix("/v1")
    try:
        yield
    finally:
        _environment_users -= 1
        if _environment_users == 0:
            os.environ.clear()
            os.environ.update(_saved_environment)


# -- loading the bot ---------------------------------------------------------------------------

BotFn = Callable[..., Any]

SIMULATED_CALLER_NUMBER = "+15555550100"
SIMULATED_DIALED_NUMBER = "+15555550199"

FILLED_PARAMETERS: dict[str, str] = {
    "runner_args": "the simulator's runner arguments (`SimulationRunnerArguments`)",
    "args": "the same runner arguments",
    "session_args": "the same runner arguments",
    "handle_sigint": "False (the simulator owns the process)",
    "handle_sigterm": "False",
    "wait_for_user": "False",
    "testing": "False (Pipecat's telephony examples: a real call, not their own test mode)",
    "sample_rate": "16000 (text mode carries no audio)",
    "audio_in_sample_rate": "16000",
    "audio_out_sample_rate": "16000",
    "body": "runner_args.body (the scenario, repeat and seed)",
    "session_id": "the episode's session id",
    "call_id": "the episode's session id",
    "call_sid": "the episode's session id",
    "stream_id": "the episode's session id",
    "stream_sid": "the episode's session id",
    "caller_id": SIMULATED_CALLER_NUMBER,
    "from_number": SIMULATED_CALLER_NUMBER,
    "caller_number": SIMULATED_CALLER_NUMBER,
    "to_number": SIMULATED_DIALED_NUMBER,
    "dialed_number": SIMULATED_DIALED_NUMBER,
}
"""What the simulator passes for each entry-point parameter it knows, by name (docs/cli.md's
table is rendered from it). A parameter with a default that is not listed keeps its default; one
without a default that is not listed is a clear error naming it."""

_RUNNER_ARGS_NAMES = ("runner_args", "args", "session_args")


def _parameter_values(runner_args: SimulationRunnerArguments) -> dict[str, Any]:
    session = runner_args.session_id or ""
    values: dict[str, Any] = {name: runner_args for name in _RUNNER_ARGS_NAMES}
    values.update(handle_sigint=False, handle_sigterm=False, wait_for_user=False, testing=False)
    values.update(sample_rate=16000, audio_in_sample_rate=16000, audio_out_sample_rate=16000)
    values.update(body=runner_args.body, session_id=session, call_id=session, call_sid=session)
    values.update(stream_id=session, stream_sid=session)
    values.update(caller_id=SIMULATED_CALLER_NUMBER, from_number=SIMULATED_CALLER_NUMBER)
    values.update(caller_number=SIMULATED_CALLER_NUMBER, to_number=SIMULATED_DIALED_NUMBER)
    values.update(dialed_number=SIMULATED_DIALED_NUMBER)
    return values


@dataclass(frozen=True)
class BotEntry:
    """A bot's entry point: the transport goes first, the named parameters after it.

    With `takes_runner_args` (Pipecat Cloud's `bot(runner_args)`), the runner arguments go
    first instead and carry the transport, which `create_transport` hands back to the bot.
    """

    spec: str
    fn: BotFn
    parameters: tuple[str, ...]
    takes_runner_args: bool = False
    webrtc_params: "Callable[[], TransportParams] | None" = None
    """The bot module's own `transport_params["webrtc"]`, if it declares one (Pipecat's runner
    convention): `--transport webrtc` builds each episode's SmallWebRTC transport with a fresh
    call of it (its VAD analyzer, say, is never shared between calls)."""

    def webrtc_transport_params(self) -> TransportParams | None:
        """A fresh `webrtc_params()`, or None; a `SimulationError` when it is not one.

        Called only when a call goes over WebRTC: a text or local-audio run never runs it.
        """
        if self.webrtc_params is None:
            return None
        what = f"--bot {self.spec}: transport_params['webrtc']"
        if not callable(self.webrtc_params):
            raise SimulationError(f"{what} must be a function returning TransportParams")
        try:
            params = self.webrtc_params()
        except Exception as e:
            raise SimulationError(f"{what}() raised {type(e).__name__}: {e}") from e
        if not isinstance(params, TransportParams):
            raise SimulationError(f"{what}() gave {type(params).__name__}, not TransportParams")
        return params

    async def run(self, transport: Any, runner_args: SimulationRunnerArguments) -> None:
        """Call the entry point with the transport and whatever else it asks for."""
        values = _parameter_values(runner_args)
        named = {name: values[name] for name in self.parameters}
        if self.takes_runner_args:
            runner_args.transport = transport
            result = self.fn(runner_args, **named)
        else:
            result = self.fn(transport, **named)
        if inspect.isawaitable(result):
            await result


def install_create_transport() -> None:
    """Make `pipecat.runner.utils.create_transport` return the simulator's local transport.

    Pipecat's runner hands a bot runner arguments whose type names its transport, and the bot
    builds the transport with `create_transport(runner_args, params)`; for the simulator's
    arguments it returns the local transport they carry, for any other it does what it did.
    Installed before a bot is imported, so a bot's `from ... import create_transport` gets it.
    """
    from pipecat.runner import utils

    original = utils.create_transport
    if getattr(original, "pipecat_rl", False):
        return

    @functools.wraps(original)
    async def create_transport(runner_args: Any, *args: Any, **kwargs: Any) -> Any:
        if isinstance(runner_args, SimulationRunnerArguments) and runner_args.transport:
            return runner_args.transport
        return await original(runner_args, *args, **kwargs)

    create_transport.pipecat_rl = True  # type: ignore[attr-defined]
    utils.create_transport = create_transport


def import_module_spec(spec: str, option: str = "--bot") -> Any:
    """The module `path/to/file.py` (its folder importable while it loads) or `package.module`.

    `option` names the argument in the error for a missing file.
    """
    path = Path(spec)
    if spec.endswith(".py"):
        if not path.is_file():  # a wrong argument, as a missing scenario file is
            raise ConfigError(f"{option} {spec}: no such file")
        folder = str(path.resolve().parent)
        name = f"pipecat_rl_bot_{path.stem}_{abs(hash(str(path.resolve())))}"
        module_spec = importlib.util.spec_from_file_location(name, path.resolve())
        module = importlib.util.module_from_spec(module_spec)  # type: ignore[arg-type]
        sys.modules[name] = module
        # A bot's own imports (helpers beside it) resolve as they would under `python bot.py`.
        sys.path.insert(0, folder)
        try:
            module_spec.loader.exec_module(module)  # type: ignore[union-attr]
        finally:
            sys.path.remove(folder)
        return module
    return importlib.import_module(spec)


def _takes_runner_args(fn_name: str, first: inspect.Parameter) -> bool:
    annotation = first.annotation
    named = annotation if isinstance(annotation, str) else getattr(annotation, "__name__", "")
    return first.name in _RUNNER_ARGS_NAMES or "RunnerArguments" in str(named) or (
        fn_name == "bot" and first.name != "transport"
    )


def load_bot(spec: str) -> BotEntry:
    """Load `path/to/bot.py[:name]` or `package.module[:name]`.

    `name` defaults to `run_bot`, else Pipecat Cloud's `bot(runner_args)`.
    """
    module_spec, _, fn_name = spec.rpartition(":") if ":" in spec else (spec, "", "")
    install_create_transport()
    try:
        module = import_module_spec(module_spec)
    except (SimulationError, ConfigError):
        raise
    except Exception as e:
        hint = ""
        if isinstance(e, ImportError) and "daily" in str(e).lower():
            hint = " (Daily transport: pip install 'pipecat-rl[cpu]' brings pipecat-ai[daily])"
        raise SimulationError(
            f"--bot {spec}: importing it failed: {type(e).__name__}: {e}{hint}"
        ) from e
    named = fn_name
    if not fn_name:
        fn_name = "run_bot" if callable(getattr(module, "run_bot", None)) else "bot"
    fn = getattr(module, fn_name, None)
    if not callable(fn):
        wanted = f"`{fn_name}`" if named else "`run_bot` or `bot`"
        raise SimulationError(
            f"--bot {spec}: no {wanted} function; define `async def run_bot(transport, "
            "runner_args)` that builds the pipeline on the transport it is given (Pipecat's "
            "example convention) or `async def bot(runner_args)` that builds its transport with "
            "`create_transport` (Pipecat Cloud's), or name another entry point with "
            "--bot FILE:FUNCTION"
        )
    params = list(inspect.signature(fn).parameters.values())
    if not params:
        raise SimulationError(f"--bot {spec}: `{fn_name}` takes no transport parameter")
    takes_runner_args = _takes_runner_args(fn_name, params[0])
    rest = params[1:]
    missing = [p.name for p in rest if p.name not in FILLED_PARAMETERS and p.default is p.empty]
    if missing:
        raise SimulationError(
            f"--bot {spec}: `{fn_name}` needs {', '.join(missing)}, which the simulator cannot "
            f"provide; it fills {', '.join(sorted(FILLED_PARAMETERS))} by name (give the "
            "others defaults, or wrap the bot in an entry point of your own: --bot FILE:FUNCTION)"
        )
    return BotEntry(
        spec=spec,
        fn=fn,
        parameters=tuple(p.name for p in rest if p.name in FILLED_PARAMETERS),
        takes_runner_args=takes_runner_args,
        webrtc_params=_declared_webrtc_params(module),
    )


def _declared_webrtc_params(module: Any) -> "Callable[[], TransportParams] | None":
    """The `transport_params["webrtc"]` a bot module declares, or None (not called here)."""
    declared = getattr(module, "transport_params", None)
    return declared.get("webrtc") if isinstance(declared, dict) else None
