"""Coupled draws: a draft takes the target's keys of its position, and one key's noise is indexed
by token id, so the two draws agree wherever p and q are close (app/sampling/streams.py)."""

from __future__ import annotations

import mlx.core as mx
import numpy as np
import pytest

from app.acceptance import sum_coupled, sum_min, sum_prod
from app.sampling import Distribution, RowRng
from app.sampling.streams import draft_keys, drafter_stream, position_keys
from tests.support.pipelines import VOCAB, pipeline, rows
from tests.support.statistics import CRITICAL_DOF5_ALPHA_1E4, chi_square

KEYS = [mx.random.key(seed) for seed in range(300)]


def tokens(p: Distribution, keys: list[mx.array]) -> list[int]:
    return mx.concatenate([p.draw(key) for key in keys]).tolist()


@pytest.mark.parametrize("xtc", [0.0, 0.5])
def test_coupled_draft_keys_are_the_keys_the_verify_draws_with(xtc: float) -> None:
    """Position by position, a coupled draft gets the coin and draw key the verify round's
    `position_keys` give that position (target-only's layout); at a forced position, where the
    target takes no key, the draft draws from the drafter stream. Nothing is consumed."""
    sampler = pipeline(top_k=20, xtc_probability=xtc, xtc_threshold=0.1)
    sampled = [True, False, True, True]
    target, drafter, reference = RowRng(31), drafter_stream(31), drafter_stream(31)
    keys = draft_keys(target, drafter, len(sampled), sampler.uses_coin, coupled=True)
    taken = [keys.take(s) for s in sampled]
    verify = position_keys(target, sampled, sampler.uses_coin)  # what the verify round peeks afterwards
    for i, (coin, key) in enumerate(taken):
        if sampled[i]:
            assert key.tolist() == verify.draws[i].tolist()
            assert coin is None if not xtc else coin.tolist() == verify.coins[i : i + 1].tolist()
        else:
            if xtc:
                assert coin.item() == reference.uniform()
            assert key.tolist() == reference.next_key().tolist()
    verify.consume(len(sampled))  # the verify's pending peek was not disturbed by the drafter's
    plain = RowRng(31)
    for _ in range(sum(sampled) * (1 + sampler.uses_coin)):
        plain.next_key()
    assert target.next_key().tolist() == plain.next_key().tolist()


def test_uncoupled_draft_keys_are_the_drafter_streams() -> None:
    target, drafter = RowRng(8), drafter_stream(8)
    keys = draft_keys(target, drafter, 3, coin=False, coupled=False)
    drawn = [keys.take()[1].tolist() for _ in range(3)]
    reference = drafter_stream(8)
    assert drawn == [reference.next_key().tolist() for _ in range(3)]
    assert target.next_key().tolist() == RowRng(8).next_key().tolist()


def test_a_draw_does_not_depend_on_the_order_of_the_candidates() -> None:
    p = pipeline(top_k=12).distribution(mx.array(rows(4, n=1)))
    shuffled = mx.array(np.random.default_rng(0).permutation(p.ids.shape[1]))
    permuted = Distribution(p.ids[:, shuffled], p.probs[:, shuffled], p.vocab)
    assert tokens(permuted, KEYS) == tokens(p, KEYS)


def test_a_row_restricted_to_fewer_candidates_keeps_every_draw_that_stays_in_them() -> None:
    """The noise of a token is the same in both rows (indexed by id, not by rank): a draw of p that
    falls among q's candidates, q being p renormalised on a subset, is q's draw with that key. With
    noise by rank (MLX's categorical over the candidates) the two would agree only by chance."""
    p = pipeline(top_k=0, top_p=1.0, min_p=0.0).distribution(mx.array(rows(6, n=1)))
    kept = p.ids[:, ::3]  # a third of the vocabulary, in another order than p's
    q = Distribution(kept, mx.take_along_axis(p.dense(), kept, axis=-1), p.vocab)
    q = Distribution(q.ids, q.probs / mx.sum(q.probs, axis=-1, keepdims=True), q.vocab)
    allowed = set(kept[0].tolist())
    pairs = list(zip(tokens(p, KEYS), tokens(q, KEYS), strict=True))
    inside = [(a, b) for a, b in pairs if a in allowed]
    assert len(inside) > 50 and all(a == b for a, b in inside)


def close_pair(seed: int) -> tuple[Distribution, Distribution]:
    """p and a perturbed q with different top-k candidate sets."""
    logits = rows(seed, n=1)
    noisy = logits + np.random.default_rng(seed).normal(scale=0.6, size=logits.shape).astype(np.float32)
    return pipeline(top_k=24).distribution(mx.array(logits)), pipeline(top_k=16).distribution(mx.array(noisy))


@pytest.mark.slow
def test_coupled_draws_agree_at_the_closed_form_and_above_the_bound() -> None:
    """Agreement of 4,000 coupled pairs against sum_coupled (3 SE), which lies between
    (1 - TV) / (1 + TV) and 1 - TV; independent pairs would agree at sum_prod, far below."""
    keys = [mx.random.key(1000 + i) for i in range(4000)]
    for seed in range(3):
        p, q = close_pair(seed)
        dense_p, dense_q = p.dense(), q.dense()
        closed = sum_coupled(dense_p, dense_q, q.ids).item()
        ceiling, independent = sum_min(dense_p, dense_q).item(), sum_prod(dense_p, dense_q).item()
        tv = 1 - ceiling
        assert (1 - tv) / (1 + tv) <= closed + 1e-6 and closed <= ceiling + 1e-6
        agreed = np.mean(np.array(tokens(p, keys)) == np.array(tokens(q, keys)))
        se = np.sqrt(closed * (1 - closed) / len(keys))
        assert abs(agreed - closed) <= 3 * se, (seed, agreed, closed)
        assert agreed > independent + 10 * se


@pytest.mark.slow
def test_a_draw_follows_its_distribution() -> None:
    """The target's own draw: 12,000 draws of six tokens against their probabilities (alpha 1e-4)."""
    probs = [0.35, 0.25, 0.15, 0.12, 0.08, 0.05]
    ids = [3, 17, 5, 40, 11, 29]  # candidates out of id order, on a vocabulary of VOCAB
    p = Distribution(mx.array([ids]), mx.array([probs]), VOCAB)
    drawn = tokens(p, [mx.random.key(50_000 + i) for i in range(12_000)])
    assert chi_square(drawn, ids, probs) < CRITICAL_DOF5_ALPHA_1E4
