"""llama-server's further stages (top-n-sigma, typical, dynamic temperature, DRY, mirostat) against
the NumPy reference, on random rows."""

from __future__ import annotations

import mlx.core as mx
import numpy as np
import pytest

from app.sampling import RowRng, SamplerPipeline, SamplingParams
from app.sampling.dry import dry_penalties, sequence_breakers
from app.sampling.mirostat import MirostatState
from tests.support import reference_sampler as ref
from tests.support.pipelines import VOCAB, pipeline, rows


def p_of(sampler: SamplerPipeline, logits: np.ndarray, contexts=None) -> np.ndarray:
    return np.array(sampler.distribution(mx.array(logits), contexts, RowRng(0)).dense())


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize(
    "stages",
    [
        {"sigma": 1.0},
        {"typical_p": 0.6},
        {"dynatemp": (0.5, 1.0)},
        {"dynatemp": (0.7, 2.0), "temperature": 0.9},
        {"sigma": 1.5, "top_k": 20, "typical_p": 0.8, "top_p": 0.9, "min_p": 0.02},
        {"typical_p": 0.5, "top_k": 12, "min_p": 0.1, "dynatemp": (0.3, 0.5)},
    ],
)
def test_stages_match_the_reference_in_llama_servers_order(seed: int, stages: dict) -> None:
    kw = {"top_k": 0, "top_p": 1.0, "min_p": 0.0, "temperature": 1.0} | stages
    names = {"sigma": "top_n_sigma", "typical_p": "typical_p"}
    params = {names.get(k, k): v for k, v in kw.items() if k != "dynatemp"}
    if "dynatemp" in kw:
        params |= {"dynatemp_range": kw["dynatemp"][0], "dynatemp_exponent": kw["dynatemp"][1]}
    logits = rows(seed)
    got = p_of(SamplerPipeline(SamplingParams(**params), VOCAB), logits)
    for r in range(len(logits)):
        want = ref.final_distribution(logits[r], **kw)
        assert np.all(got[r][want == 0] == 0)  # what a stage dropped stays dropped
        np.testing.assert_allclose(got[r], want, atol=2e-6)


def test_typical_drops_the_most_likely_token_when_it_is_atypical() -> None:
    """The power check of the typical stage: one dominant token is far from the entropy."""
    probs = np.array([0.5] + [0.5 / 20] * 20 + [0.0] * (VOCAB - 21)) + 1e-12
    logits = np.log(probs / probs.sum())[None, :].astype(np.float32)
    got = p_of(pipeline(typical_p=0.3), logits)[0]
    assert got[0] == 0.0 and got[1:21].sum() == pytest.approx(1.0, abs=1e-5)


@pytest.mark.parametrize("seed", range(8))
def test_dry_matches_the_brute_force_rule(seed: int) -> None:
    gen = np.random.default_rng(seed)
    history = [int(t) for t in gen.integers(0, 5, size=60)]  # a small alphabet: many repeats
    history += history[30:36]  # and the suffix surely recurs
    breakers = {7} if seed % 2 else set()  # a breaker that bounds how far back repeats reach
    history[-3 - seed] = 7 if seed % 2 else history[-3 - seed]
    logits = rows(seed, n=1)
    params = {"dry_multiplier": 0.8, "dry_base": 1.75, "dry_allowed_length": 2, "dry_penalty_last_n": 40}
    sampler = pipeline(**params, dry_breakers=dict.fromkeys(breakers, ((),)))
    got = np.array(sampler.adjust(mx.array(logits), [history]))[0]
    want = ref.dry(logits[0], history[-40:], 0.8, 1.75, 2, breakers)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-4)
    assert not np.allclose(got, logits[0])  # the rule penalised something


def test_dry_breakers_of_several_tokens_stop_a_repeat_only_when_complete() -> None:
    texts = ["a", "b", "x", "y"]  # token ids 0..3; the breaker "xy" spans tokens 2 and 3
    breakers = sequence_breakers(["xy"], texts, lambda s: [texts.index(ch) for ch in s])
    assert breakers == {2: ((3,),)}
    half = [0, 1, 2, 0, 1, 2, 0, 1]  # "abxabxab": x alone breaks nothing, it extends a repeat of 5
    assert dry_penalties(half, 1.0, 2.0, 2, breakers) == {2: 2.0**3}
    whole = [0, 1, 2, 3, 0, 1, 2, 3, 0, 1]  # "abxyabxyab": the repeat reaches back only to the last "xy"
    assert dry_penalties(whole, 1.0, 2.0, 2, breakers) == {2: 2.0**0}


@pytest.mark.parametrize("version", [1, 2])
@pytest.mark.parametrize("seed", range(4))
def test_mirostat_rows_match_the_reference_and_chain_mu(version: int, seed: int) -> None:
    logits = rows(seed, n=3, scale=2.0)
    tokens = [int(np.argmax(logits[0])), int(np.argsort(-logits[1])[1])]
    state = MirostatState(version, tau=3.0, eta=0.5, temperature=0.8, vocab=VOCAB)
    got = np.array(state.rows(mx.array(logits), [-1, *tokens]).dense())
    mu = 6.0
    for r in range(3):
        want = ref.mirostat(logits[r], mu, version, 0.8, VOCAB)
        np.testing.assert_allclose(got[r], want, atol=2e-6)
        if r < 2:
            mu -= 0.5 * (-np.log2(want[tokens[r]]) - 3.0)
    state.observe(state.rows(mx.array(logits[:2]), [-1, tokens[0]]), tokens)
    assert state.mu.item() == pytest.approx(mu, abs=1e-4)


def test_mirostat_skips_the_other_stages_as_llama_server_does() -> None:
    logits = rows(1, n=1)
    sampler = pipeline(mirostat=2, mirostat_tau=100.0, top_k=3, repeat_penalty=2.0, dry_multiplier=1.0)
    assert not sampler.params.has_penalties and not sampler.params.has_dry
    np.testing.assert_allclose(p_of(sampler, logits, [[1]])[0], ref.softmax(logits[0]), atol=1e-6)
