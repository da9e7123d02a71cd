"""The ledger's records: frozen pydantic models, one per table, kept apart from the store.

Times are unix seconds as floats; durations are milliseconds. JSON-typed fields are stored as JSON
text, so a record read back equals the record written.
"""

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from pipecat_rl.ledger.eligibility import token_exact
from pipecat_rl.scoring.outcome import SessionOutcome

Source = Literal["live", "simulate", "gate"]
"""Where a session came from: a real call, a simulated episode, or a gate evaluation run."""

Split = Literal["pool", "heldout"] | None
"""The scenario split of a simulated session; `None` for live calls."""

BASE_ADAPTER = "base"
"""The live-pointer name meaning "no adapter: serve the base model"."""


class _Record(BaseModel):
    """Shared configuration: immutable, and unknown fields are an error rather than lost."""

    model_config = ConfigDict(frozen=True, extra="forbid")


class SessionRecord(_Record):
    """One call or episode: who served it, which scenario, how it ended, whether it may train."""

    id: str
    source: Source
    started_at: float
    ended_at: float | None = None
    scenario_id: str | None = None
    scenario_hash: str | None = None
    split: Split = None
    heldout_set_id: str | None = None
    policy: str | None = None
    """The adapter name served, or the base model's name."""
    seed: int | None = None
    repeat: int | None = None
    outcome: SessionOutcome | None = None
    """Whose hand ended it and how: the recorder's, the simulator's verdict, or the harness's."""
    reward: float | None = None
    reward_parts: dict[str, float] = Field(default_factory=dict)
    failure_labels: list[str] = Field(default_factory=list)
    excluded_from_training: bool = False
    consent: bool = True
    metadata: dict[str, Any] = Field(default_factory=dict)


class TurnRecord(_Record):
    """One LLM call exactly as the server saw it, plus what the caller actually heard.

    Only a turn whose token ids and logprobs came from the server itself (`token_exact`) can become
    a training row: re-tokenising text gives different ids than the ones the policy sampled.
    """

    session_id: str
    index: int
    adapter: str | None
    created_at: float
    request: dict[str, Any]
    """Messages, tools, sampling settings and model, exactly as sent."""
    prompt_token_ids: list[int] | None = None
    completion_token_ids: list[int] | None = None
    logprobs: list[float] | None = None
    """One per completion token, as returned by the server."""
    token_exact: bool = False
    """True only when the ids and logprobs came from the server, never from re-tokenising text."""
    generated_text: str = ""
    spoken_text: str | None = None
    interrupted: bool = False
    finish_reason: str | None = None
    usage: dict[str, int] = Field(default_factory=dict)
    tool_calls: list[dict[str, Any]] = Field(default_factory=list)
    """As the model emitted them: id, name, arguments."""
    timestamps: dict[str, float] = Field(default_factory=dict)
    """Per-stage times such as llm_request, llm_first_token, llm_done."""
    redacted: bool = False
    demonstration: bool = False
    """A turn of a scripted / non-served policy (an expert): may train SFT, never GRPO or OPSD.

    It carries the request and the reply (text, tool calls) but no sampled ids or logprobs: the
    trainer renders it with the served model's own chat template."""

    @property
    def trainable(self) -> bool:
        """Whether this turn carries everything a policy-gradient row needs, from the server.

        The same rule the ledger's queries select by (`eligibility.TOKEN_EXACT`).
        """
        return token_exact(self)


class ToolCallRecord(_Record):
    """One tool execution: what was asked, what came back, how long it took, what it changed."""

    session_id: str
    turn_index: int | None
    call_id: str | None
    name: str
    arguments: dict[str, Any]
    result: Any = None
    error: str | None = None
    started_at: float
    duration_ms: float | None = None
    state_diff: dict[str, Any] | None = None


# derived field -> (start timestamp, end timestamp)
_DERIVED: dict[str, tuple[str, str]] = {
    "endpointing_ms": ("user_stopped_at", "stt_final_at"),
    "llm_ttft_ms": ("llm_request_at", "llm_first_token_at"),
    "tts_ttfb_ms": ("llm_first_token_at", "tts_first_audio_at"),
    "v2v_ms": ("user_stopped_at", "bot_started_at"),
}


