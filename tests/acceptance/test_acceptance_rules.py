"""The rules over probability rows, as a verify step runs them (app/decoding/verify.py: the lazy
draws read in one evaluation, the pure rule, the keys consumed): guards that need no model."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable

import mlx.core as mx
import numpy as np
import pytest

from app.acceptance import (
    Rule,
    Verdict,
    argmax_against_argmax,
    greedy_argmax,
    sampler_match,
    select_rule,
    sum_min,
    sum_prod,
)
from app.decoding.plan import Switches
from app.decoding.verify import judging_sampler_match, judging_stochastic
from app.execution.steps import run_alone
from app.sampling import Distribution, RowRng, SamplingParams
from app.sampling.streams import PositionKeys, position_keys
from tests.support.statistics import CRITICAL_DOF5_ALPHA_1E4, chi_square, sample_count

CATEGORIES = list(range(6))
P = [0.35, 0.25, 0.15, 0.12, 0.08, 0.05]
Q = [0.10, 0.15, 0.30, 0.05, 0.25, 0.15]
K = 4


def stochastic(drafts: list[int], p: Distribution, q: Distribution, rng: RowRng) -> Verdict:
    return run_alone(judging_stochastic(mx.array(drafts, dtype=mx.int32), p, q, rng))


def matching(drafts: list[int], p: Distribution, keys: PositionKeys) -> Verdict:
    return run_alone(judging_sampler_match(mx.array(drafts, dtype=mx.int32), p.draw_each(keys.draws), keys))


def draw(row: mx.array, rng: RowRng) -> int:
    return int(Distribution.from_dense(row).draw(rng.next_key()).item())


def resample_from_p(drafts: list[int], p_rows: mx.array, q_rows: mx.array, rng: RowRng) -> Verdict:
    """A known-wrong rule: rejection sampling that redraws from p instead of the residual."""
    for i, draft in enumerate(drafts):
        if rng.uniform() * q_rows[i, draft].item() > p_rows[i, draft].item():
            return Verdict(accepted=i, tokens=[*drafts[:i], draw(p_rows[i], rng)], tested=i + 1)
    return Verdict(accepted=len(drafts), tokens=[*drafts, draw(p_rows[len(drafts)], rng)], tested=len(drafts))


def stream_from(rule: str | Callable, n: int, seed: int = 1234) -> list[int]:
    """Emit n tokens from fixed rows p (target) and q (drafter), k drafts per round."""
    rng = RowRng(seed)
    p_rows = mx.broadcast_to(mx.array(P)[None, :], (K + 1, len(P)))
    q_rows = mx.broadcast_to(mx.array(Q)[None, :], (K, len(Q)))
    out: list[int] = []
    while len(out) < n:
        drafts = [draw(q_rows[i], rng) for i in range(K)]
        if rule == "sampler-match":
            keys = position_keys(rng, [True] * (K + 1), False)
            verdict = matching(drafts, Distribution.from_dense(p_rows), keys)
        elif rule == "stochastic":
            verdict = stochastic(drafts, Distribution.from_dense(p_rows), Distribution.from_dense(q_rows), rng)
        elif rule == "argmax":
            verdict = argmax_against_argmax(drafts, [int(np.argmax(P))] * (K + 1))
        else:
            verdict = rule(drafts, p_rows, q_rows, rng)
        out.extend(verdict.tokens)
    return out[:n]


@pytest.mark.slow
@pytest.mark.parametrize("rule", ["sampler-match", "stochastic"])
def test_lossless_rules_pass_the_chi_square(rule: str) -> None:
    assert chi_square(stream_from(rule, sample_count()), CATEGORIES, P) < CRITICAL_DOF5_ALPHA_1E4


@pytest.mark.slow
@pytest.mark.parametrize("wrong_rule", [resample_from_p, "argmax"], ids=["resample-from-p", "argmax-vs-argmax"])
def test_chi_square_rejects_known_wrong_rules(wrong_rule: str | Callable) -> None:
    """Power calibration: the same statistic, the same sample size, a rule known to be biased."""
    assert chi_square(stream_from(wrong_rule, sample_count()), CATEGORIES, P) > CRITICAL_DOF5_ALPHA_1E4


@pytest.mark.slow
@pytest.mark.parametrize("token", [0, 2, 4])
def test_accept_rate_is_min_one_p_over_q(token: int) -> None:
    rng = RowRng(7)
    p_rows, q_rows = Distribution.from_dense(mx.array([P, P])), Distribution.from_dense(mx.array([Q]))
    trials = 4000
    accepted = sum(stochastic([token], p_rows, q_rows, rng).accepted for _ in range(trials))
    expected = min(1.0, P[token] / Q[token])
    se = max(np.sqrt(expected * (1 - expected) / trials), 1e-9)
    assert abs(accepted / trials - expected) <= 4 * se + 1e-9


@pytest.mark.slow
def test_rejections_emit_the_normalised_residual() -> None:
    rng = RowRng(11)
    p_rows, q_rows = Distribution.from_dense(mx.array([P, P])), Distribution.from_dense(mx.array([Q]))
    residual = np.maximum(np.array(P) - np.array(Q), 0.0)
    residual /= residual.sum()
    recovered: list[int] = []
    while len(recovered) < 6000:
        verdict = stochastic([2], p_rows, q_rows, rng)  # q(2) = 0.30 > p(2): rejects half the time
        if verdict.rejected:
            recovered.append(verdict.tokens[-1])
    support = [c for c in CATEGORIES if residual[c] > 0]
    assert set(recovered) <= set(support)
    counts = Counter(recovered)
    stat = sum((counts[c] - len(recovered) * residual[c]) ** 2 / (len(recovered) * residual[c]) for c in support)
    assert stat < 18.4207  # chi-square, dof 2 (three residual categories): -2 ln(1e-4), alpha 1e-4


def test_sum_min_is_never_below_sum_prod() -> None:
    rng = np.random.default_rng(0)
    rows = rng.dirichlet(np.full(50, 0.3), size=(2, 200)).astype(np.float32)
    p, q = mx.array(rows[0]), mx.array(rows[1])
    assert bool(mx.all(sum_min(p, q) >= sum_prod(p, q) - 1e-7))
    assert sum_min(mx.array([P]), mx.array([Q])).item() == pytest.approx(sum(map(min, P, Q)))
    expected_prod = sum(a * b for a, b in zip(P, Q, strict=True))
    assert sum_prod(mx.array([P]), mx.array([Q])).item() == pytest.approx(expected_prod)


def test_greedy_rules_walk_the_chain() -> None:
    assert greedy_argmax([5, 6, 7], [5, 6, 9, 1]) == Verdict(accepted=2, tokens=[5, 6, 9], tested=3)
    assert greedy_argmax([5, 6], [5, 6, 8]) == Verdict(accepted=2, tokens=[5, 6, 8], tested=2)
    assert argmax_against_argmax([4], [5, 6]) == Verdict(accepted=0, tokens=[5], tested=1)


def test_sampler_match_emits_the_draw_on_both_branches() -> None:
    one_hot = Distribution.from_dense(mx.array([[0.0, 1.0, 0.0], [0.0, 0.0, 1.0], [1.0, 0.0, 0.0]]))
    for drafts, verdict in (([1, 0], Verdict(accepted=1, tokens=[1, 2], tested=2)),
                            ([1, 2], Verdict(accepted=2, tokens=[1, 2, 0], tested=2))):  # fmt: skip
        assert sampler_match(drafts, one_hot.draw_each(plain_keys(3).draws).tolist()) == verdict


def test_sampler_match_emits_and_consumes_exactly_target_only_draws() -> None:
    """Its emitted tokens are the draws target-only decoding makes at those positions, and it
    consumes their keys only: the next draw is target-only's next one too."""
    p = Distribution.from_dense(mx.broadcast_to(mx.array(P)[None, :], (K + 1, len(P))))
    for seed in range(20):
        target_only = RowRng(seed)
        alone = [draw(mx.array(P), target_only) for _ in range(K + 2)]
        rng = RowRng(seed)
        keys = position_keys(rng, [True] * (K + 1), False)
        verdict = matching([*alone[:2], (alone[2] + 1) % len(P), 0], p, keys)
        assert verdict.tokens == alone[:3] and draw(mx.array(P), rng) == alone[3]


