"""Each sampler stage against the NumPy reference, on random rows."""

from __future__ import annotations

import mlx.core as mx
import numpy as np
import pytest

from app.execution.steps import run_alone
from app.sampling import Distribution, RowRng, SamplerPipeline, SamplingParams, chain
from app.sampling.draws import sampling
from app.sampling.streams import drafter_stream, position_keys, xtc_coins
from tests.support.pipelines import VOCAB, pipeline, rows
from tests.support.reference_sampler import chained, final_distribution, penalise


def p_of(sampler: SamplerPipeline, logits: np.ndarray, rng: RowRng | None = None) -> np.ndarray:
    coins = None if rng is None else xtc_coins(rng, len(logits), sampler.uses_coin)
    return np.array(sampler.distribution(mx.array(logits), None, coins).dense())


@pytest.mark.parametrize("seed", range(5))
def test_token_bias_is_additive_and_minus_infinity_bans(seed: int) -> None:
    logits = rows(seed)
    bias = {3: 2.5, 7: -1.0, 11: float("-inf")}
    sampler = pipeline(logit_bias=bias)
    got = np.array(sampler.adjust(mx.array(logits)))
    want = logits.copy()
    for t, b in bias.items():
        want[:, t] += b
    np.testing.assert_allclose(got, want, rtol=1e-6)
    assert np.all(p_of(sampler, logits)[:, 11] == 0.0)


