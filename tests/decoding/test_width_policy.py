"""The width policy (app/decoding/width.py): the row's cap, the round's width decided once, the
measured forward cost, the goodput choice under load, and exactness while the widths move."""

from __future__ import annotations

import random

import pytest

from app.acceptance import Verdict
from app.decoding.adaptive import FixedWidth
from app.decoding.batch import run_together
from app.decoding.builder import LoopBuilder, RowRequest
from app.decoding.plan import LoopPlan, plan_from_settings
from app.decoding.width import Goodput, GovernedWidth, WidthPolicy, expected_tokens, row_n_max
from app.drafters.governor import make_governor
from app.execution.cost import ForwardCost
from app.execution.model import LoadedModel
from app.loading.paths import REPO_ROOT
from app.profiles.schema import DrafterSettings, Settings
from app.sampling import SamplingParams
from tests.support.batched import run_rows

GREEDY = SamplingParams(temperature=0.0)
PROMPTS = ["def merge_sorted(left, right):\n", "class LRUCache:\n", "import json\n\n\ndef load(path):\n"]


def test_the_row_cap_is_the_plans_lowered_never_raised_by_the_request() -> None:
    assert [row_n_max(7, n) for n in (None, 3, 7, 99, 0)] == [7, 3, 7, 7, 0]


def test_expected_tokens_is_leviathans_closed_form() -> None:
    assert expected_tokens(0.0, 5) == pytest.approx(1.0)  # every first draft rejected: the recovered token
    assert expected_tokens(0.5, 1) == pytest.approx(1.5)
    assert expected_tokens(0.8, 4) == pytest.approx((1 - 0.8**5) / 0.2)
    assert expected_tokens(1.0, 4) < 5.0  # capped below certainty: finite, and below width + 1


def test_forward_cost_fits_a_line_through_its_buckets() -> None:
    cost = ForwardCost()
    cost.observe(4, 0.014)
    assert cost.line() is None  # one bucket says nothing about the slope
    for positions in (16, 64, 64, 4):
        cost.observe(positions, 0.01 + 0.001 * positions)
    assert cost.line() == pytest.approx((0.01, 0.001), rel=1e-6)


def policy(n_max: int = 7, load_free: bool = True, alpha: float = 0.5, n_min: int = 0) -> WidthPolicy:
    return WidthPolicy(FixedWidth(7), n_max=n_max, n_min=n_min, load_free=load_free, alpha=alpha)


def test_a_round_is_decided_once_within_cap_budget_and_the_ticks_limit() -> None:
    row = policy(n_max=5)
    assert row.wanted() == 5 and row.decide(budget=100) == 5
    assert row.decide(budget=3) == 2  # the round's last token is within the budget too
    row.limit = 1
    assert row.decide(budget=100) == 1
    assert row.decide(budget=100) == 5  # a tick's limit holds for that tick's round only
    assert policy(n_min=3).retracts(2) and not policy(n_min=3).retracts(3) and policy().retracts(0)


def test_observed_rounds_move_the_acceptance_estimate() -> None:
    row = policy(alpha=0.5)
    row.decide(budget=100)
    row.observe([2], 7, Verdict(accepted=0, tokens=[2], tested=1), 0.001)
    assert row.alpha == pytest.approx(0.35)
    row.observe([1] * 8, 7, Verdict(accepted=7, tokens=[1] * 8, tested=7), 0.001)
    assert row.alpha == pytest.approx(0.545)  # a full accept pulls it back up
    row.observe([3], 0, None, 0.001)
    assert row.alpha == pytest.approx(0.545)  # a plain step is no evidence


def measured(fixed: float, per_position: float) -> ForwardCost:
    cost = ForwardCost()
    for positions in (8, 64):
        cost.observe(positions, fixed + per_position * positions)
    return cost


def test_under_load_low_acceptance_rows_are_narrowed_where_it_pays() -> None:
    """Sixteen rows accepting 30 % per position on a forward whose positions dominate its cost:
    width 7 spends positions that mostly get rejected, so the choice narrows them."""
    rows = [policy(alpha=0.3) for _ in range(16)]
    goodput = Goodput(lambda: measured(0.001, 0.001))
    change = goodput.choose(rows, positions=0)
    assert change is not None and change.batch == 16 and change.cap is not None and change.cap < 7
    assert change.expected_gain > 1.02 and all(row.limit == change.cap for row in rows)
    assert goodput.choose(rows, positions=0) is None  # unchanged: no second event


def test_a_forward_whose_cost_is_fixed_keeps_the_full_width() -> None:
    rows = [policy(alpha=0.8) for _ in range(4)]
    assert Goodput(lambda: measured(0.05, 0.00001)).choose(rows, positions=0) is None
    assert all(row.limit is None for row in rows)


def test_sampled_rows_and_lone_rows_are_never_narrowed() -> None:
    sampled = [policy(alpha=0.3, load_free=False) for _ in range(8)]
    greedy = [policy(alpha=0.3) for _ in range(8)]
    Goodput(lambda: measured(0.001, 0.001)).choose(sampled + greedy, positions=0)
    assert all(row.limit is None for row in sampled) and all(row.limit is not None for row in greedy)
    lone = [policy(alpha=0.0)]
    assert Goodput(lambda: measured(0.001, 0.001)).choose(lone, positions=0) is None and lone[0].limit is None
    unmeasured = [policy(alpha=0.0) for _ in range(8)]
    assert Goodput(lambda: ForwardCost()).choose(unmeasured, positions=0) is None


