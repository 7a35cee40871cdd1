"""The width policy (app/decoding/width.py): the row's cap, the round's width decided once, the
measured forward cost, the goodput choice under load (app/decoding/goodput.py), and exactness
while the widths move."""

from __future__ import annotations

import itertools
import random
from dataclasses import replace

import mlx.nn as nn
import pytest

from app.acceptance import Rule, Verdict
from app.decoding.adaptive import ControlledWidth, FixedWidth, WidthController
from app.decoding.builder import LoopBuilder, RowRequest
from app.decoding.goodput import SURVEY_EVERY, Goodput, Tick
from app.decoding.plan import LoopPlan, plan_from_settings
from app.decoding.width import (
    FORGET,
    OWN_WIDTH,
    Acceptance,
    GovernedWidth,
    WidthOffer,
    WidthPolicy,
    expected_tokens,
    row_n_max,
)
from app.drafters.governor import make_governor
from app.drafters.passes import NO_PASSES, DrafterPasses, PassShape
from app.execution.cost import DRAFTING, HOST, TARGET_ROWS, ForwardCost, PlaneCost, cost_of, forget, plane_of
from app.execution.model import LoadedModel
from app.execution.steps import run_together
from app.loading.paths import REPO_ROOT
from app.profiles.schema import DrafterSettings, Settings
from app.sampling import SamplingParams
from tests.support.batched import run_rows
from tests.support.costs import measured, swinging_costs

GREEDY = SamplingParams(temperature=0.0)
HOT = SamplingParams(temperature=0.7)
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
    module = nn.Linear(1, 1)
    cost_of(module).observe(4, 0.01)
    for record in (TARGET_ROWS, HOST, DRAFTING):
        plane_of(module, record).observe((2, 4), 0.01)
    forget(module)  # what the warm-up measured was kernels compiling
    assert not cost_of(module).buckets
    assert not any(plane_of(module, record).buckets for record in (TARGET_ROWS, HOST, DRAFTING))


def policy(
    n_max: int = 7, load_free: bool = True, alpha: float = 0.5, n_min: int = 0, passes: DrafterPasses = NO_PASSES
) -> WidthPolicy:
    """A row that has run one round (the tick's choice leaves a row's first round at its own width)."""
    acceptance = Acceptance.prior(alpha)
    acceptance.rounds = 1
    return WidthPolicy(FixedWidth(7), n_max=n_max, n_min=n_min, load_free=load_free, passes=passes,
                       acceptance=acceptance)  # fmt: skip


def test_the_targets_forwards_are_fitted_against_rows_and_positions() -> None:
    """A forward costing 5 ms, 2 ms a row and 0.1 ms a position: the plane recovers each part once
    the forwards ran at more than one width; at one width alone rows and positions cannot be told
    apart, and the fit then prices positions alone (a row more as much as a wider row)."""
    cost = PlaneCost(keep=(1, 0))  # positions before rows, as the engine's record
    for rows in (1, 2, 4, 8):
        cost.observe((rows, 5 * rows), 0.005 + 0.002 * rows + 0.0001 * 5 * rows)
    fixed, (per_row, per_position) = cost.plane()
    assert per_row == 0.0 and per_position == pytest.approx(0.0005, rel=1e-6)
    for rows, width in ((8, 0), (4, 2), (16, 1)):
        positions = rows * (1 + width)
        cost.observe((rows, positions), 0.005 + 0.002 * rows + 0.0001 * positions)
    fixed, parts = cost.plane()
    assert (fixed, *parts) == pytest.approx((0.005, 0.002, 0.0001), rel=1e-6)
    rows = [policy(alpha=0.5) for _ in range(8)]
    line = lambda: measured(0.005, 0.0021)  # noqa: E731 - one line through rows and positions alike
    assert widths_after(Goodput(line), rows) == [0] * 8  # every position priced like a row: no drafting pays
    rows = [policy(alpha=0.5) for _ in range(8)]
    assert all(w >= 3 for w in widths_after(Goodput(line, target=lambda: cost), rows))  # a position is cheap


