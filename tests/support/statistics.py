"""The chi-square goodness-of-fit statistic the distribution guards use.

Six categories (dof 5); reject above 25.7448, the upper 1e-4 quantile of chi-square(5): a
correct rule fails by chance once in ten thousand runs, and the runs are seeded anyway.
"""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Sequence

CRITICAL_DOF5_ALPHA_1E4 = 25.7448
DEFAULT_SAMPLES = 12_000


def sample_count() -> int:
    return int(os.environ.get("MLXCEL_SPEC_DIST_SAMPLES", DEFAULT_SAMPLES))


def chi_square(stream: Sequence[int], categories: Sequence[int], probs: Sequence[float]) -> float:
    """Sum over categories of (observed - expected)^2 / expected; off-support tokens count as misses."""
    counts = Counter(stream)
    n = len(stream)
    stat = sum((counts[c] - n * p) ** 2 / (n * p) for c, p in zip(categories, probs, strict=True))
    outside = n - sum(counts[c] for c in categories)
    return stat + (float("inf") if outside else 0.0)
