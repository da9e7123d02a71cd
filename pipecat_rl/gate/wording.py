"""How a receipt writes its numbers and names its checks: one format per quantity.

The checks' sentences in receipt.json, receipt.md and receipt.html all format through these, so
a score delta reads +0.542 wherever it appears, a rate 79.2%, a duration 1,234 ms, a ratio 9.6x
and an interval "95% CI +0.336 to +0.747". A person comparing the three never has to wonder
whether 0.5417 and +0.542 are the same number.
"""

from collections.abc import Callable, Sequence

CHECK_TITLES: dict[str, str] = {
    "paired_reward": "Paired score, candidate − incumbent",
    "regressions": "Regressions",
    "regression_suite": "No regression on the regression suite",
    "p95_budget": "P95 latency against the budget",
    "p95_vs_incumbent": "P95 latency against the incumbent",
    "llm_ttft_ratio": "LLM time to first token per call",
    "llm_turn_ratio": "LLM time per call",
    "caller_gap_budget": "Caller-perceived gap P95 against the budget",
    "time_to_yield_ratio": "Time to yield P95 against the incumbent",
    "time_to_yield_budget": "Time to yield P95 against the budget",
    "false_interruption_diff": "False interruptions against the incumbent",
    "false_interruption_rate": "False interruptions against the limit",
    "unauthorized_writes": "Unauthorised writes",
    "unusable_runs": "Unusable runs",
    "training_guard": "Training guard",
}
"""Each check's name in words (the receipt's `checks[].name` is the stable identifier)."""

CHECK_SHORT: dict[str, str] = {
    "paired_reward": "score",
    "regressions": "regressions",
    "regression_suite": "regression suite",
    "p95_budget": "voice-to-voice P95",
    "p95_vs_incumbent": "voice-to-voice P95",
    "llm_ttft_ratio": "LLM latency",
    "llm_turn_ratio": "LLM latency",
    "caller_gap_budget": "caller-perceived gap",
    "time_to_yield_ratio": "turn-taking",
    "time_to_yield_budget": "turn-taking",
    "false_interruption_diff": "turn-taking",
    "false_interruption_rate": "turn-taking",
    "unauthorized_writes": "unauthorised writes",
    "unusable_runs": "unusable runs",
    "training_guard": "training guard",
}
"""What a check looks at, in a word or two, for the verdict sentence's "not checked" list."""

STATUS_WORDS: dict[str, str] = {
    "pass": "passed",
    "fail": "failed",
    "uncertain": "cannot tell yet",
    "unavailable": "not checked",
}
"""A check's status as the reasons say it."""

PER_CALL_VS_TURN = (
    "Per call: one request to the model; per caller turn: everything between the caller's line "
    "and the agent's answer, tool rounds included."
)
"""The one line that tells the two latency units apart, in receipt.md and receipt.html."""


def delta(x: float) -> str:
    """A score delta (or a score threshold on one): `+0.542`."""
    return f"{x:+.3f}"


def rate(x: float) -> str:
    """A share or a rate: `79.2%`."""
    return f"{x:.1%}"


def ms(x: float, *, signed: bool = False) -> str:
    """A duration: `1,234 ms` (`+120 ms` for a difference)."""
    return f"{x:+,.0f} ms" if signed else f"{x:,.0f} ms"


def ratio(x: float) -> str:
    """A candidate / incumbent ratio to two significant figures: `0.41x`, `1.0x`, `9.6x`, `12x`."""
    rounded = float(f"{x:.2g}")
    return f"{rounded:,.0f}x" if abs(rounded) >= 10 else f"{x:#.2g}x"


def p_value(p: float) -> str:
    """A p-value to two significant figures: `0.00012`."""
    return f"{p:.2g}"


def plain(x: float) -> str:
    """A small measured number without exponent or trailing zeros: `0.000137`, `0.02`."""
    text = f"{x:.6f}".rstrip("0").rstrip(".")
    return text if text not in ("", "-0") else "0"


def interval(low: float, high: float, fmt: Callable[[float], str] = delta) -> str:
    """A 95% interval in words: `95% CI +0.336 to +0.747`."""
    return f"95% CI {fmt(low)} to {fmt(high)}"


def count(n: int, noun: str, plural: str | None = None) -> str:
    """`1 write`, `2 writes`, `no write` (`plural` when adding an s is wrong)."""
    if n == 0:
        return f"no {noun}"
    return f"{n:,} {noun if n == 1 else plural or noun + 's'}"


def join_and(items: Sequence[str]) -> str:
    """`a`, `a and b`, `a, b and c`."""
    items = [i for i in items if i]
    if len(items) <= 1:
        return "".join(items)
    return ", ".join(items[:-1]) + " and " + items[-1]


def sentence(text: str) -> str:
    """`text` as a sentence: a capital first letter and a closing full stop."""
    text = text.strip()
    if not text:
        return text
    text = text[0].upper() + text[1:]
    return text if text.endswith((".", "!", "?")) else text + "."
