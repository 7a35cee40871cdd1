"""Prompt lookup: the n-gram index on hand-built sequences, and every governor clause."""

from __future__ import annotations

import pytest

from app.decoding.builder import LoopBuilder, RowRequest
from app.decoding.plan import LoopPlan
from app.drafters.governor import BreakEvenGovernor, GatedGovernor, GradedGovernor, make_governor
from app.drafters.ngram import NgramIndex
from app.sampling import SamplingParams


def index_of(tokens: list[int]) -> NgramIndex:
    index = NgramIndex()
    index.extend(tokens)
    return index


def test_lookup_proposes_what_followed_the_latest_earlier_occurrence() -> None:
    assert index_of([1, 2, 3, 9, 1, 2, 3]).lookup(7) == [9, 1, 2, 3]
    assert index_of([1, 2, 3, 4, 5, 1, 2, 3]).lookup(2) == [4, 5]


def test_the_suffix_is_not_its_own_match() -> None:
    # Tempting wrong answer: [] found at the end itself, or a proposal of nothing new.
    assert index_of([7, 8, 9]).lookup(3) == []


def test_longest_ngram_wins_and_most_recent_occurrence_wins() -> None:
    # (5, 6) occurs twice: followed by 1 and later by 2; the trigram (4, 5, 6) only before 1.
    assert index_of([4, 5, 6, 1, 0, 5, 6, 2, 0, 4, 5, 6]).lookup(1) == [1]
    assert index_of([9, 5, 6, 1, 0, 5, 6, 2, 0, 4, 5, 6]).lookup(1) == [2]


def test_bigram_fallback_and_incremental_growth() -> None:
    index = index_of([1, 2, 8])
    index.extend([3, 1, 2])
    assert index.lookup(4) == [8, 3, 1, 2]
    index.extend([8, 3])
    assert index.lookup(2) == [1, 2]


# --- the server's break-even governor (floor 4 tokens per verify) -------------------------


def server(**kw: object) -> BreakEvenGovernor:
    return BreakEvenGovernor(max_draft=7, **kw)


def feed(governor, accepted: list[int]) -> None:
    for a in accepted:
        governor.observe_round(7, a)


def test_pauses_only_after_two_low_drafted_rounds() -> None:
    governor = server()
    feed(governor, [0])
    assert not governor.paused
    feed(governor, [0])
    assert governor.paused and governor.budget() == 0


def test_a_latest_round_at_the_floor_repays_startup_debt() -> None:
    governor = server()
    feed(governor, [3, 3, 3])  # tokens per verify 4 each round; the EMA is still below 3 accepted
    assert governor.ema + 1 < governor.floor
    assert not governor.paused


def test_an_isolated_zero_round_after_a_healthy_ema_gets_one_round_of_grace() -> None:
    governor = server()
    feed(governor, [6, 6, 6, 0])
    assert not governor.paused  # graced
    feed(governor, [0])
    assert governor.paused  # grace never covers the second consecutive low round


def test_grace_is_given_again_after_a_good_round() -> None:
    governor = server()
    feed(governor, [6, 6, 6, 0, 6, 6, 0])
    assert not governor.paused


def test_partial_low_yield_gets_no_grace() -> None:
    graced, partial = server(), server()
    feed(graced, [4, 4, 4, 4, 4, 4, 4, 4])
    feed(partial, [4, 4, 4, 4, 4, 4, 4, 4])
    graced.ema = partial.ema = 4.0  # the accepted-token EMA exactly at the floor
    feed(graced, [0])
    feed(partial, [1])
    assert not graced.paused
    assert partial.paused


def test_grace_needs_the_accepted_token_ema_itself_at_the_floor() -> None:
    """The contract's wording: the EMA of accepted tokens >= floor, not tokens per verify (+ 1)."""
    governor = BreakEvenGovernor(max_draft=8, floor=7)
    feed(governor, [7, 7, 7])  # every round at the floor; accepted-token EMA 6.125
    assert governor.ema + 1 >= governor.floor > governor.ema
    feed(governor, [0])
    assert governor.paused  # tokens per verify would have graced it; the accepted EMA does not


def test_pausing_needs_the_ema_below_the_floor() -> None:
    governor = server()
    feed(governor, [6, 6, 6, 6, 1])  # low latest round, but EMA tokens per verify still >= 4
    assert not governor.paused


