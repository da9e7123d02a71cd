"""On-policy distillation: the student rolls out, a teacher answers at the student's own states.

SFT from demonstrations teaches the teacher's actions at the teacher's states; a student that
strays (a wrong slot, an early goodbye) reaches states no demonstration covers, and its errors
compound there. Here every online step rolls the current version out on the pool and asks the
teacher about each turn the student sampled (DAgger's loop; GKD's on-policy distillation):

- a **logprob teacher**, a vLLM URL serving a model with the student's tokenizer (e.g. a 7B of
  the same family): it scores the student's own sampled tokens (`prompt_logprobs`, one prefill a
  turn) and the student is trained on the per-token reverse KL to it (`loss.reverse_kl_loss`:
  the score-function form, weighted by teacher minus student logprob), so it learns where the
  teacher would have said something else without the teacher generating anything;
- a **reply teacher**, `FILE.py:FUNCTION`, a scripted policy (OpenAI messages -> `ScriptedReply`)
  such as the clinic's expert: its reply at the student's prompt is rendered with the student's
  chat template and trained by SFT where it differs from what the student said (with
  `distill_agreed`, where it agrees too; with `distill_anchors`, beside each correction a state
  where it agreed at the same decision; with `distill_balanced`, every state, each correction
  repeated as often as its decision's agreed states outnumber its corrections); the labels of
  every step so far train together (DAgger's aggregated dataset).

A teacher that cannot be reached, returns no logprobs or tokenises differently is refused before
any rollout (`load_teacher`).
"""

import copy
import json
import math
import time
from collections import Counter
from collections.abc import Callable, Sequence
from typing import Any

import torch
from loguru import logger

from pipecat_rl.errors import ConfigError, NoTrainingSignalError, ServingError, TrainingError
from pipecat_rl.ledger import TurnRecord
from pipecat_rl.serving.server import VLLMAdmin
from pipecat_rl.training.config import TrainConfig, TrainedStates, teacher_kind
from pipecat_rl.training.loss import reverse_kl_loss
from pipecat_rl.training.policy import Policy
from pipecat_rl.training.prefix import PrefixBatch, batch_scores, prefix_batches
from pipecat_rl.training.rows import (
    TrainableTurn,
    TrainingSequence,
    mini_batches,
    token_weighted,
    turn_sequence,
)
from pipecat_rl.training.sft import grad_norm

TOKENIZER_PROBE = "Hello! I'd like to book a checkup for Tuesday at 3pm, please. Thanks."
"""Text both tokenisers must split alike before a teacher may score the student's ids."""


# -- reply teachers: a scripted policy ---------------------------------------------------------


def _calls(reply_calls: Sequence[tuple[str, dict[str, Any]]]) -> list[dict[str, Any]]:
    return [{"name": n, "arguments": a} for n, a in reply_calls]


def _arguments(value: Any) -> Any:
    """A call's arguments as data: a recorded call keeps the JSON text the model wrote."""
    if isinstance(value, str):
        try:
            return json.loads(value)
        except ValueError:
            return value  # malformed: compared as written
    return value


def _same_calls(a: Sequence[dict[str, Any]], b: Sequence[dict[str, Any]]) -> bool:
    def key(calls: Sequence[dict[str, Any]]) -> list[str]:
        return [
            json.dumps([c["name"], _arguments(c["arguments"])], sort_keys=True) for c in calls
        ]

    return key(a) == key(b)


def _decision(label: TurnRecord) -> tuple[str, ...]:
    """What a reply decides, as far as anchoring goes: the tools it calls (none: just talk)."""
    return tuple(sorted(c["name"] for c in label.tool_calls))


