"""The distribution guards' sample size is their power computation's (tests/support/statistics.py):
the computation is checked against the chi-square's known quantile and against simulation."""

from __future__ import annotations

import numpy as np
import pytest

from tests.support.statistics import (
    CRITICAL_DOF5_ALPHA_1E4,
    DEFAULT_SAMPLES,
    POWER,
    SMALLEST_EFFECT,
    STEP,
    chi_square,
    rejection_chance,
)

P = np.array([0.35, 0.25, 0.15, 0.12, 0.08, 0.05])


def off_by(effect: float) -> np.ndarray:
    """A distribution at Cohen's w = `effect` from P: mass moved from the first category to the last."""
    direction = np.array([-1.0, 0, 0, 0, 0, 1.0])
    scale = effect / np.sqrt(np.sum(direction**2 / P))
    return P + scale * direction


def test_no_effect_is_rejected_at_alpha() -> None:
    assert abs(rejection_chance(0, SMALLEST_EFFECT) - 1e-4) < 1e-8
    assert abs(rejection_chance(10_000, 0.0) - 1e-4) < 1e-8


def test_the_default_size_is_the_fewest_that_reach_the_power() -> None:
    assert rejection_chance(DEFAULT_SAMPLES, SMALLEST_EFFECT) >= POWER
    assert rejection_chance(DEFAULT_SAMPLES - STEP, SMALLEST_EFFECT) < POWER
    assert DEFAULT_SAMPLES == 5_000


@pytest.mark.slow  # a statistical check (under a second)
def test_the_computed_power_matches_simulation() -> None:
    """2,000 simulated guards at a size where the power is about a half: the computed chance lies
    within four standard errors of the simulated one (seeded)."""
    wrong, n, runs = off_by(SMALLEST_EFFECT), 2_000, 2_000
    rng = np.random.default_rng(7)
    categories = list(range(6))
    rejected = 0
    for counts in rng.multinomial(n, wrong, size=runs):
        stream = np.repeat(categories, counts).tolist()
        rejected += chi_square(stream, categories, P.tolist()) > CRITICAL_DOF5_ALPHA_1E4
    expected = rejection_chance(n, SMALLEST_EFFECT)
    assert 0.2 < expected < 0.8
    assert abs(rejected / runs - expected) < 4 * np.sqrt(expected * (1 - expected) / runs)