class LatencyRecord(_Record):
    """Per-stage timing of one user turn, so a slow P95 can be attributed to a stage.

    Derived stages (see `from_timestamps`), all in milliseconds:

    - `endpointing_ms` = `stt_final_at` - `user_stopped_at`: from the user actually stopping to the
      final transcript being available (VAD stop_secs plus STT finalisation).
    - `llm_ttft_ms` = `llm_first_token_at` - `llm_request_at`.
    - `tts_ttfb_ms` = `tts_first_audio_at` - `llm_first_token_at`.
    - `v2v_ms` = `bot_started_at` - `user_stopped_at`: voice to voice, as the pipeline sees it.
    - `stt_ms` is never derived: the caller passes it (Pipecat's STT TTFB metric).
    - `heard_gap_ms` is measured caller-side in simulation (end of caller audio to the first
      non-silent agent audio it receives) and is never derived.
    - `response_gap_ms` is its text-mode counterpart (caller line sent to the agent's first text
      received): never voice to voice, never derived.
    """

    session_id: str
    user_turn: int
    user_stopped_at: float | None = None
    stt_final_at: float | None = None
    llm_request_at: float | None = None
    llm_first_token_at: float | None = None
    tts_first_audio_at: float | None = None
    bot_started_at: float | None = None
    bot_stopped_at: float | None = None
    heard_gap_ms: float | None = None
    endpointing_ms: float | None = None
    stt_ms: float | None = None
    llm_ttft_ms: float | None = None
    tts_ttfb_ms: float | None = None
    v2v_ms: float | None = None
    interrupted: bool = False
    response_gap_ms: float | None = None

    @classmethod
    def from_timestamps(
        cls,
        session_id: str,
        user_turn: int,
        *,
        user_stopped_at: float | None = None,
        stt_final_at: float | None = None,
        llm_request_at: float | None = None,
        llm_first_token_at: float | None = None,
        tts_first_audio_at: float | None = None,
        bot_started_at: float | None = None,
        bot_stopped_at: float | None = None,
        heard_gap_ms: float | None = None,
        endpointing_ms: float | None = None,
        stt_ms: float | None = None,
        llm_ttft_ms: float | None = None,
        tts_ttfb_ms: float | None = None,
        v2v_ms: float | None = None,
        interrupted: bool = False,
    ) -> "LatencyRecord":
        """Build a record from stage timestamps, deriving each stage whose two endpoints are known.

        A stage whose endpoints are missing, or out of order, stays None; a stage given
        explicitly wins over the derived value (for example a TTFB Pipecat measured more precisely).
        """
        values: dict[str, Any] = {
            "user_stopped_at": user_stopped_at,
            "stt_final_at": stt_final_at,
            "llm_request_at": llm_request_at,
            "llm_first_token_at": llm_first_token_at,
            "tts_first_audio_at": tts_first_audio_at,
            "bot_started_at": bot_started_at,
            "bot_stopped_at": bot_stopped_at,
        }
        explicit = {
            "endpointing_ms": endpointing_ms,
            "llm_ttft_ms": llm_ttft_ms,
            "tts_ttfb_ms": tts_ttfb_ms,
            "v2v_ms": v2v_ms,
        }
        for name, (start, end) in _DERIVED.items():
            given = explicit[name]
            if given is not None:
                values[name] = given
            elif values[start] is not None and values[end] is not None:
                span = (values[end] - values[start]) * 1000.0
                # endpoints out of order (e.g. an STT final of an earlier segment, before the
                # user stopped): this turn did not measure the stage, so it stays unknown
                values[name] = span if span >= 0 else None
            else:
                values[name] = None
        return cls(
            session_id=session_id,
            user_turn=user_turn,
            heard_gap_ms=heard_gap_ms,
            stt_ms=stt_ms,
            interrupted=interrupted,
            **values,
        )


SIMULATOR_SCORE_SOURCE = "simulator"
"""The source of the scores an episode's own result writes (its reward parts and judge metrics)."""


class ScoreRecord(_Record):
    """A named number about a session (a reward part, a judge metric), with its working.

    One per (session, name, source): a score posted again by the same source replaces the first,
    so a retried webhook never duplicates. `source` says who scored it: the simulator for an
    episode's own parts, else the platform or person that posted it (`ledger.scores`).
    """

    session_id: str
    name: str
    value: float
    detail: dict[str, Any] = Field(default_factory=dict)
    source: str = SIMULATOR_SCORE_SOURCE
    explanation: str | None = None
    """Why the scorer decided so (a judge's reason, a reviewer's note): an OPSD hint's material."""
    external_id: str | None = None
    """The scorer's own id for this score (a platform's evaluation id), kept for tracing."""
    received_at: float | None = None


class AdapterRecord(_Record):
    """A LoRA adapter and its lineage; names are never reused, so a name identifies weights."""

    name: str
    path: str
    base_model: str
    parent: str | None = None
    created_at: float
    training_run: dict[str, Any] | None = None
    """None when imported from elsewhere; else {"id": ..., "guard": {...} | None, ...}."""
    training_data: list[str] = Field(default_factory=list)
    """The session ids it was trained on."""
    config: dict[str, Any] = Field(default_factory=dict)
    metrics: dict[str, Any] = Field(default_factory=dict)


class LivePointer(_Record):
    """One move of the live pointer: which adapter serves from when, on whose receipt."""

    adapter: str
    moved_at: float
    receipt: str | None = None
    previous: str | None = None
