"""The chi-square goodness-of-fit statistic the distribution guards use, and their sample size.

Six categories (dof 5); reject above 25.7448, the upper 1e-4 quantile of chi-square(5): a
correct rule fails by chance once in ten thousand runs, and the runs are seeded anyway.

The sample size comes from the guard's power, not from habit: the fewest tokens (in steps of
STEP) at which a stream whose distribution is off by Cohen's w = SMALLEST_EFFECT (w^2 is the sum of
(p_wrong - p)^2 / p over the categories: a "small" effect, far below any wrong rule this suite's
power tests plant) is rejected with probability at least POWER. That is 5,000 tokens; the guards
used 12,000 by habit (power 1 - 4e-10 there), which cost the suite minutes on two cores.
"""

from __future__ import annotations

import math
import os
from collections import Counter
from collections.abc import Sequence

DOF = 5
CRITICAL_DOF5_ALPHA_1E4 = 25.7448
SMALLEST_EFFECT = 0.1  # Cohen's w the guards must see
POWER = 0.99  # the chance they see it
STEP = 500


def chi_square(stream: Sequence[int], categories: Sequence[int], probs: Sequence[float]) -> float:
    """Sum over categories of (observed - expected)^2 / expected; off-support tokens count as misses."""
    counts = Counter(stream)
    n = len(stream)
    stat = sum((counts[c] - n * p) ** 2 / (n * p) for c, p in zip(categories, probs, strict=True))
    outside = n - sum(counts[c] for c in categories)
    return stat + (float("inf") if outside else 0.0)


def rejection_chance(n: int, effect: float, critical: float = CRITICAL_DOF5_ALPHA_1E4) -> float:
    """P(statistic > critical) for n draws from a distribution off by Cohen's `effect`: the tail
    of the noncentral chi-square(DOF, n * effect^2), a Poisson mixture of central ones."""
    half_noncentrality, y = n * effect * effect / 2, critical / 2
    below, j = 0.0, 0
    while True:
        if half_noncentrality == 0:  # no effect: the central chi-square
            return 1.0 - _lower_gamma(DOF / 2, y)
        weight = math.exp(-half_noncentrality + j * math.log(half_noncentrality) - math.lgamma(j + 1))
        below += weight * _lower_gamma(DOF / 2 + j, y)
        if j > half_noncentrality and weight < 1e-18:
            return 1.0 - below
        j += 1


def _lower_gamma(a: float, y: float) -> float:
    """The regularized lower incomplete gamma P(a, y) for a half-integer a: P(1/2, y) = erf(sqrt y),
    and P(s + 1, y) = P(s, y) - y^s e^-y / Gamma(s + 1)."""
    s, p = 0.5, math.erf(math.sqrt(y))
    while s < a - 1e-9:
        p -= math.exp(s * math.log(y) - y - math.lgamma(s + 1))
        s += 1
    return p


def powered_samples(effect: float = SMALLEST_EFFECT, power: float = POWER) -> int:
    n = STEP
    while rejection_chance(n, effect) < power:
        n += STEP
    return n


DEFAULT_SAMPLES = powered_samples()


def sample_count() -> int:
    return int(os.environ.get("MLXCEL_SPEC_DIST_SAMPLES", DEFAULT_SAMPLES))
