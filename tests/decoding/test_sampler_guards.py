"""The chi-square guard for llama-server's further stages: a p built with each, and the speculative
stream (sampler-match and the stochastic rule, k = 2) tested against it on the constant pair.

Stateless stages (top-n-sigma, typical, dynamic temperature) give the same p at every position: the
usual six-category test at alpha = 1e-4. DRY and mirostat depend on the row's history, so each
emitted token's p is the reference's, given the prefix the row actually emitted (mirostat's mu
replayed along it), and the statistic compares the counts with the summed expectations. That pooled
statistic is conservative (its covariance is at most the multinomial one of the same mean), so the
25.74 cut still rejects a correct sampler at most 1e-4 of the time. Each guard has a power test: the
stage left out, or carried wrongly across a verify round's positions, is rejected. A chain in a
custom order (app/sampling/chain.py) is held to its own p the same way, and the default order's
stream is rejected against it.
"""

from __future__ import annotations

import dataclasses
from collections import Counter

import mlx.core as mx
import numpy as np
import pytest
from msgspec.structs import replace

from app.decoding.builder import LoopBuilder, RowRequest
from app.decoding.generation import Generation
from app.decoding.plan import LoopPlan, Switches
from app.execution.model import LoadedModel
from app.execution.runner import ModelRunner
from app.sampling import SamplingParams
from app.sampling.mirostat import MirostatState
from tests.support import reference_sampler as ref
from tests.support.batched import run_rows, seeded_stream
from tests.support.derived_models import fixed_distribution_pair
from tests.support.statistics import CRITICAL_DOF5_ALPHA_1E4, chi_square, sample_count

TOKENS = list(range(10, 16))
P = [0.35, 0.25, 0.15, 0.12, 0.08, 0.05]
Q = [0.10, 0.15, 0.30, 0.05, 0.25, 0.15]
PROMPT = [1, 2, 3]
SIX = SamplingParams(temperature=1.0, top_k=6, top_p=1.0, min_p=0.0)
STATELESS = {
    "top_n_sigma": (replace(SIX, top_n_sigma=1.0), {"sigma": 1.0}),
    "typical": (replace(SIX, typical_p=0.5), {"typical_p": 0.5}),
    "dynatemp": (replace(SIX, dynatemp_range=0.9, dynatemp_exponent=0.5), {"dynatemp": (0.9, 0.5)}),
}
DRY = replace(SIX, dry_multiplier=1.0, dry_base=1.75, dry_allowed_length=2, dry_penalty_last_n=-1)
# A chain in an order of its own: the temperature first flattens the row, so top-p keeps three
# tokens where the default order (top-p, then the temperature) keeps two.
CUSTOM = replace(SIX, temperature=2.5, top_p=0.5, samplers=("temperature", "top_p"))
MIROSTAT = {v: SamplingParams(temperature=1.0, mirostat=v, mirostat_tau=1.5, mirostat_eta=0.5) for v in (1, 2)}
ROWS = 40  # history-dependent streams: ROWS rows stepping together
POWER_SHARE = 0.6  # a power test's stream, of a guard's: its planted fault is caught with margin at 3,000 tokens


@pytest.fixture(scope="module")
def constant_pair(tmp_path_factory: pytest.TempPathFactory) -> tuple[LoadedModel, LoadedModel]:
    return fixed_distribution_pair(tmp_path_factory.mktemp("constant"), TOKENS, P, Q)


@pytest.fixture(scope="module")
def logits(constant_pair) -> np.ndarray:
    """The target's row (the same at every position)."""
    return np.array(ModelRunner(constant_pair[0].model).prefill(PROMPT)[-1].astype(mx.float32), dtype=np.float64)


def fit(stream: list[int], p: np.ndarray) -> float:
    """The six-category statistic on p's support (a stage may drop tokens: fewer categories, and the
    dof-5 cut is then stricter than alpha = 1e-4; a token off the support fails outright)."""
    support = [i for i, pi in enumerate(p) if pi > 0]
    return chi_square(stream, [TOKENS[i] for i in support], [float(p[i]) for i in support])


def speculative(pair, stochastic: bool) -> LoopBuilder:
    plan = LoopPlan(drafter_kind="draft-model", num_draft_tokens=2, switches=Switches(stochastic_accept=stochastic))
    return LoopBuilder(*pair, plan)


