"""Running the user's bot unmodified: load it, call its `run_bot`, adapt its pipeline.

A bot in Pipecat's example convention defines `async def run_bot(transport, runner_args)`
beside `bot(runner_args)`. Real bots vary (`run_bot(transport)`, `run_bot(transport,
runner_args, wait_for_user)`, `run_bot(transport, handle_sigint)`), so the signature is
inspected and each parameter is filled by its name. `--bot path/to/bot.py:name` (or
`package.module:name`) names another entry point with the same parameters; a bot that only has
`bot(runner_args)` must split out a `run_bot(transport, runner_args)` that builds its pipeline on
the transport it is given, as Pipecat's examples do.

Before the bot's worker starts, the simulator's setup file (`PIPECAT_SETUP_FILES`) adapts the
pipeline for the episode (`prepare_worker`):

- text mode: every STT and TTS service is replaced in the pipeline by a pass-through, so
  Deepgram, Cartesia and the like never open a connection (the simulator sets placeholder
  API keys for the duration of the run so that their constructors, which insist on a key,
  succeed; nothing is ever sent with them);
- every OpenAI-compatible LLM service (`OpenAILLMService` and its subclasses) is pointed at the
  served model: its client is rebuilt on `--llm-url` and its model set to the adapter (or
  `base`). A bot that hard-codes another provider (Anthropic, Google, ...) must use an
  OpenAI-compatible service when it reads `OPENAI_BASE_URL`, or build its LLM in a factory
  that takes the URL from `runner_args.llm_url`;
- the world pack's tools are registered over the bot's handlers of the same name
  (`llm.register_function`), so tool calls execute against the episode's world. The world is
  also on `runner_args.world`, for a bot that passes it to its worker's `app_resources`.
"""

import contextlib
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

from loguru import logger
from pipecat.observers.base_observer import BaseObserver
from pipecat.pipeline.pipeline import Pipeline
from pipecat.pipeline.worker import PipelineWorker
from pipecat.processors.frame_processor import FrameProcessor
from pipecat.runner.types import RunnerArguments
from pipecat.services.llm_service import FunctionCallParams, LLMService
from pipecat.services.openai.base_llm import BaseOpenAILLMService
from pipecat.services.stt_service import STTService
from pipecat.services.tts_service import TTSService

from pipecat_rl.errors import SimulationError
from pipecat_rl.simulator.world import World

PLACEHOLDER_KEYS = (
    "DEEPGRAM_API_KEY", "CARTESIA_API_KEY", "ELEVENLABS_API_KEY", "OPENAI_API_KEY",
    "AZURE_SPEECH_API_KEY", "GOOGLE_API_KEY", "ASSEMBLYAI_API_KEY", "RIME_API_KEY",
    "GROQ_API_KEY", "SPEECHMATICS_API_KEY", "GLADIA_API_KEY", "SONIOX_API_KEY",
)  # fmt: skip
"""Provider keys set to a placeholder while simulating, when absent, so constructors succeed."""

PLACEHOLDER = "pipecat-rl-simulated"


@dataclass
class SimulationRunnerArguments(RunnerArguments):
    """What the simulator hands a bot as `runner_args`: Pipecat's arguments plus the episode."""

    world: World | None = None
    llm_url: str | None = None
    model: str | None = None


@dataclass
class Episode:
    """What the setup hook needs to adapt the bot's workers for one episode."""

    world: World | None
    llm_url: str | None
    model: str | None
    bypass_speech: bool = True
    max_tokens: int | None = None
    """A cap on the agent's replies, when the bot sets none (keeps a rambling model bounded)."""
    workers: list[PipelineWorker] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    """Pipeline errors (ErrorFrames) the bot's workers reported."""
    bypassed: list[str] = field(default_factory=list)
    redirected: list[str] = field(default_factory=list)
    speech_swap: "Callable[[FrameProcessor], SpeechSwap] | None" = None
    """Audio mode (`bypass_speech` off): given a worker's pipeline, keeps or stands in for each
    of its STT/TTS services."""
    observers: list[BaseObserver] = field(default_factory=list)
    """Added to every bot worker of the episode (audio mode: what the agent's STT heard)."""


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


SpeechSwap = Callable[[FrameProcessor], list[FrameProcessor]]
"""What stands where an STT or TTS service stood (audio mode: itself, or a stand-in)."""


def _bypass(processor: FrameProcessor) -> list[FrameProcessor]:
    return [BypassedService(processor)]


