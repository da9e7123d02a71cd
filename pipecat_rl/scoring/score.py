"""The score the gate pairs: the authoritative part, averaged with the judged parts it names."""

import math
from collections.abc import Mapping

from pipecat_rl.scoring.outcome import authoritative_score


def gate_score(parts: Mapping[str, float], judged: Mapping[str, float]) -> float | None:
    """The score the gate pairs: the authoritative part, averaged with the named judged parts.

    (authoritative + sum w_i * part_i) / (1 + sum w_i), in [0, 1]; None when the run has no
    authoritative part (unverified). The shaped `tool_credit` is never part of it.

    Raises:
        ValueError: a part is missing, not finite, or outside [0, 1] (naming it).
    """
    score = authoritative_score(parts)
    if score is None:
        return None
    total, weight = score, 1.0
    for name, w in judged.items():
        if name not in parts:
            raise ValueError(f"reward part {name!r}, named by the gate config, is missing")
        value = parts[name]
        if not isinstance(value, int | float) or not math.isfinite(value) or not 0 <= value <= 1:
            raise ValueError(f"reward part {name!r} is {value!r}; it must be a number in [0, 1]")
        total += w * value
        weight += w
    return total / weight