def plain_keys(rows: int) -> PositionKeys:
    return position_keys(RowRng(0), [True] * rows, False)


@pytest.mark.parametrize("value", ["1", "true", "YES", "on"])
def test_truthy_spellings_opt_in(value: str) -> None:
    assert Switches.read(environ={"MLXCEL_SPECULATIVE_STOCHASTIC_ACCEPT": value}).stochastic_accept


@pytest.mark.parametrize("value", ["0", "false", "", "off", "2"])
def test_other_spellings_do_not(value: str) -> None:
    assert not Switches.read(environ={"MLXCEL_SPECULATIVE_STOCHASTIC_ACCEPT": value}).stochastic_accept


def test_the_profile_env_table_overrides_the_environment() -> None:
    env = {"MLXCEL_SPECULATIVE_STOCHASTIC_ACCEPT": "1"}
    assert Switches.read({"MLXCEL_SPECULATIVE_STOCHASTIC_ACCEPT": "0"}, env).stochastic_accept is False
    assert Switches.read({"MLXCEL_SPECULATIVE_STOCHASTIC_ACCEPT": "1"}, {}).stochastic_accept is True


def test_rule_selection_follows_the_contract_table() -> None:
    hot, greedy, top1 = (
        SamplingParams(temperature=0.7),
        SamplingParams(temperature=0.0),
        SamplingParams(top_k=1),
    )
    assert select_rule(greedy.is_greedy, stochastic=True, reports_distribution=True) is Rule.GREEDY_ARGMAX
    assert select_rule(top1.is_greedy, stochastic=True, reports_distribution=True) is Rule.GREEDY_ARGMAX
    assert select_rule(hot.is_greedy, stochastic=False, reports_distribution=True) is Rule.SAMPLER_MATCH
    assert select_rule(hot.is_greedy, stochastic=True, reports_distribution=True) is Rule.STOCHASTIC
    assert select_rule(hot.is_greedy, stochastic=True, reports_distribution=False) is Rule.SAMPLER_MATCH_NO_Q
    one_hot = select_rule(hot.is_greedy, stochastic=True, reports_distribution=True, one_hot_proposals=True)
    assert one_hot is Rule.SAMPLER_MATCH