def _bypass_speech(
    pipeline: FrameProcessor, episode: Episode, swap: SpeechSwap = _bypass
) -> None:
    """Replace STT and TTS services in `pipeline` (and nested pipelines) by `swap`'s output."""
    if not isinstance(pipeline, Pipeline):
        for child in pipeline.processors:
            _bypass_speech(child, episode, swap)
        return
    processors = pipeline._processors  # Pipecat keeps the chain here; we relink it below
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
        processors[:] = chain
        pipeline._link_processors()


def _processors(root: FrameProcessor) -> Iterator[FrameProcessor]:
    yield root
    for child in root.processors:
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


def error_recorder(errors: list[str]) -> Callable:
    """An `on_pipeline_error` handler that appends each error to `errors`."""

    async def record(worker: PipelineWorker, frame) -> None:
        errors.append(f"{worker}: {frame.error}")

    return record


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
    for processor in _processors(worker.pipeline):
        if isinstance(processor, BaseOpenAILLMService) and episode.llm_url:
            processor._client = processor.create_client(api_key="none", base_url=episode.llm_url)
            if episode.model:
                processor._settings.model = episode.model
            settings = processor._settings
            capped = isinstance(settings.max_tokens, int) or isinstance(
                settings.max_completion_tokens, int
            )
            if episode.max_tokens and not capped:
                settings.max_tokens = episode.max_tokens
            episode.redirected.append(type(processor).__name__)
        if isinstance(processor, LLMService) and episode.world is not None:
            handler = _world_handler(episode.world)
            for name in episode.world.tools:
                processor.register_function(name, handler)
    if episode.bypassed:
        logger.debug(f"simulator: replaced {', '.join(episode.bypassed)}")


_environment_users = 0
_saved_environment: dict[str, str] = {}


@contextlib.contextmanager
def simulation_environment(llm_url: str | None, setup_files: list[Path]) -> Iterator[None]:
    """Environment for simulated bots: setup files, the LLM URL and placeholder provider keys.

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
    if llm_url:
        os.environ["OPENAI_BASE_URL"] = llm_url
    for key in PLACEHOLDER_KEYS:
        os.environ.setdefault(key, PLACEHOLDER)
    try:
        yield
    finally:
        _environment_users -= 1
        if _environment_users == 0:
            os.environ.clear()
            os.environ.update(_saved_environment)


# -- loading the bot ---------------------------------------------------------------------------

BotFn = Callable[..., Any]


_FILLED = {"runner_args", "args", "handle_sigint", "handle_sigterm", "wait_for_user"}
"""Parameters after the transport that the simulator fills by name."""


@dataclass(frozen=True)
class BotEntry:
    """A bot's entry point: the transport goes first, the named parameters after it."""

    spec: str
    fn: BotFn
    parameters: tuple[str, ...]

    async def run(self, transport: Any, runner_args: SimulationRunnerArguments) -> None:
        """Call the entry point with the transport and whatever else it asks for."""
        values = {
            "runner_args": runner_args,
            "args": runner_args,
            "handle_sigint": False,
            "handle_sigterm": False,
            "wait_for_user": False,
        }
        result = self.fn(transport, **{name: values[name] for name in self.parameters})
        if inspect.isawaitable(result):
            await result


def _import(spec: str) -> Any:
    path = Path(spec)
    if spec.endswith(".py"):
        if not path.is_file():
            raise SimulationError(f"--bot {spec}: no such file")
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


def load_bot(spec: str) -> BotEntry:
    """Load `path/to/bot.py[:name]` or `package.module[:name]`; `name` defaults to run_bot."""
    module_spec, _, fn_name = spec.rpartition(":") if ":" in spec else (spec, "", "")
    try:
        module = _import(module_spec)
    except SimulationError:
        raise
    except Exception as e:
        raise SimulationError(f"--bot {spec}: importing it failed: {type(e).__name__}: {e}") from e
    fn_name = fn_name or "run_bot"
    fn = getattr(module, fn_name, None)
    if not callable(fn):
        raise SimulationError(
            f"--bot {spec}: no `{fn_name}` function; define `async def run_bot(transport, "
            "runner_args)` that builds the pipeline on the transport it is given (Pipecat's "
            "example convention), or name another entry point with --bot FILE:FUNCTION"
        )
    params = list(inspect.signature(fn).parameters.values())
    if not params:
        raise SimulationError(f"--bot {spec}: `{fn_name}` takes no transport parameter")
    rest = params[1:]
    missing = [p.name for p in rest if p.name not in _FILLED and p.default is p.empty]
    if missing:
        raise SimulationError(
            f"--bot {spec}: `{fn_name}` needs {', '.join(missing)}, which the simulator cannot "
            f"provide; it fills {', '.join(sorted(_FILLED))} after the transport (give the "
            "others defaults)"
        )
    return BotEntry(spec=spec, fn=fn, parameters=tuple(p.name for p in rest if p.name in _FILLED))