def test_a_verify_rounds_own_host_work_is_priced_apart_from_its_positions() -> None:
    """Host work of 1 ms a verifying row, nothing per position: a row that drafts at all pays
    the millisecond once, so it drafts wide or not at all, never a single draft."""
    host = PlaneCost(keep=(1, 2, 3, 0))
    for rows, verifying, positions in ((8, 0, 8), (8, 8, 40), (4, 2, 10), (8, 4, 20), (2, 2, 6), (4, 4, 8)):
        host.observe((rows, verifying, positions, 0), 0.0002 * rows + 0.001 * verifying)
    fixed, parts = host.plane()
    assert (fixed, *parts) == pytest.approx((0.0, 0.0002, 0.001, 0.0, 0.0), abs=1e-9)
    target = lambda: measured(0.01, 0.00001)  # noqa: E731
    widths = widths_after(Goodput(target, host=lambda: host), [policy(alpha=0.6) for _ in range(8)])
    assert all(w >= 3 for w in widths)
    widths = widths_after(Goodput(target, host=lambda: host), [policy(alpha=0.05) for _ in range(8)])
    assert widths == [0] * 8


def test_a_round_is_decided_once_within_cap_budget_and_the_ticks_limit() -> None:
    row = policy(n_max=5)
    assert row.wanted() == 5 and row.decide(budget=100) == 5 and row.current == 5
    assert row.decide(budget=3) == 2  # the round's last token is within the budget too
    assert row.decide(budget=100, limit=1) == 1 and row.current == 1
    assert row.decide(budget=100) == 5  # a tick's limit holds for that tick's round only
    assert row.decide(budget=100, limit=0) == 0 and row.current == 0  # width 0: the row decodes plainly
    assert policy(n_min=3).retracts(2) and not policy(n_min=3).retracts(3) and policy().retracts(0)


def test_observed_rounds_move_the_acceptance_estimate_by_positions_tested() -> None:
    row = WidthPolicy(FixedWidth(7), n_max=7)
    assert row.alpha == pytest.approx(0.5) and row.acceptance.rounds == 0
    row.decide(budget=100)
    row.observe([1] * 8, 7, Verdict(accepted=7, tokens=[1] * 8, tested=7), 0.001)
    assert row.alpha == pytest.approx((FORGET * 0.5 + 7) / (FORGET + 7))  # seven positions outweigh the prior
    row.observe([2], 7, Verdict(accepted=0, tokens=[2], tested=1), 0.001)
    assert row.alpha == pytest.approx((FORGET * (FORGET * 0.5 + 7)) / (FORGET * (FORGET + 7) + 1))
    before = row.alpha
    row.observe([3], 0, None, 0.001)
    assert row.alpha == before and row.acceptance.rounds == 2  # a plain step is no evidence


def drafter(fixed: float, per_position: float, shape: PassShape = PassShape.CHAIN) -> DrafterPasses:
    """A drafter whose passes were measured at these costs (a module of its own: its record)."""
    module = nn.Linear(1, 1)
    for positions in (1, 16):
        plane_of(module, DRAFTING).observe((positions, 0), fixed + per_position * positions)
    return DrafterPasses(shape, module)


def widths_after(goodput: Goodput, rows: list[WidthPolicy], ticks: int = 1) -> list[int | None]:
    for _ in range(ticks):
        choice = goodput.choose(rows)
    return [offer.limit for offer in choice.offers]


def test_each_row_gets_its_own_width_from_its_own_acceptance() -> None:
    """On a forward whose positions dominate its cost, a row accepting 95 % keeps drafting while
    rows accepting 5 % decode plainly (width 0) in the same tick."""
    rows = [policy(alpha=0.95)] + [policy(alpha=0.05) for _ in range(7)]
    goodput = Goodput(lambda: measured(0.004, 0.0005))
    choice = goodput.choose(rows)
    assert choice.offers[0].limit == 7 and all(offer.limit == 0 for offer in choice.offers[1:])
    changes = choice.changes
    assert set(changes) == set(range(1, 8)) and all(c.cap == 0 and c.batch == 8 for c in changes.values())
    assert changes[1].expected_gain > 1.02 and all(goodput.held_at(row) == 0 for row in rows[1:])
    assert goodput.choose(rows).changes == {}  # nothing moved: no second event


