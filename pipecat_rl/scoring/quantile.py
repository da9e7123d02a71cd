"""The one quantile estimator: every P50, P95 and CDF the project prints or gates on.

Inverted-CDF (a value that was measured, never an interpolation between two turns), so a P95 read
in `simulate`'s table is the same number the gate's latency checks start from.
"""

from collections.abc import Sequence

import numpy as np

P50 = 0.5
P95 = 0.95


def quantile(values: Sequence[float], q: float) -> float:
    """The inverted-CDF q-quantile of `values` (not empty)."""
    return float(np.quantile(np.asarray(values, dtype=float), q, method="inverted_cdf"))


def quantile_or_none(values: Sequence[float], q: float) -> float | None:
    """`quantile`, or None when nothing was measured (a table's empty cell)."""
    return quantile(values, q) if len(values) else None


def p95(values: Sequence[float]) -> float | None:
    """The P95 of `values`, or None when nothing was measured."""
    return quantile_or_none(values, P95)
