"""pass^k: how reliably a policy passes a scenario k times in a row (tau-bench's measure).

`simulate` prints it per scenario, the gate draws each policy's curve; both read it from here.
"""

import math
from collections.abc import Sequence


def pass_hat_k(passed: int, n: int, k: int) -> float:
    """Unbiased pass^k of one scenario with `passed` of `n` runs passing: C(passed,k) / C(n,k)."""
    if not 0 <= passed <= n or not 1 <= k <= n:
        raise ValueError(f"need 0 <= passed <= n and 1 <= k <= n, got {passed=}, {n=}, {k=}")
    return math.comb(passed, k) / math.comb(n, k)


def pass_k_curve(passed_of_n: Sequence[tuple[int, int]]) -> dict[int, float]:
    """A policy's pass^k for k = 1..min(n): the mean over scenarios of `pass_hat_k`.

    Args:
        passed_of_n: per scenario, (runs passed, runs total).
    """
    if not passed_of_n:
        return {}
    k_max = min(n for _, n in passed_of_n)
    return {
        k: sum(pass_hat_k(c, n, k) for c, n in passed_of_n) / len(passed_of_n)
        for k in range(1, k_max + 1)
    }