def test_the_drafters_passes_are_priced_with_the_target() -> None:
    """The same rows, the same target: a drafter whose passes cost twice a target forward makes
    drafting lose (every row decodes plainly); prompt lookup's free drafting keeps the widths."""
    target = lambda: measured(0.01, 0.00001)  # noqa: E731 - the forward costs nearly nothing per position
    dear = drafter(0.02, 0.0001)
    assert widths_after(Goodput(target), [policy(alpha=0.7, passes=dear) for _ in range(4)]) == [0] * 4
    free = [policy(alpha=0.7) for _ in range(4)]
    assert widths_after(Goodput(target), free) == [7] * 4
    cheap = drafter(0.0001, 0.00001)
    assert all(w >= 3 for w in widths_after(Goodput(target), [policy(alpha=0.7, passes=cheap) for _ in range(4)]))


def test_a_drafter_measured_at_one_batch_size_prices_smaller_passes_for_their_rows() -> None:
    """Passes measured only over sixteen rows (one bucket, no slope yet) price a lone row's pass
    at a sixteenth: it drafts (and its own passes get measured), not held back by what sixteen
    rows' passes cost."""
    module = nn.Linear(1, 1)
    plane_of(module, DRAFTING).observe((16, 0), 0.016)
    lone = [policy(alpha=0.8, passes=DrafterPasses(PassShape.CHAIN, module))]
    assert widths_after(Goodput(lambda: measured(0.01, 0.0001)), lone)[0] >= 4


def test_a_sampled_rows_positions_are_priced_with_the_samplers_work() -> None:
    """Host work of 2 ms a sampled position (the sampler pipeline over k + 1 rows), nothing for
    an argmax one: of rows accepting alike, greedy ones draft wide, sampled ones plainly."""
    host = PlaneCost(keep=(1, 2, 3, 0))
    for rows, verifying, positions, sampled in ((8, 0, 8, 4), (8, 8, 40, 20), (4, 4, 20, 0), (8, 4, 24, 12),
                                                (2, 2, 6, 6), (4, 0, 4, 4), (6, 3, 18, 3)):  # fmt: skip
        host.observe((rows, verifying, positions, sampled), 0.0002 * rows + 0.002 * sampled)
    fixed, parts = host.plane()
    assert (fixed, *parts) == pytest.approx((0.0, 0.0002, 0.0, 0.0, 0.002), abs=1e-9)
    greedy, hot = [policy(alpha=0.6) for _ in range(4)], [policy(alpha=0.6) for _ in range(4)]
    for row in hot:
        row.sampled = True
    widths = widths_after(Goodput(lambda: measured(0.01, 0.00001), host=lambda: host), greedy + hot)
    assert all(w >= 3 for w in widths[:4]) and widths[4:] == [0] * 4


def test_the_rows_host_work_is_priced_by_its_positions() -> None:
    target = lambda: measured(0.01, 0.00001)  # noqa: E731
    host = PlaneCost(keep=(1, 2, 3, 0))
    for rows, verifying, positions in ((4, 0, 4), (4, 4, 32), (2, 1, 9), (4, 2, 12), (1, 1, 5)):
        host.observe((rows, verifying, positions, 0), 0.0005 * rows + 0.001 * positions)  # a tenth of the forward
    rows = [policy(alpha=0.5) for _ in range(4)]
    assert all(w < 7 for w in widths_after(Goodput(target, lambda: host), rows))


def test_the_whole_ticks_time_calibrates_what_the_fits_leave_out() -> None:
    """Ticks measured at three times what the parts' fits predict for the rows' drafting (a cost
    the fits miss) raise the drafting scale toward 3, and the rows then draft less; plain ticks
    measured as predicted leave the plain scale at 1."""
    rows = [policy(alpha=0.6) for _ in range(8)]
    goodput = Goodput(lambda: measured(0.02, 0.0005))
    before = widths_after(goodput, rows)
    for _ in range(120):
        goodput.choose(rows)
        plain, drafting = goodput._expected
        goodput.measured(plain + 3 * drafting / goodput.drafting_scale)
    assert goodput.drafting_scale == pytest.approx(3.0, rel=0.05) and goodput.plain_scale == 1.0
    assert sum(widths_after(goodput, rows)) < sum(before)


