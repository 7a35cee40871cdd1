"""The contract's regression guards, run on real MLX models through the real round loop."""

from __future__ import annotations

import dataclasses
import itertools

import mlx.core as mx
import numpy as np
import pytest

from app.acceptance import Rule, rules
from app.decoding.builder import LoopBuilder, RowRequest
from app.decoding.generation import Generation
from app.decoding.goodput import Goodput
from app.decoding.loop import SpeculativeLoop
from app.decoding.plan import LoopPlan, Switches
from app.decoding.width import WidthOffer
from app.drafters.draft_model import DraftModelDrafter
from app.execution.model import LoadedModel, load_model
from app.execution.runner import ModelRunner
from app.sampling import SamplingParams
from ops.models.tiny import build_tiny_model
from tests.support.batched import Arrival, run_batched, seeded_rows, seeded_stream
from tests.support.costs import swinging_costs
from tests.support.derived_models import anti_drafter, fixed_distribution_pair
from tests.support.statistics import CRITICAL_DOF5_ALPHA_1E4, chi_square, sample_count

TOKENS = list(range(10, 16))
P = [0.35, 0.25, 0.15, 0.12, 0.08, 0.05]
Q = [0.10, 0.15, 0.30, 0.05, 0.25, 0.15]
SIX = SamplingParams(temperature=1.0, top_k=6, top_p=1.0, min_p=0.0)
GREEDY = SamplingParams(temperature=0.0)
PROMPTS = [
    "def merge_sorted(left, right):\n",
    "class LRUCache:\n    def __init__(self, capacity):\n",
    "import json\n\n\ndef load_config(path):\n",
]
# the closed-form test's rows per batch and their tokens: its 2,000 positions per arm from 24 rows
# of 128 tokens stepping together (12 rows of 256 until issue 44's fifth wave: the same positions
# in half the ticks, each 1.4 times the cost on the CPU)
ACCEPTANCE_ROWS, ACCEPTANCE_TOKENS = 24, 128


def run(generation: Generation) -> Generation:
    generation.prefill()
    while not generation.finished:
        generation.step()
    return generation


def speculative(
    target: LoadedModel,
    drafter: LoadedModel,
    k: int = 4,
    stochastic: bool = False,
    diagnose: bool = False,
    coupled: bool = True,
) -> LoopBuilder:
    switches = Switches(stochastic_accept=stochastic, accept_diag=diagnose)
    plan = LoopPlan(drafter_kind="draft-model", num_draft_tokens=k, switches=switches, coupled=coupled)
    return LoopBuilder(target, drafter, plan)


@pytest.fixture(scope="module")
def constant_pair(tmp_path_factory: pytest.TempPathFactory) -> tuple[LoadedModel, LoadedModel]:
    return fixed_distribution_pair(tmp_path_factory.mktemp("constant"), TOKENS, P, Q)


def emitted_stream(builder: LoopBuilder, n: int, rule: Rule | None = None) -> list[int]:
    def overrule(generation: Generation) -> None:
        if rule is not None:  # the loop judges with its speculation, the row reports it: both overruled
            overruled = dataclasses.replace(generation.speculation, rule=rule)
            generation.loop.speculation = generation.speculation = overruled

    return seeded_stream(builder, RowRequest(prompt=[1, 2, 3], sampling=SIX, max_tokens=0), n, overrule)


@pytest.mark.slow
@pytest.mark.parametrize(
    ("stochastic", "coupled"),
    [(False, True), (False, False), (True, False)],
    ids=["sampler-match", "sampler-match-uncoupled", "stochastic"],
)
def test_speculative_stream_matches_the_target_distribution(constant_pair, stochastic: bool, coupled: bool) -> None:
    builder = speculative(*constant_pair, k=2, stochastic=stochastic, coupled=coupled)
    generation = builder.build(RowRequest(prompt=[1], sampling=SIX, max_tokens=1))
    assert generation.speculation.rule is (Rule.STOCHASTIC if stochastic else Rule.SAMPLER_MATCH)
    assert generation.speculation.coupled is coupled  # the plan couples sampler-match only
    stat = chi_square(emitted_stream(builder, sample_count()), TOKENS, P)
    assert stat < CRITICAL_DOF5_ALPHA_1E4