class ReplyTeacher:
    """A scripted policy as the teacher: its reply at each of the student's states.

    Labels are kept per turn for the whole run: a step's retry re-reads them, and every step
    trains on all of them (the DAgger dataset), newest states included. `states`: which train —
    the corrections (where the teacher differs); `anchored`, beside them as many states where it
    agreed at the same decision (its reply calls the same tools); `all`, every visited state
    (DAgger's aggregate); `balanced`, every visited state with each correction repeated until its
    decision's corrections are as many as its agreed states. Anchors exist because a rare
    correction among many agreed states at the same decision is drowned by them (round 2 of the
    learning comparison), and one trained alone becomes a habit rather than a condition: the
    emergency slot learnt for every booking (round 3). Balanced keeps every other decision's
    states as anchors too, and weights the correction up only against its own decision.
    """

    kind = "replies"

    def __init__(
        self, name: str, policy: Callable[[list[dict[str, Any]]], Any], *,
        states: TrainedStates = "corrections",
    ):  # fmt: skip
        self.name = name
        self.policy = policy
        self.states = states
        self.labels: dict[tuple[str, int], TurnRecord] = {}
        """Per student turn: the teacher's reply at its prompt, as a demonstration."""
        self.agreed: set[tuple[str, int]] = set()
        """The turns where the teacher said what the student did."""
        self.unanswered: dict[tuple[str, int], str] = {}
        """The turns the teacher raised on (a state its rules never meet), with the error."""

    def label(self, turn: TurnRecord) -> TurnRecord | None:
        """The teacher's reply at `turn`'s prompt as a demonstration; None when it agrees.

        Also None when it cannot answer (a student's state a scripted policy was never written
        for): skipped and counted, never the end of the run.
        """
        key = (turn.session_id, turn.index)
        if key in self.unanswered:
            return None
        if key not in self.labels:
            messages = copy.deepcopy(list(turn.request.get("messages") or []))
            try:
                reply = self.policy(messages)
            except Exception as e:
                self.unanswered[key] = f"{type(e).__name__}: {e}"
                if len(self.unanswered) == 1:
                    logger.warning(
                        f"the teacher {self.name} raised at {turn.session_id}#{turn.index} "
                        f"({self.unanswered[key]}); such states are skipped and counted "
                        "(teacher_unanswered)"
                    )
                return None
            calls = _calls(reply.tool_calls)
            said = " ".join((turn.generated_text or "").split())
            if said == " ".join(reply.text.split()) and _same_calls(turn.tool_calls, calls):
                self.agreed.add(key)
            self.labels[key] = turn.model_copy(
                update={
                    "adapter": self.name, "demonstration": True, "token_exact": False,
                    "prompt_token_ids": None, "completion_token_ids": None, "logprobs": None,
                    "generated_text": reply.text, "spoken_text": None,
                    "tool_calls": [{"id": f"call_{k}", **c} for k, c in enumerate(calls)],
                }
            )  # fmt: skip
        return None if key in self.agreed else self.labels[key]

    def training_labels(self) -> list[TurnRecord]:
        """The labels that train, by `states`, in the order the states were labelled.

        Anchored: per decision, the first agreed states up to the number of its corrections
        (a correction that only talks is anchored by agreed states that only talk); for
        `corrections` no decision has room, so no agreed state is kept. Balanced: every state, a
        correction `ceil(agreed / corrected)` times at its decision (at least once).
        """
        corrected = Counter(_decision(d) for k, d in self.labels.items() if k not in self.agreed)
        agreed = Counter(_decision(d) for k, d in self.labels.items() if k in self.agreed)
        room = corrected.copy() if self.states == "anchored" else Counter()
        kept = []
        for key, label in self.labels.items():
            d = _decision(label)
            if key not in self.agreed:
                times = math.ceil(agreed[d] / corrected[d]) if self.states == "balanced" else 1
                kept.extend([label] * max(1, times))
            elif self.states in ("all", "balanced") or room[d] > 0:
                room[d] -= 1
                kept.append(label)
        return kept


# -- logprob teachers: a served model ----------------------------------------------------------