def rows_of(builder: LoopBuilder, sampling: SamplingParams, share: float = 1.0) -> list[Generation]:
    per_row = -(-int(sample_count() * share) // ROWS)
    return run_rows(
        [builder.build(RowRequest(prompt=PROMPT, sampling=sampling, max_tokens=per_row, seed=s)) for s in range(ROWS)]
    )


def pooled_chi_square(rows: list[tuple[list[int], list[np.ndarray]]]) -> float:
    """(emitted tokens, each one's p) of every row: sum over TOKENS of (observed - expected)^2 / expected."""
    counts, expected, misses = Counter(), np.zeros(len(TOKENS)), 0
    for tokens, ps in rows:
        for token, p in zip(tokens, ps, strict=True):
            counts[token] += 1
            expected += p[TOKENS]
            misses += p[token] == 0
    stat = sum((counts[t] - e) ** 2 / e for t, e in zip(TOKENS, expected, strict=True) if e > 0)
    return stat + (float("inf") if misses else 0.0)


def dry_expectations(logits: np.ndarray, emitted: list[int]) -> list[np.ndarray]:
    out, history = [], list(PROMPT)
    for token in emitted:
        adjusted = ref.dry(logits, history, 1.0, 1.75, 2, set())
        out.append(ref.final_distribution(adjusted, temperature=1.0, top_k=6))
        history.append(token)
    return out


def mirostat_expectations(logits: np.ndarray, emitted: list[int], version: int) -> list[np.ndarray]:
    out, mu = [], 2 * 1.5
    for token in emitted:
        p = ref.mirostat(logits, mu, version, 1.0, len(logits))
        out.append(p)
        mu -= 0.5 * (-np.log2(p[token]) - 1.5) if p[token] > 0 else 0.0
    return out


@pytest.mark.slow
@pytest.mark.parametrize("stage", sorted(STATELESS))
def test_a_stateless_stage_keeps_the_stream_on_its_p(constant_pair, logits, stage: str) -> None:
    """Under the stochastic rule, whose q (the drafter's row through the same stages) matters too."""
    sampling, reference = STATELESS[stage]
    p = ref.final_distribution(logits, temperature=1.0, top_k=6, **reference)[TOKENS]
    assert not np.allclose(p, P, atol=0.02)  # the stage changes p here
    request = RowRequest(prompt=PROMPT, sampling=sampling, max_tokens=0)
    stream = seeded_stream(speculative(constant_pair, True), request, sample_count())
    assert fit(stream, p) < CRITICAL_DOF5_ALPHA_1E4


@pytest.mark.slow
@pytest.mark.parametrize("stage", sorted(STATELESS))
def test_chi_square_rejects_the_stream_without_the_stage(constant_pair, logits, stage: str) -> None:
    _, reference = STATELESS[stage]
    p = ref.final_distribution(logits, temperature=1.0, top_k=6, **reference)[TOKENS]
    request = RowRequest(prompt=PROMPT, sampling=SIX, max_tokens=0)
    stream = seeded_stream(speculative(constant_pair, False), request, int(sample_count() * POWER_SHARE))
    assert fit(stream, p) > CRITICAL_DOF5_ALPHA_1E4


@pytest.mark.slow
@pytest.mark.parametrize("stochastic", [False, True], ids=["sampler-match", "stochastic"])
def test_dry_keeps_the_stream_on_each_positions_p(constant_pair, logits, stochastic: bool) -> None:
    rows = rows_of(speculative(constant_pair, stochastic), DRY)
    assert pooled_chi_square([(g.emitted, dry_expectations(logits, g.emitted)) for g in rows]) < CRITICAL_DOF5_ALPHA_1E4


@pytest.mark.slow
def test_chi_square_rejects_a_stream_without_dry(constant_pair, logits) -> None:
    rows = rows_of(speculative(constant_pair, False), SIX, POWER_SHARE)
    assert pooled_chi_square([(g.emitted, dry_expectations(logits, g.emitted)) for g in rows]) > CRITICAL_DOF5_ALPHA_1E4


@pytest.mark.slow
@pytest.mark.parametrize(
    ("version", "stochastic"), [(1, False), (2, False), (2, True)], ids=["v1", "v2", "v2-stochastic"]
)
def test_mirostat_keeps_the_stream_on_each_positions_p(constant_pair, logits, version: int, stochastic: bool) -> None:
    rows = rows_of(speculative(constant_pair, stochastic), MIROSTAT[version])
    stat = pooled_chi_square([(g.emitted, mirostat_expectations(logits, g.emitted, version)) for g in rows])
    assert stat < CRITICAL_DOF5_ALPHA_1E4


@pytest.mark.slow
@pytest.mark.parametrize("wrong", ["mu never settles", "mu not chained through the round"])
def test_chi_square_rejects_mirostat_carried_wrongly(constant_pair, logits, monkeypatch, wrong: str) -> None:
    if wrong == "mu never settles":
        monkeypatch.setattr(MirostatState, "observe", lambda self, rows, tokens: None)
    else:
        unchained = MirostatState.rows
        monkeypatch.setattr(MirostatState, "rows", lambda self, logits, previous: unchained(self, logits, None))
    rows = rows_of(speculative(constant_pair, False), MIROSTAT[2], POWER_SHARE)
    stat = pooled_chi_square([(g.emitted, mirostat_expectations(logits, g.emitted, 2)) for g in rows])
    assert stat > CRITICAL_DOF5_ALPHA_1E4


@pytest.mark.parametrize(
    "stage",
    [
        {"dry_multiplier": 1.5, "dry_allowed_length": 1},
        {"top_n_sigma": 1.0},
        {"typical_p": 0.5},
        {"dynatemp_range": 0.5},
        {"mirostat": 1},
        {"mirostat": 2},
    ],
    ids=["dry", "top_n_sigma", "typical", "dynatemp", "mirostat1", "mirostat2"],
)
def test_temperature_zero_speculation_is_byte_identical_with_each_stage(
    embedded_target, embedded_drafter, stage
) -> None:
    """At T = 0 every stage but DRY leaves the argmax alone; DRY moves it, per position, with the
    drafts before it in the history: the drafted stream is the target-only one, token for token."""
    sampling = replace(SamplingParams(temperature=0.0), **stage)
    prompt = embedded_target.tokenizer.encode("def fizzbuzz(n):\n    for i in range(n):\n")
    request = RowRequest(prompt=prompt, sampling=sampling, max_tokens=48, seed=1)
    plain = run_rows([LoopBuilder(embedded_target, None, LoopPlan()).build(request)])[0]
    plan = LoopPlan(drafter_kind="draft-model", num_draft_tokens=4)
    drafted = run_rows([LoopBuilder(embedded_target, embedded_drafter, plan).build(request)])[0]
    assert drafted.stats.ran
    assert drafted.emitted == plain.emitted
    if "dry_multiplier" in stage:  # DRY changed the greedy stream here, so the identity is not vacuous
        undry = run_rows(
            [
                LoopBuilder(embedded_target, None, LoopPlan()).build(
                    dataclasses.replace(request, sampling=SamplingParams(temperature=0.0))
                )
            ]
        )[0]
        assert undry.emitted != plain.emitted


@pytest.mark.slow
@pytest.mark.parametrize("stochastic", [False, True], ids=["sampler-match", "stochastic"])
def test_a_custom_chain_order_keeps_the_stream_on_its_p(constant_pair, logits, stochastic: bool) -> None:
    """The drafter's q and the target's p run the same chain, so any order stays lossless."""
    p = ref.chained(logits, ["temperature", "top_p"], temperature=2.5, top_p=0.5)[TOKENS]
    in_default_order = ref.final_distribution(logits, temperature=2.5, top_k=6, top_p=0.5)[TOKENS]
    assert np.count_nonzero(p) == 3 and np.count_nonzero(in_default_order) == 2  # the order matters here
    request = RowRequest(prompt=PROMPT, sampling=CUSTOM, max_tokens=0)
    stream = seeded_stream(speculative(constant_pair, stochastic), request, sample_count())
    assert fit(stream, p) < CRITICAL_DOF5_ALPHA_1E4


@pytest.mark.slow
def test_chi_square_rejects_the_default_order_against_a_custom_chains_p(constant_pair, logits) -> None:
    p = ref.chained(logits, ["temperature", "top_p"], temperature=2.5, top_p=0.5)[TOKENS]
    request = RowRequest(prompt=PROMPT, sampling=replace(CUSTOM, samplers=SIX.samplers), max_tokens=0)
    stream = seeded_stream(speculative(constant_pair, False), request, int(sample_count() * POWER_SHARE))
    assert fit(stream, p) > CRITICAL_DOF5_ALPHA_1E4
