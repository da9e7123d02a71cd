"""The rubric: an episode's reward as named, weighted parts, each with a declared role.

Every part an episode earns is stored apart (`simulator.rewards` computes them); the rubric says
what each one is for, in the spirit of verifiers' `Rubric(funcs, weights)`:

- `authoritative`: decides whether the call passed (`ledger.outcome`: the verifier, else judged
  success). Exactly the parts `ledger.outcome.AUTHORITATIVE_PARTS` names, in that precedence;
  its weight is 1: a pass is a pass.
- `shaped`: training signal only, never a pass and never a gate score: tool credit (its positive
  side paid only to a call that passed, so extra lookups never pay inside a failing group, and
  not at all when the trainer asks for none: GRPO's default), a failed call's share of goal
  checks that held (partial credit, weight 0.5), and the hard checks it broke (weight -1: a
  forbidden write or transfer earns no partial credit, so it scores at most -1).
- `judged`: a judge's named metric (`judge:<m>`): in the training reward with its weight; the
  gate pairs it only when its config names it (`judged_metrics`).
- `metric`: measured and shown (`metric:<m>`), never in a reward.

A part the rubric does not name takes the role its prefix implies, weight 0 in training: it is
kept and shown but moves nothing until a rubric names it. `simulate`'s stored reward, the
trainer's advantage and the gate's pairing all read one `Rubric`, configured in `loop.yaml`
(`rubric:`), `pipecat-rl train --rubric FILE` or the Python API.
"""

from collections.abc import Mapping
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from pipecat_rl.errors import ConfigError
from pipecat_rl.scoring.outcome import (
    AUTHORITATIVE_PARTS,
    CHECKS_HELD,
    PASS_SCORE,
    SHAPED_PARTS,
    TOOL_CREDIT,
    VIOLATIONS,
    authoritative_score,
)

Role = Literal["authoritative", "shaped", "judged", "metric"]


class Part(BaseModel):
    """One named part of the reward."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    role: Role
    weight: float = Field(default=1.0, ge=-10, le=10, allow_inf_nan=False)
    """Multiplies the part's value in the training reward (authoritative parts weigh 1)."""


def _implied_role(name: str) -> Role:
    if name in AUTHORITATIVE_PARTS:
        return "authoritative"
    if name.startswith("judge:"):
        return "judged"
    if name in SHAPED_PARTS:
        return "shaped"
    return "metric"


class Rubric(BaseModel):
    """Named reward parts with weights and roles; read by the simulator, trainer and gate."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    parts: dict[str, Part] = Field(
        default_factory=lambda: {
            "verifier": Part(role="authoritative"),
            "judge:success": Part(role="authoritative"),
            TOOL_CREDIT: Part(role="shaped", weight=1.0),
            CHECKS_HELD: Part(role="shaped", weight=0.5),
            VIOLATIONS: Part(role="shaped", weight=-1.0),
        }
    )

    @model_validator(mode="after")
    def _roles_fit(self) -> "Rubric":
        for name, part in self.parts.items():
            if (part.role == "authoritative") != (name in AUTHORITATIVE_PARTS):
                raise ValueError(
                    f"part {name!r} cannot be {part.role!r}: the authoritative parts are "
                    f"{', '.join(AUTHORITATIVE_PARTS)} (ledger.outcome), and only they"
                )
            if part.role == "authoritative" and part.weight != 1.0:
                raise ValueError(
                    f"part {name!r} is authoritative: its weight is 1, not {part.weight}"
                )
        return self

    def part(self, name: str) -> Part:
        """The declared part, or the role its name implies with weight 0."""
        return self.parts.get(name) or Part(role=_implied_role(name), weight=0.0)

    def outcome_score(self, values: Mapping[str, float]) -> float | None:
        """The authoritative score (None: unverified); what passes and what the gate pairs."""
        return authoritative_score(values)

    def reward(
        self,
        values: Mapping[str, float],
        *,
        shaped: bool = True,
        positive_tool_credit: bool = True,
    ) -> float | None:
        """The training reward: the authoritative score plus weighted shaped and judged parts.

        None when nothing authoritative decided the call (it cannot be scored against its
        group). `shaped=False` leaves the shaped parts out (outcome-only training). Tool credit's
        positive side counts only on a call that passed: in a failed one, more successful
        lookups would otherwise out-score fewer, and GRPO would learn to call tools for credit;
        `positive_tool_credit=False` drops it on a pass too (acting then never pays for itself,
        where not acting is the right call). A call that broke a hard check earns no partial
        credit (`checks_held`): how close it came does not offset a write it must not make.
        """
        score = self.outcome_score(values)
        if score is None:
            return None
        total = score
        broke_hard_check = float(values.get(VIOLATIONS, 0.0)) > 0
        for name, value in values.items():
            part = self.part(name)
            if part.role == "judged" or (shaped and part.role == "shaped"):
                v = float(value)
                if name == TOOL_CREDIT and (score < PASS_SCORE or not positive_tool_credit):
                    v = min(v, 0.0)
                if name == CHECKS_HELD and broke_hard_check:
                    v = 0.0
                total += part.weight * v
        return round(total, 6)

    def shown(self, values: Mapping[str, float]) -> float:
        """The reward as the simulator stores and shows it: `reward`, or 0 when unverified."""
        return self.reward(values) or 0.0


DEFAULT_RUBRIC = Rubric()
"""Verifier (else judged success) decides; shaping: tool credit at weight 1 (±0.1 per execution,
+ only on a pass), a failed call's checks held at 0.5 (none once it broke a hard check), each
broken hard check at -1."""


def load_rubric(path: Path) -> Rubric:
    """A rubric from a YAML or JSON file (`parts: {name: {role, weight}}`).

    Raises:
        ConfigError: the file is missing or malformed (naming the file and the field).
    """
    import json

    import yaml

    if path.suffix not in (".json", ".yaml", ".yml"):
        raise ConfigError(f"rubric {path}: name a .yaml, .yml or .json file")
    try:
        text = path.read_text()
    except OSError as e:
        raise ConfigError(f"rubric {path}: cannot read it ({e.strerror})") from e
    try:
        data = json.loads(text) if path.suffix == ".json" else yaml.safe_load(text)
    except (ValueError, yaml.YAMLError) as e:
        kind = path.suffix.lstrip(".") or "YAML"
        raise ConfigError(f"rubric {path}: not valid {kind}: {e}") from e
    try:
        return Rubric.model_validate(data or {})
    except ValidationError as e:
        where = "; ".join(
            f"{'.'.join(str(p) for p in err['loc']) or 'rubric'}: {err['msg']}"
            for err in e.errors()
        )
        raise ConfigError(f"rubric {path}: {where}") from e