class LogprobTeacher:
    """A model on a vLLM server as the teacher: its logprob of each token the student sampled."""

    kind = "logprobs"

    def __init__(self, url: str, model: str | None = None):
        self.admin = VLLMAdmin(url, option="--teacher")
        self.url = url
        served = self.admin.models()
        if model is not None and model not in served:
            raise ConfigError(
                f"--teacher-model {model}: the teacher at {url} serves {', '.join(served)}"
            )
        self.name = model or served[0]
        self.scored: dict[tuple[str, int], list[float]] = {}

    def check(self, tokenizer: Any) -> None:
        """Refuse a teacher whose tokenizer differs from the student's, or that gives no logprobs.

        Its logprobs are of the student's token ids: under another vocabulary they would be of
        other words, silently.
        """
        theirs = self.admin.tokenize(self.name, TOKENIZER_PROBE)
        ours = list(tokenizer.encode(TOKENIZER_PROBE, add_special_tokens=False))
        if theirs != ours:
            raise TrainingError(
                f"the teacher {self.name} at {self.url} tokenises differently from the student "
                f"({len(theirs)} vs {len(ours)} ids for the same text): it scores the student's "
                "own token ids, so it must share the student's tokenizer (serve a model of the "
                "same family, or give a scripted teacher FILE.py:FUNCTION)"
            )
        self.admin.prompt_logprobs(self.name, ours)

    def score(self, turn: TurnRecord) -> list[float]:
        """The teacher's logprob of each id `turn` sampled, at the student's prompt."""
        key = (turn.session_id, turn.index)
        if key not in self.scored:
            prompt = list(turn.prompt_token_ids or ())
            sampled = list(turn.completion_token_ids or ())
            scored = self.admin.prompt_logprobs(self.name, [*prompt, *sampled])
            self.scored[key] = scored[len(prompt) - 1 :]
        return self.scored[key]


def load_teacher(config: TrainConfig, tokenizer: Any) -> ReplyTeacher | LogprobTeacher:
    """The run's teacher, checked: reachable, and (a model) giving logprobs on the student's ids.

    Raises:
        ConfigError: a scripted teacher's file or function is missing.
        ServingError / TrainingError: a served teacher cannot be reached or cannot score ids.
    """
    spec = config.teacher or ""
    if teacher_kind(spec) == "logprobs":
        try:
            teacher = LogprobTeacher(spec, config.teacher_model)
            teacher.check(tokenizer)
        except ServingError as e:
            raise TrainingError(f"the teacher at {spec} cannot score the student's ids: {e}") from e
        return teacher
    from pipecat_rl.simulator.botloader import import_module_spec

    path, _, function = spec.rpartition(":")
    if not path or not function:
        raise ConfigError(
            f"--teacher {spec}: give a vLLM URL (http://host:8000/v1) or a scripted policy as "
            "FILE.py:FUNCTION (a function from OpenAI messages to a ScriptedReply)"
        )
    policy = getattr(import_module_spec(path, option="--teacher"), function, None)
    if not callable(policy):
        raise ConfigError(f"--teacher {spec}: {path} defines no function `{function}`")
    return ReplyTeacher(function, policy, states=config.distill_states)


# -- the updates ---------------------------------------------------------------------------------


def reply_sequences(
    teacher: ReplyTeacher, turns: Sequence[TurnRecord], tokenizer: Any
) -> tuple[list[TrainingSequence], dict[str, Any]]:
    """Label `turns`, then the SFT sequences of every label so far; and the step's counts."""
    fresh = [teacher.label(t) for t in turns]
    labels = teacher.training_labels()
    sequences = [turn_sequence(TrainableTurn.from_turn(demo, tokenizer)) for demo in labels]
    keys = [(t.session_id, t.index) for t in turns]
    answered = [k for k in keys if k not in teacher.unanswered]
    agreed = sum(k in teacher.agreed for k in answered)
    counts = {
        "teacher_agreement": round(agreed / len(answered), 6) if answered else None,
        "teacher_labels": sum(d is not None for d in fresh),
        "teacher_unanswered": len(keys) - len(answered),
        "dagger_rows": len(labels),
        "dagger_corrections": sum((d.session_id, d.index) not in teacher.agreed for d in labels),
    }
    if not sequences:
        why = (
            f"raised at all {len(keys)} of them (first: {next(iter(teacher.unanswered.values()))})"
            if keys and not answered
            else f"says what the student said at all {len(answered)} it answered"
        )
        raise NoTrainingSignalError(
            f"the teacher {teacher.name} {why} of the student's sampled turns: nothing to "
            "distil (roll out scenarios the student fails)"
        )
    return sequences, counts


