"""Structured outputs under speculation: exact at T = 0, lossless w.r.t. the masked target at T = 0.7.

The chi-square guards run the contract's statistic (six categories, dof 5, alpha 1e-4) on models
whose next-token distribution is fixed (tests/support/derived_models.py) over eight digits; the
grammar forbids two of them, so the reference is the target's row masked and renormalised.
"""

from __future__ import annotations

import json

import pytest

from app.acceptance import Rule
from app.decoding.builder import LoopBuilder, RowRequest
from app.decoding.generation import Generation
from app.decoding.plan import LoopPlan, Switches, plan_from_settings
from app.drafters.draft_model import DraftModelDrafter
from app.execution.model import LoadedModel
from app.loading.paths import REPO_ROOT
from app.profiles.schema import DrafterSettings, Settings
from app.sampling import SamplingParams
from app.sampling.grammar import Grammar
from tests.support.batched import run_rows, seeded_stream
from tests.support.derived_models import fixed_distribution_pair
from tests.support.statistics import CRITICAL_DOF5_ALPHA_1E4, chi_square, sample_count

DIGITS = list(range(19, 27))  # the tokens "0" .. "7" of the embedded tokenizer
P = [0.25, 0.15, 0.10, 0.12, 0.08, 0.05, 0.15, 0.10]
Q = [0.05, 0.10, 0.20, 0.05, 0.15, 0.10, 0.05, 0.30]
ALLOWED = DIGITS[:6]  # "0" .. "5": the grammar forbids "6" and "7"
TEMPERATURE = 0.7
TEMPERED = [p ** (1 / TEMPERATURE) for p in P[:6]]
MASKED_P = [p / sum(TEMPERED) for p in TEMPERED]  # the target's row at T = 0.7, masked, renormalised
SIX_DIGITS = Grammar.gbnf("root ::= [0-5]*")
SAMPLED = SamplingParams(temperature=TEMPERATURE, top_k=8, top_p=1.0, min_p=0.0)
GREEDY = SamplingParams(temperature=0.0)
PERSON = Grammar.json_schema(
    {
        "type": "object",
        "properties": {"name": {"type": "string"}, "age": {"type": "integer"}, "tags": {"type": "array"}},
        "required": ["name", "age", "tags"],
    }
)
BLOCK_KINDS = ("mtp", "dflash")
MODELS = REPO_ROOT / "models"
PROMPTS = ["Describe a person as JSON: ", "def parse(record):\n    return ", '{"name": "Ada", "age": 36}\n']


def run(generation: Generation) -> Generation:
    generation.prefill()
    while not generation.finished:
        generation.step()
    return generation


def builder(target: LoadedModel, drafter: LoadedModel | None, kind: str, k: int = 4, stochastic: bool = False):
    if kind in BLOCK_KINDS:  # the block drafter, as a profile names it
        return LoopBuilder(
            target, None, plan_from_settings(Settings(drafter=DrafterSettings(kind=kind, model=str(MODELS / kind))))
        )
    plan = LoopPlan(drafter_kind=kind, num_draft_tokens=k, switches=Switches(stochastic_accept=stochastic))
    return LoopBuilder(target, drafter, plan)


@pytest.fixture(scope="module")
def digit_pair(tmp_path_factory: pytest.TempPathFactory) -> tuple[LoadedModel, LoadedModel]:
    return fixed_distribution_pair(tmp_path_factory.mktemp("digits"), DIGITS, P, Q)


class UnmaskedDrafter(DraftModelDrafter):
    """The fault the power test must catch: drafts and q from the drafter's unmasked row (the
    loop still cuts the drafts the grammar forbids)."""

    def proposing(self, state, width):
        constraint, state.constraint = state.constraint, None
        try:
            return (yield from super().proposing(state, width))
        finally:
            state.constraint = constraint