@pytest.mark.parametrize("seed", range(5))
def test_penalties_follow_the_sign_aware_rule_over_the_window(seed: int) -> None:
    logits = rows(seed, n=2)
    history = [int(t) for t in np.random.default_rng(seed + 100).integers(0, VOCAB, size=40)]
    params = {"repeat_penalty": 1.3, "frequency_penalty": 0.2, "presence_penalty": 0.5, "repeat_last_n": 16}
    sampler = pipeline(**params)
    contexts = [history[-16:], history[-16:-3]]
    got = np.array(sampler.adjust(mx.array(logits), contexts))
    for r, ctx in enumerate(contexts):
        want = penalise(logits[r], ctx, 1.3, 0.2, 0.5)
        np.testing.assert_allclose(got[r], want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("seed", range(8))
@pytest.mark.parametrize(
    "filters",
    [
        {"top_k": 5},
        {"top_p": 0.7},
        {"min_p": 0.1},
        {"top_k": 12, "top_p": 0.6, "min_p": 0.05},
        {"top_k": 3, "top_p": 0.99},
    ],
)
def test_filters_match_reference_support_and_renormalisation(seed: int, filters: dict) -> None:
    logits = rows(seed)
    got = p_of(pipeline(**filters), logits)
    for r in range(len(logits)):
        want = final_distribution(logits[r], temperature=1.0, **filters)
        assert set(np.nonzero(got[r])[0]) == set(np.nonzero(want)[0])
        np.testing.assert_allclose(got[r], want, atol=1e-6)
        assert got[r].sum() == pytest.approx(1.0, abs=1e-5)


def test_top_p_is_measured_after_top_k_renormalises() -> None:
    # Top-2 mass renormalised is 0.6/0.9 = 0.67: top_p 0.65 keeps only one token after top_k=2,
    # but would keep two if top_p were measured on the whole distribution (0.6 < 0.65).
    probs = np.array([0.6, 0.3, 0.1] + [0.0] * (VOCAB - 3)) + 1e-9
    logits = np.log(probs / probs.sum())[None, :].astype(np.float32)
    got = p_of(pipeline(top_k=2, top_p=0.65), logits)[0]
    assert np.count_nonzero(got) == 1


@pytest.mark.parametrize("seed", range(5))
@pytest.mark.parametrize("temperature", [0.3, 0.7, 1.5])
def test_temperature_is_applied_last_to_the_filtered_row(seed: int, temperature: float) -> None:
    logits = rows(seed)
    got = p_of(pipeline(top_k=10, top_p=0.9, temperature=temperature), logits)
    for r in range(len(logits)):
        want = final_distribution(logits[r], temperature=temperature, top_k=10, top_p=0.9)
        np.testing.assert_allclose(got[r], want, atol=1e-6)


@pytest.mark.parametrize("seed", range(5))
def test_xtc_removes_all_top_choices_but_the_least_likely(seed: int) -> None:
    logits = rows(seed, scale=1.0)
    logits[:, :3] += 3.0  # several tokens above the threshold
    sampler = pipeline(top_k=20, xtc_probability=1.0, xtc_threshold=0.1)
    got = p_of(sampler, logits, RowRng(seed))
    for r in range(len(logits)):
        want = final_distribution(logits[r], temperature=1.0, top_k=20, xtc=(0.0, 0.1))
        np.testing.assert_allclose(got[r], want, atol=1e-6)


def test_xtc_that_loses_its_coin_changes_nothing() -> None:
    logits = rows(0)
    got = p_of(pipeline(xtc_probability=1e-9, xtc_threshold=0.05), logits, RowRng(0))
    np.testing.assert_allclose(got, p_of(pipeline(), logits), atol=1e-7)


@pytest.mark.parametrize("params", [{"temperature": 0.0}, {"temperature": 0.9, "top_k": 1}])
def test_greedy_is_argmax_of_adjusted_logits_and_draws_nothing(params: dict) -> None:
    logits = rows(3, n=1)
    sampler = SamplerPipeline(SamplingParams(**params, repeat_penalty=1.5), VOCAB)
    context = [int(np.argmax(logits[0]))]
    rng = RowRng(5)
    token, p = run_alone(sampling(sampler, mx.array(logits), [context], rng))
    want = int(np.argmax(penalise(logits[0], context, 1.5, 0.0, 0.0)))
    assert (token.item(), p) == (want, None)
    assert rng.uniform() == RowRng(5).uniform()  # the stream was not touched


def test_row_stream_replays_mlx_default_stream() -> None:
    """The keys are MLX's default sequence; a draw is Gumbel-max with the key's noise over the vocabulary."""
    p = mx.softmax(mx.array(rows(9, n=1)))
    mx.random.seed(123)
    default = [mx.random.uniform().item(), mx.argmax(mx.log(p) + mx.random.gumbel(shape=p.shape)).item()]
    rng = RowRng(123)
    assert [rng.uniform(), Distribution.from_dense(p).draw(rng.next_key()).item()] == default


def test_seeded_draws_reproduce() -> None:
    sampler = pipeline(top_k=20, temperature=0.8)
    logits = mx.array(rows(1, n=1))
    first = [run_alone(sampling(sampler, logits, None, rng))[0].item() for rng in [RowRng(42)] for _ in range(20)]
    again = [run_alone(sampling(sampler, logits, None, rng))[0].item() for rng in [RowRng(42)] for _ in range(20)]
    assert first == again
    assert len(set(first)) > 1


def test_invalid_parameters_are_named() -> None:
    problems = SamplingParams(top_p=1.5, top_k=-1, logit_bias={99999: 1.0}).problems(vocab_size=VOCAB)
    assert any("top_p" in p for p in problems)
    assert any("top_k" in p for p in problems)
    assert any("logit_bias" in p for p in problems)


def test_peeked_keys_are_the_stream_and_only_advanced_ones_are_consumed() -> None:
    peeking, plain = RowRng(77), RowRng(77)
    keys = peeking.peek(4)
    assert [k.tolist() for k in keys[:2]] == [plain.next_key().tolist(), plain.next_key().tolist()]
    peeking.advance(2)
    assert peeking.uniform() == plain.uniform()


def test_a_distribution_within_masks_is_renormalised_on_the_allowed_tokens() -> None:
    """What a constrained block drafter's surviving draft follows (app/decoding/loop.py::within_grammar)."""
    q = SamplerPipeline(SamplingParams(temperature=1.0, top_k=3), 5).distribution(
        mx.log(mx.array([[0.1, 0.2, 0.3, 0.4, 0.0]]))
    )
    masked = q.within(mx.array([[True, False, True, True, True]]))
    assert np.allclose(np.array(masked.dense()), [[0.0, 0.0, 3 / 7, 4 / 7, 0.0]], atol=1e-6)


@pytest.mark.parametrize("xtc", [0.0, 0.5])
def test_position_keys_are_the_keys_target_only_decoding_draws(xtc: float) -> None:
    """Per sampled position, the XTC coin's key (when XTC is on) then the draw's; a forced
    position takes none: the layout a verify round peeks, so its emitted draws are target-only's."""
    sampler = pipeline(top_k=20, xtc_probability=xtc, xtc_threshold=0.1)
    logits = mx.array(rows(3))
    only_seven = mx.where(mx.arange(VOCAB) == 7, logits[3], -mx.inf)[None, :]  # a row the grammar forces
    plan = [(logits[0:1], True), (only_seven, False), (logits[1:2], True), (logits[2:3], True)]
    one_by_one, rng = [], RowRng(21)
    for row, sampled in plan:
        one_by_one.append(run_alone(sampling(sampler, row, None, rng, forced=not sampled))[0].item())
    after_one_by_one = rng.next_key().tolist()
    together = RowRng(21)
    keys = position_keys(together, [sampled for _, sampled in plan], sampler.uses_coin)
    stacked = mx.concatenate([row for row, _ in plan])
    drawn = sampler.distribution(stacked, None, keys.coins).draw_each(keys.draws).tolist()
    keys.consume(len(plan))
    assert drawn == one_by_one and one_by_one[1] == 7
    assert together.next_key().tolist() == after_one_by_one


def test_the_drafter_stream_is_not_the_target_stream() -> None:
    assert drafter_stream(5).next_key().tolist() != RowRng(5).next_key().tolist()
    assert drafter_stream(5).next_key().tolist() == drafter_stream(5).next_key().tolist()


CHAIN_SETTINGS = {"temperature": 1.7, "top_k": 12, "top_p": 0.7, "min_p": 0.08, "typical_p": 0.9, "top_n_sigma": 2.0}


@pytest.mark.parametrize(
    "chain",
    [
        ["temperature", "top_p", "min_p"],
        ["min_p", "temperature", "top_k", "top_p"],
        ["top_p", "typ_p", "top_k"],
        ["temperature", "top_n_sigma", "min_p", "top_p"],
        ["top_k", "temperature", "min_p", "temperature"],  # a stage named twice runs twice
        [],
    ],
)
@pytest.mark.parametrize("seed", range(4))
def test_a_chain_runs_its_stages_in_its_order(seed: int, chain: list[str]) -> None:
    """Each stage on the survivors of the ones before it (after the temperature, tempered); a stage
    the chain leaves out does not run, whatever its setting."""
    logits = rows(seed)
    reference = {"sigma" if k == "top_n_sigma" else k: v for k, v in CHAIN_SETTINGS.items()}
    got = p_of(pipeline(**CHAIN_SETTINGS, samplers=tuple(chain)), logits)
    for r in range(len(logits)):
        want = chained(logits[r], chain, **reference)
        assert set(np.nonzero(got[r])[0]) == set(np.nonzero(want)[0])
        np.testing.assert_allclose(got[r], want, atol=1e-6)


def test_a_chain_of_the_default_order_is_the_default_pipeline() -> None:
    logits = mx.array(rows(11))
    default = pipeline(**CHAIN_SETTINGS).distribution(logits)
    named = pipeline(**CHAIN_SETTINGS, samplers=chain.DEFAULT).distribution(logits)
    assert default.ids.tolist() == named.ids.tolist() and default.probs.tolist() == named.probs.tolist()


def test_penalties_after_top_k_act_on_its_candidates() -> None:
    logits = rows(2, n=1)
    context = [int(t) for t in np.argsort(-logits[0])[:3]]  # the three best tokens were seen
    sampler = pipeline(top_k=5, repeat_penalty=4.0, samplers=("top_k", "penalties", "temperature"))
    got = np.array(sampler.distribution(mx.array(logits), [context]).dense())[0]
    top5 = np.argsort(-logits[0])[:5]  # chosen before the penalties, which then reorder them
    penalised = penalise(logits[0], context, 4.0, 0.0, 0.0)[top5]
    want = np.zeros(VOCAB)
    want[top5] = np.exp(penalised - penalised.max()) / np.exp(penalised - penalised.max()).sum()
    np.testing.assert_allclose(got, want, atol=1e-6)


def test_a_stage_left_out_of_the_chain_does_not_run() -> None:
    """Temperature 0 without the temperature stage is no greedy sampler (llama-server samples the
    untempered row); nor is top_k 1 without top_k. Penalties and XTC left out read nothing."""
    assert not SamplingParams(temperature=0.0, samplers=("top_k", "top_p")).is_greedy
    assert not SamplingParams(top_k=1, samplers=("temperature",)).is_greedy
    assert SamplingParams(temperature=0.0, samplers=("temperature",)).is_greedy
    left_out = SamplingParams(repeat_penalty=1.3, dry_multiplier=0.8, xtc_probability=0.5, samplers=("top_k",))
    assert not left_out.has_penalties and not left_out.has_dry and not left_out.uses_coin
    assert left_out.context_length == 0


def test_xtc_in_a_custom_place_takes_its_coin() -> None:
    logits = rows(4, scale=1.0)
    logits[:, :3] += 3.0
    sampler = pipeline(top_k=20, xtc_probability=1.0, xtc_threshold=0.1, samplers=("xtc", "top_k"))
    got = p_of(sampler, logits, RowRng(4))
    differs = []
    for r in range(len(logits)):  # measured on the whole vocabulary, before top_k
        want = chained(logits[r], ["xtc", "top_k"], top_k=20, xtc_threshold=0.1)
        np.testing.assert_allclose(got[r], want, atol=1e-6)
        differs.append(not np.allclose(want, chained(logits[r], ["top_k", "xtc"], top_k=20, xtc_threshold=0.1)))
    assert any(differs)  # the order mattered here


@pytest.mark.parametrize(
    ("value", "chain_named"),
    [
        ("kmt", ("top_k", "min_p", "temperature")),
        ("edkypmxt", ("penalties", "dry", "top_k", "typ_p", "top_p", "min_p", "xtc", "temperature")),
        ("kzt", ("top_k", "temperature")),  # an unknown letter is skipped
        (["top_k", "tfs_z", "typical_p", "typ_p", "temperature"], ("top_k", "typ_p", "temperature")),
        (["top-k", "temp", "min_p"], ("min_p",)),  # llama-server's list form reads canonical names only
        (["adaptive_p", "top_p"], ("top_p",)),
        ([], ()),
        (7, None),
    ],
)
def test_samplers_are_read_as_llama_server_reads_them(value, chain_named) -> None:
    assert chain.parse(value) == chain_named


@pytest.mark.parametrize(
    "params", [{"top_p": 0.0}, {"top_p": 1e-300}, {"xtc_threshold": 0.0, "xtc_probability": 1.0, "min_p": 0.3}]
)
def test_a_filter_at_zero_keeps_the_top_token_and_the_row_finite(params: dict) -> None:
    """top_p 0 (or below float32's least) keeps the top survivor, as llama-server's min_keep; an XTC
    threshold of 0 revives no token another stage dropped. Both made the row NaN before issue 34."""
    logits = rows(3)
    sampler = pipeline(**params)  # min-p drops tokens for XTC to revive
    got = p_of(sampler, logits, RowRng(7))
    assert np.all(np.isfinite(got)) and np.allclose(got.sum(axis=-1), 1.0, atol=1e-5)
    if "top_p" in params:
        assert np.all(got[np.arange(len(logits)), logits.argmax(axis=-1)] == 1.0)