def test_one_plain_tick_measured_cheap_reprices_width_0_at_once() -> None:
    """Rows that draft every tick see a plain tick only at the plain survey. When that tick costs
    far less than its price (on the CPU a plain tick of 8 rows priced at 44 ms took 16), the
    first one halves the plain scale, not 5 % of the way, and the rows then draft less."""
    rows = [policy(alpha=0.7) for _ in range(8)]
    goodput = Goodput(lambda: measured(0.02, 0.0005))
    drafting = sum(widths_after(goodput, rows))
    assert drafting > 0
    while goodput.plain_ticks == 0:
        goodput.choose(rows)
        plain, drafted = goodput._expected
        goodput.measured(0.3 * plain if drafted == 0 else plain + drafted)
    assert goodput.ticks <= 3 * SURVEY_EVERY and goodput.plain_scale == pytest.approx(0.5)
    assert sum(widths_after(goodput, rows)) < drafting


def test_a_drafting_tick_forfeits_the_plain_ticks_queued_overlap() -> None:
    """Plain ticks measured at half their fits (their forwards queued a tick ahead) price width 0
    at half; a tick where any row drafts runs its forward unqueued, so its first drafting row adds
    the other half as well as its own costs, and every further drafting row only its own."""
    rows = [policy(alpha=0.7) for _ in range(8)]
    goodput = Goodput(lambda: measured(0.02, 0.0005))
    goodput.plain_scale = 0.5
    tick = Tick(goodput.prices(rows), rows, 0, plain=0.5)
    plain = [0] * 8
    assert tick.unqueuing == pytest.approx(tick.fixed)
    one, two = [1] + [0] * 7, [1, 1] + [0] * 6
    first, each = tick.costs[0]
    assert tick.seconds(one) - tick.seconds(plain) == pytest.approx(tick.unqueuing + first + each)
    assert tick.seconds(two) - tick.seconds(one) == pytest.approx(first + each)
    assert tick.added(plain, 0, 1) == pytest.approx(tick.unqueuing + first + each)
    assert tick.added(one, 1, 1) == pytest.approx(first + each)
    assert Tick(goodput.prices(rows), rows, 0, plain=1.5).unqueuing == 0.0  # plain ticks dearer: no credit


def test_held_rows_keep_their_width_and_lone_rows_are_chosen_too() -> None:
    held = [policy(alpha=0.05, load_free=False) for _ in range(4)]
    free = [policy(alpha=0.05) for _ in range(4)]
    offers = Goodput(lambda: measured(0.001, 0.001)).choose(held + free).offers
    assert all(offer.limit is None for offer in offers[:4]) and all(offer.limit == 0 for offer in offers[4:])
    lone = [policy(alpha=0.05)]
    assert widths_after(Goodput(lambda: measured(0.001, 0.001)), lone) == [0]
    unmeasured = [policy(alpha=0.0) for _ in range(8)]
    choice = Goodput(lambda: ForwardCost()).choose(unmeasured)
    assert choice.changes == {} and all(offer == OWN_WIDTH for offer in choice.offers)
    fresh = WidthPolicy(FixedWidth(7), n_max=7, load_free=True)  # no round yet: its own width once
    assert widths_after(Goodput(lambda: measured(0.001, 0.001)), [fresh]) == [None]


def test_the_widths_in_force_hold_until_others_beat_them_clearly() -> None:
    rows = [policy(alpha=0.3) for _ in range(16)]
    goodput = Goodput(lambda: measured(0.001, 0.001))
    first = widths_after(goodput, rows)
    assert first[0] < 7
    for row in rows:  # acceptance drifts a little: the best width may move by one, not enough to switch
        row.acceptance = Acceptance.prior(0.32)
        row.acceptance.rounds = 1
    assert goodput.choose(rows).changes == {} and widths_after(goodput, rows) == first
    goodput.cost = lambda: measured(0.05, 0.0)  # positions cost nothing now: every row's own width
    lifted = goodput.choose(rows).changes
    assert len(lifted) == 16 and all(c.cap is None and c.previous == first[0] for c in lifted.values())


def observe_probe(row: WidthPolicy, offer: WidthOffer, accepted: bool) -> None:
    width = row.decide(budget=100, limit=offer.limit, price=offer.price)
    tokens = [5, 6] if accepted else [5]
    row.observe(tokens, width, Verdict(accepted=int(accepted), tokens=tokens, tested=1), 0.001)