def constrained_stream(builder: LoopBuilder, n: int, unmasked: bool = False) -> list[int]:
    def fault(generation: Generation) -> None:
        if unmasked:
            generation.loop.proposer.__class__ = UnmaskedDrafter

    request = RowRequest(prompt=[1, 2, 3], sampling=SAMPLED, max_tokens=0, grammar=SIX_DIGITS)
    return seeded_stream(builder, request, n, fault)


def greedy_request(target: LoadedModel, text: str) -> RowRequest:
    return RowRequest(target.tokenizer.encode(text), GREEDY, max_tokens=96, seed=3, grammar=PERSON)


@pytest.fixture(scope="module")
def constrained_target_only(embedded_target) -> dict[str, Generation]:
    """Each prompt's constrained target-only row, run once for every drafter kind's test."""
    plain = LoopBuilder(embedded_target, None, LoopPlan())
    return {text: run(plain.build(greedy_request(embedded_target, text))) for text in PROMPTS}


@pytest.mark.parametrize("kind", ["draft-model", "prompt-lookup", *BLOCK_KINDS])
def test_constrained_speculation_at_t0_is_byte_identical_to_constrained_target_only(
    embedded_target, embedded_drafter, constrained_target_only, kind: str
) -> None:
    drafted = builder(embedded_target, embedded_drafter if kind == "draft-model" else None, kind)
    for text in PROMPTS:
        reference = constrained_target_only[text]
        speculative = run(drafted.build(greedy_request(embedded_target, text)))
        assert speculative.speculation.rule in (Rule.GREEDY_ARGMAX, Rule.ARGMAX_AGAINST_ARGMAX)
        assert speculative.stats.acceptance.rounds > 0
        assert speculative.emitted == reference.emitted
        if reference.stop_type == "eos":  # a finished document parses and has the schema's keys
            assert {"name", "age", "tags"} <= set(json.loads(reference.text))


def test_every_decided_token_is_within_the_grammar(embedded_target, embedded_drafter) -> None:
    """Sampled at a high temperature, the text is still a prefix of a valid document."""
    sampling = SamplingParams(temperature=1.5, top_k=0, top_p=1.0, min_p=0.0)
    drafted = builder(embedded_target, embedded_drafter, "draft-model", stochastic=True)
    requests = [RowRequest(embedded_target.tokenizer.encode(text), sampling, max_tokens=400, seed=seed, grammar=PERSON)
                for seed, text in enumerate(PROMPTS)]  # fmt: skip
    for generation in run_rows([drafted.build(request) for request in requests]):  # stepping together
        check = drafted.grammar_vocabulary.constraint(PERSON)
        check.consume(generation.emitted)  # raises on a token the grammar forbids
        if generation.stop_type == "eos":
            assert {"name", "age", "tags"} <= set(json.loads(generation.text))


@pytest.mark.slow
@pytest.mark.parametrize("stochastic", [False, True], ids=["sampler-match", "stochastic"])
def test_constrained_stream_matches_the_masked_target_distribution(digit_pair, stochastic: bool) -> None:
    """The contract's statistic (dof 5, alpha 1e-4) over the contract's stream length: the power
    test below catches an unmasked drafter row with 3,000 tokens (statistic ~180, seven times the
    threshold). `MLXCEL_SPEC_DIST_SAMPLES` scales this run too."""
    n = sample_count()
    stream = constrained_stream(builder(*digit_pair, "draft-model", k=2, stochastic=stochastic), n)
    assert chi_square(stream, ALLOWED, MASKED_P) < CRITICAL_DOF5_ALPHA_1E4


@pytest.mark.slow
def test_chi_square_rejects_an_unmasked_drafter_row(digit_pair) -> None:
    """Power: modified rejection with q from the drafter's unmasked row is biased, and caught."""
    stream = constrained_stream(builder(*digit_pair, "draft-model", k=2, stochastic=True), 3000, unmasked=True)
    assert chi_square(stream, ALLOWED, MASKED_P) > CRITICAL_DOF5_ALPHA_1E4
