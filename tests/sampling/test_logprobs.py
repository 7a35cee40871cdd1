"""Per-token log-probabilities from logits and sampler rows (app/sampling/logprobs.py)."""

from __future__ import annotations

import math

import mlx.core as mx
import pytest

from app.sampling import SamplerPipeline, SamplingParams
from app.sampling.logprobs import ProbsRequest, token_logprobs

VOCAB = 50


@pytest.fixture
def logits() -> mx.array:
    return mx.random.normal((3, VOCAB), key=mx.random.key(0))


def test_models_row_is_the_log_softmax(logits) -> None:
    sampler = SamplerPipeline(SamplingParams(temperature=0.7, top_k=5), VOCAB)
    tokens = [4, 9, 17]
    entries = token_logprobs(ProbsRequest(top=3), sampler, logits, tokens, None, None)
    expected = (logits - mx.logsumexp(logits, axis=-1, keepdims=True)).tolist()
    for entry, token, row in zip(entries, tokens, expected, strict=True):
        assert entry.token == token and entry.logprob == pytest.approx(row[token], abs=1e-6)
        best = sorted(range(VOCAB), key=lambda i: -row[i])[:3]
        assert [t for t, _ in entry.top] == best
        assert [lp for _, lp in entry.top] == pytest.approx([row[i] for i in best], abs=1e-6)


def test_samplers_row_lists_only_kept_candidates(logits) -> None:
    sampler = SamplerPipeline(SamplingParams(temperature=0.7, top_k=5, top_p=1.0, min_p=0.0), VOCAB)
    p = sampler.distribution(logits)
    kept = p.ids[:, 0].tolist()  # each row's most likely candidate
    entries = token_logprobs(ProbsRequest(top=10, post_sampling=True), sampler, logits, kept, p, None)
    for entry in entries:
        assert len(entry.top) == 5  # top_k kept five; the other five asked for have probability 0
        assert sum(math.exp(lp) for _, lp in entry.top) == pytest.approx(1.0, abs=1e-5)
        assert entry.top[0] == (entry.token, entry.logprob)


def test_argmax_rule_at_t_above_0_reports_the_samplers_row(logits) -> None:
    """Argmax rules build no p: the sampler's row is built for the report (no key drawn)."""
    sampler = SamplerPipeline(SamplingParams(temperature=0.7, top_k=5), VOCAB)
    argmax = mx.argmax(logits, axis=-1).tolist()
    built = token_logprobs(ProbsRequest(top=5, post_sampling=True), sampler, logits, argmax, None, None)
    given = token_logprobs(
        ProbsRequest(top=5, post_sampling=True), sampler, logits, argmax, sampler.distribution(logits), None
    )
    assert built == given


def test_greedy_samplers_row_is_one_hot(logits) -> None:
    sampler = SamplerPipeline(SamplingParams(temperature=0.0), VOCAB)
    entries = token_logprobs(ProbsRequest(top=2, post_sampling=True), sampler, logits, [1, 2, 3], None, None)
    assert [(e.logprob, e.top) for e in entries] == [(0.0, ((t, 0.0),)) for t in (1, 2, 3)]