def test_a_row_held_at_width_0_probes_and_comes_back_when_its_acceptance_recovers() -> None:
    """Held at 0, a row verifies one draft after four ticks; after a probe that misses, one
    accepted could not lift the row's rate to a width that pays, so the next waits `PROBE_MAX`
    ticks; one that is accepted probes again the next tick, and once its acceptance has recovered
    the choice gives it its width back (with one event each way)."""
    row = policy(alpha=0.02)
    goodput = Goodput(lambda: measured(0.001, 0.001))

    def tick(accepted: bool) -> int | None:
        choice = goodput.choose([row])
        (offer,) = choice.offers
        if offer.limit:
            observe_probe(row, offer, accepted)
        else:
            row.decide(budget=100, limit=offer.limit, price=offer.price)
        return offer.limit, choice.changes

    first = [tick(accepted=False) for _ in range(24)]
    # after 4 ticks, then 16 held ticks later on the probes' grid (the survey tick 16 is no held tick)
    assert [limit for limit, _ in first] == [0, 0, 0, 1] + [0] * 19 + [1]
    assert [bool(changes) for _, changes in first] == [True] + [False] * 23  # held at 0: one event
    later = []
    while goodput.held_at(row) == 0 and len(later) < 40:
        later.append(tick(accepted=True))
    limits = [limit for limit, _ in later]
    assert goodput.held_at(row) != 0 and later[-1][1]  # given its width back, with an event
    assert limits.count(1) >= 2 and limits[-3:-1] == [1, 1]  # accepted probes follow each other


def test_a_row_its_costs_hold_at_width_0_probes_rarely() -> None:
    """Rows accepting 85 % that still decode plainly because the drafter costs more than it
    saves: a probe could not change that, so they probe every sixteenth tick only."""
    rows = [policy(alpha=0.85, passes=drafter(0.05, 0.0001)) for _ in range(4)]
    goodput = Goodput(lambda: measured(0.01, 0.00001))
    probes = 0
    for _ in range(47):
        offers = goodput.choose(rows).offers
        probes += offers[0].limit == 1
        for row, offer in zip(rows, offers, strict=True):
            if offer.limit:
                observe_probe(row, offer, accepted=True)
            else:
                row.decide(budget=100, limit=offer.limit, price=offer.price)
    assert all(goodput.held_at(row) == 0 for row in rows) and 1 <= probes <= 3


def test_held_rows_probe_together_and_queue_their_plain_steps_between_probes() -> None:
    """Rows held at 0 with different probe histories probe on the same ticks (a long gap waits
    for the shared grid), so on every other tick all of them are offered a plain next step that
    may be queued a tick ahead (a tick overlaps the host only when all its forwards were queued)."""
    rows = [policy(alpha=0.02) for _ in range(4)]
    goodput = Goodput(lambda: measured(0.001, 0.001))
    queued_ticks, probe_ticks = 0, []
    for tick in range(1, 4 * SURVEY_EVERY + 1):
        offers = goodput.choose(rows).offers
        if tick == 2:  # one row probes off the others' rhythm unless the grid holds it
            rows[0].acceptance.observe(0, 1)
        plains = {offer.then_plain for offer in offers if not offer.limit}
        assert len(plains) <= 1, tick  # the held rows agree
        queued_ticks += plains == {True}
        if any(offer.limit == 1 for offer in offers):  # (a survey at the rows' own widths is no probe)
            probe_ticks.append(tick)
        for row, offer in zip(rows, offers, strict=True):
            if offer.limit:
                observe_probe(row, offer, accepted=False)
            else:
                row.decide(budget=100, limit=offer.limit, price=offer.price)
    assert probe_ticks and all(tick % 4 == 0 for tick in probe_ticks)
    assert queued_ticks >= 2 * SURVEY_EVERY  # at least every other tick fully queued