def shadow_feed(governor, predicted: list[int], actual: list[int]) -> None:
    """Emit `actual` one token at a time while the lookup keeps predicting `predicted`."""
    for i, token in enumerate(actual):
        governor.observe_emitted([token], lambda n, i=i: predicted[i + 1 : i + 1 + n])


def test_seven_matching_shadow_tokens_resume_verification() -> None:
    governor = server()
    feed(governor, [0, 0])
    assert governor.paused
    tokens = list(range(100, 120))
    shadow_feed(governor, tokens, tokens[:7])
    assert governor.paused  # the first emitted token only arms the shadow
    shadow_feed(governor, tokens[7:], tokens[7:9])
    assert not governor.paused
    assert (governor.pauses, governor.resumes) == (1, 1)


def test_a_shadow_mismatch_restarts_the_count() -> None:
    governor = server()
    feed(governor, [0, 0])
    predicted = list(range(100, 120))
    actual = [*predicted[:5], 999, *predicted[6:12]]
    shadow_feed(governor, predicted, actual)
    assert governor.paused


def test_adaptive_false_ignores_the_floor() -> None:
    governor = server(adaptive=False)
    feed(governor, [0] * 10)
    assert not governor.paused and governor.budget() == 7


def test_active_rows_propose_full_blocks() -> None:
    governor = server()
    assert governor.budget() == 7
    feed(governor, [1, 7])
    assert governor.budget() == 7


# --- the CLI governors ---------------------------------------------------------------------


def test_gated_narrow_blocks_until_the_ema_reaches_one_and_a_half() -> None:
    governor = GatedGovernor(max_draft=7)
    assert governor.budget() == 2
    feed(governor, [2])
    assert governor.budget() == 2
    feed(governor, [2])
    assert governor.budget() == 7


def test_gated_pauses_on_a_probation_miss_and_resumes_on_two_shadow_tokens() -> None:
    governor = GatedGovernor(max_draft=7)
    feed(governor, [0])
    assert governor.paused
    tokens = [5, 6, 7, 8]
    shadow_feed(governor, tokens, tokens[:3])
    assert not governor.paused


def test_gated_pauses_after_three_wide_misses() -> None:
    governor = GatedGovernor(max_draft=7)
    feed(governor, [2, 2, 7, 7])
    feed(governor, [0, 0])
    assert not governor.paused
    feed(governor, [0])
    assert governor.paused


def test_graded_budget_and_doubling_pauses() -> None:
    governor = GradedGovernor(max_draft=7)
    assert governor.budget() == 2
    feed(governor, [4])
    assert governor.budget() == 6  # round(2 * 2.0) + 2
    feed(governor, [0, 0, 0])
    assert governor.paused
    for _ in range(4):
        governor.observe_emitted([1], lambda n: [])
    assert not governor.paused
    feed(governor, [0, 0, 0])
    for _ in range(4):
        governor.observe_emitted([1], lambda n: [])
    assert governor.paused  # the second consecutive pause lasts 8 rounds


def test_make_governor_picks_by_floor_and_policy() -> None:
    assert isinstance(make_governor(7, policy="break-even", floor=3.0), BreakEvenGovernor)
    assert isinstance(make_governor(7, policy="graded"), GradedGovernor)
    assert isinstance(make_governor(7, policy="gated"), GatedGovernor)
    with pytest.raises(ValueError, match="unknown governor policy"):
        make_governor(7, policy="eager")


# --- evidence only from verified rounds ------------------------------------------------------


@pytest.mark.parametrize("n_min", [0, 8])
def test_retracted_proposals_add_no_evidence(embedded_target, n_min: int) -> None:
    spec = LoopPlan(drafter_kind="prompt-lookup", num_draft_tokens=7, governor_policy="break-even")
    text = "values = [1, 2, 3]\nvalues = [1, 2, 3]\nvalues = [1, 2, 3]\nvalues = [1, 2, 3]\n"
    request = RowRequest(
        prompt=embedded_target.tokenizer.encode(text),
        sampling=SamplingParams(temperature=0.0),
        max_tokens=40,
        n_min=n_min,
    )
    generation = LoopBuilder(embedded_target, None, spec).build(request)
    generation.prefill()
    while not generation.finished:
        generation.step()
    governor = generation.widths.source.governor
    stats = generation.stats.acceptance
    assert governor.observed_rounds == stats.rounds  # one observation per verified round, none otherwise
    if n_min > 7:
        assert stats.rounds == 0
    else:
        assert stats.rounds > 0