@pytest.mark.slow
@pytest.mark.parametrize("stochastic", [False, True], ids=["sampler-match", "stochastic"])
def test_the_target_distribution_holds_for_rows_sharing_batches(constant_pair, stochastic: bool) -> None:
    """The rows under test step in batches with other traffic (greedy, sampled, target-only, a
    different width) that joins and leaves while they run."""
    builder = speculative(*constant_pair, k=2, stochastic=stochastic)
    wide, plain = speculative(*constant_pair, k=4), LoopBuilder(constant_pair[0], None, LoopPlan())
    rows = 12
    per_row = -(-sample_count() // rows)
    under_test = [
        builder.build(RowRequest(prompt=[1, 2, 3], sampling=SIX, max_tokens=per_row, seed=seed)) for seed in range(rows)
    ]
    traffic = [
        (wide, plain)[i % 2].build(
            RowRequest(prompt=[4, 5], sampling=(GREEDY, SIX)[i % 3 > 0], max_tokens=150, seed=1000 + i)
        )
        for i in range(12)
    ]
    arrivals = [Arrival(g, joins=i) for i, g in enumerate(under_test)]
    arrivals += [Arrival(g, joins=40 * i, leaves=40 * i + 90 if i % 4 == 3 else None) for i, g in enumerate(traffic)]
    assert run_batched(arrivals) >= rows + 2
    stream = [token for generation in under_test for token in generation.emitted]
    assert len(stream) >= sample_count()
    assert chi_square(stream[: sample_count()], TOKENS, P) < CRITICAL_DOF5_ALPHA_1E4


class CyclingWidth:
    """A width source that moves every round through 0 .. 4 proposals (0: a plain step)."""

    def __init__(self, seed: int) -> None:
        self.widths = itertools.cycle([(seed + i) % 5 for i in range(5)])
        self.current = next(self.widths)

    def proposals(self) -> int:
        return self.current

    def observe(self, tokens: list[int], proposed: int, verdict: object, seconds: float) -> None:
        self.current = next(self.widths)

    def notes(self) -> tuple:
        return ()


@pytest.mark.slow
@pytest.mark.parametrize("stochastic", [False, True], ids=["sampler-match", "stochastic"])
def test_the_target_distribution_holds_while_the_width_changes_every_round(constant_pair, stochastic: bool) -> None:
    """The width policy may change a row's width between any two rounds (its governor, its
    controller): the emitted stream is still the target's distribution (alpha 1e-4; the power
    test below is this statistic's calibration)."""
    builder = speculative(*constant_pair, k=4, stochastic=stochastic)

    def moving(generation: Generation) -> None:
        generation.widths.source = CyclingWidth(generation.state.rng.seed)

    stream = seeded_stream(builder, RowRequest(prompt=[1, 2, 3], sampling=SIX, max_tokens=0), sample_count(), moving)
    assert chi_square(stream, TOKENS, P) < CRITICAL_DOF5_ALPHA_1E4


@pytest.mark.slow
def test_the_target_distribution_holds_while_the_ticks_choice_moves_the_widths(constant_pair) -> None:
    """Sampler-match rows are load-free: the engine's choice sets each row's width before every
    tick (its acceptance against the tick's prices, which swing mid-stream here, probes and
    surveys; width 0 included). The stream is still the target's distribution (alpha 1e-4)."""
    builder = speculative(*constant_pair, k=4)
    goodput = Goodput(lambda: None)
    goodput.cost = swinging_costs(goodput)
    rows: list[Generation] = []

    def choose(live: list[Generation]) -> tuple[WidthOffer, ...]:
        rows.extend(g for g in live if g not in rows)
        return goodput.choose([g.widths for g in live]).offers

    request = RowRequest(prompt=[1, 2, 3], sampling=SIX, max_tokens=0)
    stream = seeded_stream(builder, request, sample_count(), before_tick=choose)
    assert all(g.widths.load_free and g.speculation.rule is Rule.SAMPLER_MATCH for g in rows)
    assert all(g.stats.plain_steps for g in rows) and len(set().union(*(g.stats.widths for g in rows))) >= 2
    assert chi_square(stream, TOKENS, P) < CRITICAL_DOF5_ALPHA_1E4


@pytest.mark.slow
def test_chi_square_rejects_argmax_against_argmax_in_the_loop(constant_pair) -> None:
    """Power calibration at loop level: the biased block-loop rule, run at T > 0, is caught."""
    stream = emitted_stream(speculative(*constant_pair, k=2), sample_count() * 3 // 10, rule=Rule.ARGMAX_AGAINST_ARGMAX)
    assert chi_square(stream, TOKENS, P) > CRITICAL_DOF5_ALPHA_1E4


@pytest.mark.slow
def test_chi_square_rejects_emitting_the_coupled_drafts(constant_pair, monkeypatch: pytest.MonkeyPatch) -> None:
    """Power calibration for coupling: coupled drafts agree with the target's draws so often that
    emitting them in its place is tempting, and biased (they follow q); the statistic catches a
    loop that accepts every coupled draft, at 3/10 of the guards' sample."""

    def accept_every_draft(drafts, drawn):
        return rules.Verdict(accepted=len(drafts), tokens=[*drafts, drawn[len(drafts)]], tested=len(drafts))

    monkeypatch.setattr(rules, "sampler_match", accept_every_draft)
    builder = speculative(*constant_pair, k=2)
    assert builder.build(RowRequest(prompt=[1], sampling=SIX, max_tokens=1)).speculation.coupled
    assert chi_square(emitted_stream(builder, sample_count() * 3 // 10), TOKENS, P) > CRITICAL_DOF5_ALPHA_1E4


@pytest.mark.parametrize("stochastic", [False, True], ids=["sampler-match", "stochastic"])
def test_filtered_target_support_is_never_violated(embedded_target, embedded_drafter, stochastic: bool) -> None:
    """Zero tolerance: every emitted token is one of the target's top 2 at its position."""
    sampling = SamplingParams(temperature=1.5, top_k=2, top_p=1.0, min_p=0.0)
    builder = speculative(embedded_target, embedded_drafter, stochastic=stochastic)
    for seed, text in enumerate(PROMPTS):
        prompt = embedded_target.tokenizer.encode(text)
        generation = run(builder.build(RowRequest(prompt=prompt, sampling=sampling, max_tokens=48, seed=seed)))
        # Replay single-token steps: byte-exact with the verify rows (see app/runtime/blas.py).
        runner = ModelRunner(embedded_target.model)
        logits = runner.prefill(prompt)
        for token in generation.emitted:
            # in the top 2 by value: bf16 logits (a GPU's) tie often, and a tie's order is the sort's
            row = np.array(logits[0].astype(mx.float32))
            assert row[token] >= np.sort(row)[-2], (token, row[token], np.sort(row)[-3:])
            logits = runner.forward([token])[-1:]


@pytest.fixture(scope="module")
def greedy_references(embedded_target) -> dict[str, tuple[list[int], str]]:
    """Target-only greedy decoding of each prompt (tokens, text), once for every k's test."""
    plain = LoopBuilder(embedded_target, None, LoopPlan())
    rows = {text: run(plain.build(greedy_request(embedded_target, text))) for text in PROMPTS}
    return {text: (row.emitted, row.text) for text, row in rows.items()}


def greedy_request(target: LoadedModel, text: str) -> RowRequest:
    return RowRequest(prompt=target.tokenizer.encode(text), sampling=GREEDY, max_tokens=64, seed=3)


@pytest.mark.parametrize("k", [1, 2, 4, 7])
def test_temperature_zero_stream_is_byte_identical_to_greedy_target_only(
    embedded_target, embedded_drafter, greedy_references, k
):
    plain = LoopBuilder(embedded_target, None, LoopPlan())
    spec = speculative(embedded_target, embedded_drafter, k=k, stochastic=True)
    for text in PROMPTS:
        request = greedy_request(embedded_target, text)
        drafted = run(spec.build(request))
        assert drafted.speculation.rule is Rule.GREEDY_ARGMAX
        assert (drafted.emitted, drafted.text) == greedy_references[text]
        # greedy drew nothing: the row's key stream is where a row that never ran has it
        assert drafted.state.rng.uniform() == plain.build(request).state.rng.uniform()


@pytest.fixture(scope="module")
def regimes(
    tmp_path_factory: pytest.TempPathFactory, embedded_target, embedded_drafter
) -> dict[str, tuple[LoadedModel, LoadedModel]]:
    root = tmp_path_factory.mktemp("regimes")
    target_dir = build_tiny_model(root / "target", layers=2, seed=1)
    target = load_model(target_dir)
    return {
        "all-accept": (target, load_model(target_dir)),  # the target drafting for itself
        "all-reject": (target, load_model(anti_drafter(target_dir, root / "anti"))),
        "mixed": (embedded_target, embedded_drafter),
    }


@pytest.mark.parametrize("regime", ["all-accept", "all-reject", "mixed"])
def test_kv_cache_and_draft_cache_rewind_arithmetic(regimes, regime: str) -> None:
    target, drafter = regimes[regime]
    k = 4
    generation = speculative(target, drafter, k=k).build(
        RowRequest(prompt=[5, 6, 7, 8], sampling=GREEDY, max_tokens=200, ignore_eos=True)
    )
    loop, state = generation.loop, generation.state
    assert isinstance(loop, SpeculativeLoop) and isinstance(loop.proposer, DraftModelDrafter)
    generation.prefill()
    accepted_counts = []
    for _ in range(25):
        before = generation.stats.acceptance.accepted
        generation.step()
        accepted_counts.append(generation.stats.acceptance.accepted - before)
        owed = loop.proposer.owed(state)
        # main cache: every decided token but the last; draft cache + owed == main cache
        assert loop.target.cache_offset == loop.target.length == len(state.tokens) - 1
        assert loop.proposer.runner.cache_offset == loop.proposer.runner.length
        assert loop.proposer.runner.cache_offset + len(owed) == loop.target.cache_offset
    if regime == "all-accept":
        assert set(accepted_counts) == {k}
    elif regime == "all-reject":
        assert set(accepted_counts) == {0}
    else:
        assert len(set(accepted_counts)) > 1


def test_a_fully_accepted_round_owes_its_last_proposal_and_the_next_round_pays_it(regimes) -> None:
    target, drafter = regimes["all-accept"]
    k = 3
    generation = speculative(target, drafter, k=k).build(
        RowRequest(prompt=[5, 6, 7, 8], sampling=GREEDY, max_tokens=100, ignore_eos=True)
    )
    loop, state = generation.loop, generation.state
    generation.prefill()
    emitted = generation.step().tokens
    assert len(emitted) == k + 1
    last_proposal = emitted[k - 1]
    # Never forwarded through the drafter: it is owed, ahead of the bonus token.
    assert loop.proposer.owed(state) == [last_proposal]
    length_before = loop.proposer.runner.length
    generation.step()
    # The next round fed [owed proposal, bonus] and then its own drafts.
    assert loop.proposer.runner.length >= length_before + 2
    assert loop.proposer.owed(state) == [state.tokens[-2]]


def test_penalty_history_is_rewound_on_rejection(regimes) -> None:
    target, drafter = regimes["all-reject"]
    sampling = SamplingParams(temperature=0.0, repeat_penalty=1.3, repeat_last_n=16)
    plain = LoopBuilder(target, None, LoopPlan())
    request = RowRequest(prompt=[5, 6, 7, 8], sampling=sampling, max_tokens=40, ignore_eos=True)
    drafted = run(speculative(target, drafter).build(request))
    assert drafted.state.history.window(-1) == drafted.state.tokens
    assert drafted.emitted == run(plain.build(request)).emitted


@pytest.mark.slow
def test_measured_acceptance_sits_on_the_closed_form_of_the_rule_that_ran(embedded_target, embedded_drafter) -> None:
    """T = 0.7, >= 2,000 tested positions each (3 SE): sampler-match at the coupled closed form
    with coupled drafts and at sum_prod without, stochastic at sum_min."""
    sampling = SamplingParams(temperature=0.7)
    arms = [(False, True, "closed_form_coupled"), (False, False, "closed_form_sum_prod"),
            (True, False, "closed_form_sum_min")]  # fmt: skip
    for stochastic, coupled, closed_form in arms:
        builder = speculative(embedded_target, embedded_drafter, stochastic=stochastic, diagnose=True, coupled=coupled)
        tested = accepted = 0
        forms: list[tuple[float, int]] = []
        for row in seeded_rows(builder, PROMPTS, sampling, ACCEPTANCE_ROWS, ACCEPTANCE_TOKENS):  # to 2,000 positions
            stats = row.stats.acceptance
            tested += stats.positions_tested
            accepted += stats.accepted
            forms.append((getattr(stats, closed_form), stats.diagnosed_positions))
            if tested >= 2000:
                break
        measured = accepted / tested
        predicted = sum(f * n for f, n in forms) / sum(n for _, n in forms)
        se = np.sqrt(predicted * (1 - predicted) / tested)
        assert abs(measured - predicted) <= 3 * se, (closed_form, measured, predicted, se)