def test_every_sixteenth_tick_surveys_none_then_half_the_widths_then_the_rows_own() -> None:
    """The first survey is a plain tick: while every row drafts, every row verifies too, and only
    a tick with none verifying tells the host's fit what a plain tick costs (first, so that a
    server's first minute already prices width 0 from a measured plain tick)."""
    rows = [policy(alpha=0.9) for _ in range(4)]
    goodput = Goodput(lambda: measured(0.05, 0.00001))
    limits = [widths_after(goodput, rows)[0] for _ in range(3 * SURVEY_EVERY)]
    assert [limits[k * SURVEY_EVERY - 1] for k in (1, 2, 3)] == [0, 3, 7]
    assert [limit for tick, limit in enumerate(limits, 1) if tick % SURVEY_EVERY] == [7] * (3 * SURVEY_EVERY - 3)
    narrow = [policy(alpha=0.05) for _ in range(4)]
    goodput = Goodput(lambda: measured(0.001, 0.001))
    limits = [widths_after(goodput, narrow)[0] for _ in range(4 * SURVEY_EVERY)]
    # held at 0 (width 1: its probes), surveyed at its own width once the exploration budget,
    # which that survey's expected loss exceeds, is full again
    assert set(limits) == {0, 1, 7} and limits.count(7) == 1 and limits.index(7) >= 3 * SURVEY_EVERY - 1


def test_a_block_loop_round_is_charged_its_priced_cost_not_the_wall_clock() -> None:
    """The controller of a block loop row sees what the tick's prices say its round cost, so its
    batch-mates' work in the same tick is not charged to its width."""
    controller = WidthController(declared=4, ceiling=8)
    row = WidthPolicy(ControlledWidth(controller), n_max=7, load_free=False)
    width = row.decide(budget=100, price=lambda width: 0.002 * (1 + width))
    row.observe([1, 2, 3], width, Verdict(accepted=2, tokens=[1, 2, 3], tested=3), seconds=5.0)
    assert controller.window.seconds == pytest.approx(0.002 * (1 + width))  # not the 5 s of the tick


def builder_of(
    kind: str, target: LoadedModel, drafter: LoadedModel, block_rule: str | None = None, governed: bool = True
) -> LoopBuilder:
    if kind == "mtp":
        rule = {"block_rule": block_rule} if block_rule else {}
        settings = Settings(drafter=DrafterSettings(kind="mtp", model=str(REPO_ROOT / "models" / "mtp"), **rule))
        return LoopBuilder(target, None, plan_from_settings(settings, environ={}))
    plan = LoopPlan(drafter_kind=kind, num_draft_tokens=4, governor_policy="break-even", governor_adaptive=governed)
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
        offers = [WidthOffer(draw.randint(0, generation.n_max)) for generation in live]
        for outcome in run_together([g.steps(offer) for g, offer in zip(live, offers, strict=True)]).outcomes:
            if isinstance(outcome, Exception):
                raise outcome
    assert [g.emitted for g in rows] == expected
    assert sum(len(g.stats.widths) >= 2 for g in rows) >= 2


@pytest.mark.parametrize("kind", ["draft-model", "prompt-lookup", "mtp"])
def test_rows_emit_target_only_tokens_at_every_width_the_policy_picks(embedded_target, embedded_drafter, kind) -> None:
    """The engine's choice sets every row's width before each tick (its own acceptance, the tick's
    prices swinging mid-stream, probes, surveys), width 0 included, and a row it holds at 0 queues
    its next plain step a tick ahead: greedy rows emit the target's greedy stream and seeded
    T = 0.7 sampler-match rows target-only's tokens, token for token."""
    plain = LoopBuilder(embedded_target, None, LoopPlan())
    # the governor left out: its pauses would take prompt lookup's rows out of the choice
    builder = builder_of(kind, embedded_target, embedded_drafter, block_rule="lossless", governed=False)
    encode = embedded_target.tokenizer.encode
    requests = [
        RowRequest(encode(prompt), sampling, max_tokens=48, seed=40 + i, ignore_eos=True)
        for i, (prompt, sampling) in enumerate(itertools.product(PROMPTS, [GREEDY, HOT]))
    ]
    expected = [generation.emitted for generation in run_rows([plain.build(r) for r in requests])]
    rows = [builder.build(request) for request in requests]
    assert {row.speculation.rule for row in rows} == {Rule.GREEDY_ARGMAX, Rule.SAMPLER_MATCH}
    assert all(row.widths.load_free for row in rows)
    for generation in rows:
        generation.prefill()
    goodput = Goodput(lambda: None)
    goodput.cost = swinging_costs(goodput)
    queued = 0  # ticks after which a held row's next plain step was queued a tick ahead
    while live := [g for g in rows if not g.finished]:
        offers = goodput.choose([g.widths for g in live]).offers
        for outcome in run_together([g.steps(offer) for g, offer in zip(live, offers, strict=True)]).outcomes:
            if isinstance(outcome, Exception):
                raise outcome
        queued += any(g.loop._ahead is not None for g in live)
    assert [g.emitted for g in rows] == expected
    assert queued  # held rows' plain steps were pipelined as target-only's are, a block drafter's too
    assert all(g.stats.plain_steps and g.stats.widths for g in rows)  # width 0 and wider, every row
    assert len(set().union(*(g.stats.widths for g in rows))) >= 2  # and more than one width drafted