def _logprob_sequences(
    teacher: LogprobTeacher, turns: Sequence[TurnRecord]
) -> tuple[list[TrainingSequence], dict[int, torch.Tensor]]:
    """One sequence per sampled turn, and the teacher's logprobs of its sampled ids (by id())."""
    sequences, teacher_of = [], {}
    for turn in turns:
        seq = turn_sequence(TrainableTurn.from_turn(turn))
        sequences.append(seq)
        teacher_of[id(seq)] = torch.tensor(teacher.score(turn), dtype=torch.float32)
    return sequences, teacher_of


def _kl_step(
    student: Policy, optimizer: torch.optim.Optimizer, batches: Sequence[PrefixBatch],
    teacher_of: dict[int, torch.Tensor], config: TrainConfig,
) -> dict[str, Any]:  # fmt: skip
    """One optimiser step of per-token reverse KL to the teacher over `batches`."""
    started = time.monotonic()
    num_tokens = sum(b.num_loss_tokens for b in batches)
    optimizer.zero_grad(set_to_none=True)
    student.model.train()
    total = gap = teacher_sum = 0.0
    for batch in batches:
        scores = batch_scores(student.model, batch)
        teacher = torch.cat([teacher_of[id(s)] for s in batch.sequences])
        loss = reverse_kl_loss(scores.logprobs, teacher, num_tokens=num_tokens)
        loss.backward()
        total += loss.item()
        gap += float((scores.logprobs.detach() - teacher).sum())
        teacher_sum += float(teacher.sum())
    norm = grad_norm(student)
    torch.nn.utils.clip_grad_norm_(
        [p for p in student.model.parameters() if p.requires_grad], config.max_grad_norm
    )
    optimizer.step()
    return {
        "distill_loss": round(total, 6),
        "kl/reverse_sampled": round(gap / max(num_tokens, 1), 6),
        "teacher_logprob": round(teacher_sum / max(num_tokens, 1), 6),
        "grad_norm": round(norm, 6),
        "num_tokens": num_tokens,
        "step_time": round(time.monotonic() - started, 3),
    }


def logprob_update(
    student: Policy, optimizer: torch.optim.Optimizer, teacher: LogprobTeacher,
    turns: Sequence[TurnRecord], config: TrainConfig,
    *, on_step: Callable[[dict[str, Any]], None] | None = None,
) -> dict[str, Any]:  # fmt: skip
    """One pass over a step's sampled turns in `mini_batches` optimiser steps.

    `kl/reverse_sampled` (student minus teacher logprob per sampled token, measured before each
    step's update) is the run's curve: the reverse KL on the student's own samples.
    """
    sequences, teacher_of = _logprob_sequences(teacher, turns)
    steps = []
    for index, chunk in enumerate(mini_batches(sequences, config.mini_batches), start=1):
        batches = prefix_batches(
            chunk, max_sequences=config.batch_sequences, max_tokens=config.batch_tokens
        )
        metrics = {
            "optimizer_step": index,
            **_kl_step(student, optimizer, batches, teacher_of, config),
        }
        if on_step is not None:
            on_step(metrics)
        steps.append(metrics)
    weighted = token_weighted(steps, ("kl/reverse_sampled", "teacher_logprob"))
    return {
        **steps[-1], **weighted, "optimizer_steps": len(steps),
        "num_tokens": sum(m["num_tokens"] for m in steps),
        "distilled_turns": len(sequences),
        "step_time": round(sum(m["step_time"] for m in steps), 3),
    }  # fmt: skip