def builder_of(kind: str, target: LoadedModel, drafter: LoadedModel) -> LoopBuilder:
    if kind == "mtp":
        settings = Settings(drafter=DrafterSettings(kind="mtp", model=str(REPO_ROOT / "models" / "mtp")))
        return LoopBuilder(target, None, plan_from_settings(settings, environ={}))
    plan = LoopPlan(drafter_kind=kind, num_draft_tokens=4, governor_policy="break-even")
    return LoopBuilder(target, drafter if kind == "draft-model" else None, plan)


@pytest.mark.parametrize("kind", ["draft-model", "prompt-lookup", "mtp"])
def test_temperature_zero_rows_are_byte_identical_while_the_ticks_cap_moves(
    embedded_target, embedded_drafter, kind: str
) -> None:
    """Every tick caps each row at a random width (0 to the row's cap): the greedy stream is the
    target's own, and the rows did run at several widths."""
    plain = LoopBuilder(embedded_target, None, LoopPlan())
    builder = builder_of(kind, embedded_target, embedded_drafter)
    encode = embedded_target.tokenizer.encode
    requests = [RowRequest(encode(prompt), GREEDY, max_tokens=40, ignore_eos=True) for prompt in PROMPTS]
    expected = [generation.emitted for generation in run_rows([plain.build(r) for r in requests])]
    rows = [builder.build(request) for request in requests]
    for generation in rows:
        assert generation.widths is not None and generation.widths.load_free
        generation.prefill()
    draw = random.Random(0)
    while live := [g for g in rows if not g.finished]:
        for generation in live:
            generation.widths.limit = draw.randint(0, generation.n_max)
        for outcome in run_together([g.steps() for g in live]):
            if isinstance(outcome, Exception):
                raise outcome
    assert [g.emitted for g in rows] == expected
    assert sum(len(g.stats.widths) >= 2 for g in rows) >= 2


def test_governor_pauses_reach_the_rows_stats_as_notes(embedded_target) -> None:
    """A prompt-lookup row whose lookups stop paying: its governor pauses (and resumes on its
    shadow lookups), and the row's stats count each change once, from its rounds' outcomes."""
    plan = LoopPlan(drafter_kind="prompt-lookup", num_draft_tokens=7, governor_policy="break-even")
    prompt = embedded_target.tokenizer.encode("def f(x):\n    return x\n")
    generation = LoopBuilder(embedded_target, None, plan).build(RowRequest(prompt, GREEDY, max_tokens=60))
    generation.prefill()
    while not generation.finished:
        generation.step()
    governor = generation.widths.source.governor
    assert governor.pauses >= 1
    assert (generation.stats.governor_pauses, generation.stats.governor_resumes) == (governor.pauses, governor.resumes)
    paused = [note for note in generation.notes if note.event == "governor_paused"]
    assert len(paused) == governor.pauses
    assert all(set(note.fields) == {"ema", "floor"} for note in paused)


def test_the_cap_in_force_holds_until_another_beats_it_clearly() -> None:
    rows = [policy(alpha=0.3) for _ in range(16)]
    goodput = Goodput(lambda: measured(0.001, 0.001))
    first = goodput.choose(rows, positions=0)
    assert first is not None
    for row in rows:  # acceptance drifts a little: the best cap may move by one, not enough to switch
        row.alpha = 0.32
    assert goodput.choose(rows, positions=0) is None and goodput.cap == first.cap
    goodput.cost = lambda: measured(0.05, 0.00001)  # positions cost nothing now: no cap pays
    lifted = goodput.choose(rows, positions=0)
    assert lifted is not None and lifted.cap is None and lifted.previous == first.cap


def test_a_zero_cap_still_verifies_one_draft_every_eighth_tick() -> None:
    """At cap 0 nothing is verified, so acceptance could never move: every eighth tick at cap 0
    caps the rows at one draft instead (and logs nothing: the cap in force is still 0)."""
    rows = [policy(alpha=0.0) for _ in range(8)]
    goodput = Goodput(lambda: measured(0.001, 0.001))
    limits, changes = [], []
    for _ in range(16):
        changes.append(goodput.choose(rows, positions=0))
        limits.append(rows[0].limit)
    assert goodput.cap == 0 and sum(change is not None for change in changes) == 1
    assert limits.count(1) == 2 and limits.count(0) == 14


def test_a_round_the_load_narrowed_is_no_evidence_for_the_governor() -> None:
    governor = make_governor(7, policy="break-even")
    row = WidthPolicy(GovernedWidth(governor, lambda n: []), n_max=7, load_free=True)
    for _ in range(4):  # narrowed rounds of one draft: below the floor, yet no pause
        row.limit = 1
        assert row.decide(100) == 1
        row.observe([5, 6], 1, Verdict(accepted=1, tokens=[5, 6], tested=1), 0.001)
    assert governor.observed_rounds == 0 and not governor.paused
    for _ in range(2):  # full rounds that miss: the governor's own evidence, and its pause
        assert row.decide(100) == 7
        row.observe([5], 7, Verdict(accepted=0, tokens=[5], tested=1), 0.001)
    assert governor.observed_rounds == 2 and governor.paused and row.wanted() == 0