@pytest.mark.parametrize("sampling", [GREEDY, HOT], ids=["T0", "seeded-T0.7"])
def test_an_mtp_rows_pipelined_plain_steps_owe_its_drafter_what_unqueued_ones_do(embedded_target, sampling) -> None:
    """Two MTP rows of one prompt held at width 0 for thirteen ticks, one offered its plain steps
    queued a tick ahead (`then_plain`) and one not, then drafting again: each plain step owes the
    head the target's hidden row of its position, queued or not, so from the release on the two
    propose the same drafts and keep the same verdicts, round for round. At T = 0.7 the shipped
    MTP profile's rule is the biased argmax-against-argmax, whose every position is the argmax,
    queued or not: both rows emit the greedy stream (a queued step once drew from the sampler)."""
    builder = builder_of("mtp", embedded_target, embedded_target)
    prompt = embedded_target.tokenizer.encode(PROMPTS[0])
    request = RowRequest(prompt, sampling, max_tokens=40, seed=7, ignore_eos=True)
    queued, unqueued = builder.build(request), builder.build(request)
    rounds: dict[int, list[tuple]] = {id(queued): [], id(unqueued): []}
    for generation in (queued, unqueued):
        generation.prefill()
    for tick in range(30):
        held = tick < 12
        # the queued row's last queued step runs at tick 12 whatever the offer: the other waits too
        offers = {id(queued): WidthOffer(0, then_plain=True), id(unqueued): WidthOffer(0)} if held else {}
        offers |= {id(unqueued): WidthOffer(0)} if tick == 12 else {}
        live = [g for g in (queued, unqueued) if not g.finished]
        run_together([g.steps(offers.get(id(g), OWN_WIDTH)) for g in live])
        for g in live:
            seen = g.stats.acceptance
            rounds[id(g)].append((len(g.emitted), seen.rounds, seen.proposed, seen.accepted))
    assert queued.loop._ahead is None or queued.finished
    assert rounds[id(queued)][:13] == rounds[id(unqueued)][:13]  # plain, token for token
    assert rounds[id(queued)][13:] == rounds[id(unqueued)][13:]
    assert rounds[id(queued)][-1][1] > 0  # drafted and verified after the release
    assert queued.emitted == unqueued.emitted
    if sampling is HOT:
        assert queued.speculation.rule is Rule.ARGMAX_AGAINST_ARGMAX
        plain = LoopBuilder(embedded_target, None, LoopPlan())
        greedy = replace(request, sampling=GREEDY)
        assert queued.emitted == run_rows([plain.build(greedy)])[0].emitted


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


def test_a_round_the_load_narrowed_is_no_evidence_for_the_governor() -> None:
    governor = make_governor(7, policy="break-even")
    row = WidthPolicy(GovernedWidth(governor, lambda n: []), n_max=7, load_free=True)
    for _ in range(4):  # narrowed rounds of one draft: below the floor, yet no pause
        assert row.decide(100, limit=1) == 1
        row.observe([5, 6], 1, Verdict(accepted=1, tokens=[5, 6], tested=1), 0.001)
    assert governor.observed_rounds == 0 and not governor.paused
    for _ in range(2):  # full rounds that miss: the governor's own evidence, and its pause
        assert row.decide(100) == 7
        row.observe([5], 7, Verdict(accepted=0, tokens=[5], tested=1), 0.001)
    assert governor.observed_rounds == 2 and governor.paused and row.wanted() == 0
