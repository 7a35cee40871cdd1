"""The width policy: how many proposals each row's next round carries, decided once per round.

A row's width is decided here and nowhere else, from (in this order):

- the row's cap, `row_n_max`: the plan's widest round (the classic kinds' num_draft_tokens, a
  block loop's ceiling) lowered, never raised, by the request's `speculative.n_max`; /props,
  /slots, `generation_settings`, `timings` and the events all report this one number;
- the row's source, what its drafter kind wants next: a fixed width (draft model), prompt
  lookup's governor (app/drafters/governor.py: its budget, its pauses and shadow lookups, the
  contract's rules), or a block loop's adaptive width controller (app/decoding/adaptive.py);
- the tick's load (`Goodput`): with more than one row decoding, a tick's target forward costs
  what its positions cost, so a wide round of one row is paid by every row of the tick; the
  goodput choice caps the widths where that raises the batch's expected tokens per second;
- the tokens the row has left (a round never drafts past its budget).

The request's `speculative.n_min` retracts shorter proposals (the loop asks `retracts`).

Only rows whose output cannot depend on their width are narrowed by the load: argmax rules, where
every width emits the target's argmax stream. A sampled row draws keys per drafted position, so a
width chosen by its batch-mates would make its tokens depend on them (the brief's exactness rule);
such rows keep their source's width.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from app.acceptance import Verdict
from app.decoding.adaptive import Widths
from app.decoding.outcome import Note
from app.drafters.governor import Governor, Lookup
from app.execution.cost import ForwardCost

ACCEPTANCE_PRIOR = 0.5  # per-position acceptance assumed before a row's first verified round
ACCEPTANCE_EMA = 0.3  # weight of a round's observed acceptance
MAX_ACCEPTANCE = 0.99  # the expected length stays finite (alpha = 1 accepts every draft)
EXPLORE_EVERY = 8  # ticks at cap 0 between two that verify one draft per row
ADOPT_GAIN = 1.02  # a cap must beat no cap (and the cap in force) by 2 % of expected tokens/s


def row_n_max(plan_n_max: int, requested: int | None) -> int:
    """The most proposals a row's round may carry: the plan's, lowered by the request's n_max."""
    return plan_n_max if requested is None else max(0, min(plan_n_max, requested))


def expected_tokens(alpha: float, width: int) -> float:
    """Tokens a round of `width` proposals emits on average when each draft is accepted with
    probability `alpha` given the ones before it (Leviathan et al. 2023, eq. 1): the accepted
    prefix plus the recovered or bonus token, (1 - alpha^(width + 1)) / (1 - alpha)."""
    alpha = min(alpha, MAX_ACCEPTANCE)
    return (1 - alpha ** (width + 1)) / (1 - alpha)


class GovernedWidth:
    """Prompt lookup: the governor's budget (0 while paused); every step feeds it, a verified
    round as evidence and any other step's tokens to its shadow lookups."""

    def __init__(self, governor: Governor, lookup: Lookup) -> None:
        self.governor = governor
        self.lookup = lookup

    def proposals(self) -> int:
        return self.governor.budget()

    def observe(self, tokens: list[int], proposed: int, verdict: Verdict | None, seconds: float) -> None:
        if verdict is not None and proposed:
            self.governor.observe_round(proposed, verdict.accepted)
        else:
            self.governor.observe_emitted(tokens, self.lookup)

    def notes(self) -> tuple[Note, ...]:
        """The governor's pauses and resumes since the last call, as the row's notes."""
        floor = getattr(self.governor, "floor", None)
        notes = tuple(Note(event, {"ema": ema, "floor": floor}) for event, ema in self.governor.changes)
        self.governor.changes.clear()
        return notes


@dataclass
class WidthPolicy:
    """One row's width: its source's, within the row's cap and the tick's load, decided once per
    round by `decide` (the round's outcome carries it to the row's stats)."""

    source: Widths  # FixedWidth, ControlledWidth (app/decoding/adaptive.py) or GovernedWidth
    n_max: int  # row_n_max: the row's cap
    n_min: int = 0  # speculative.n_min: proposals shorter than this are retracted unverified
    load_free: bool = False  # the row's tokens do not depend on its width: the load may narrow it
    limit: int | None = None  # this tick's cap from the goodput choice (None: none)
    alpha: float = ACCEPTANCE_PRIOR  # EMA of the per-position acceptance of the row's rounds
    _narrowed: bool = False  # the latest round ran below its source's width because of the load

    def wanted(self) -> int:
        """The width the source asks for within the row's cap (the load not weighed); reads only."""
        return min(self.source.proposals(), self.n_max)

    def decide(self, budget: int) -> int:
        """The round's width, given the `budget` of tokens the row may still decide (at least one
        of them is the round's last token). The tick's cap is used by this round only."""
        wanted = self.wanted()
        width = max(0, min(wanted, budget - 1))
        if self.limit is not None and self.limit < width:
            width, self._narrowed = self.limit, True
        else:
            self._narrowed = False
        self.limit = None
        return width

    def retracts(self, proposed: int) -> bool:
        return proposed < max(1, self.n_min)

    def observe(self, tokens: list[int], proposed: int, verdict: Verdict | None, seconds: float) -> tuple[Note, ...]:
        """A step decided `tokens` (`verdict`: its `proposed` drafts were verified); the notes it
        leaves to log."""
        if verdict is not None and proposed:
            observed = verdict.accepted / max(1, verdict.tested)
            self.alpha += ACCEPTANCE_EMA * (observed - self.alpha)
        # A round the load narrowed is no evidence about the width its source asked for: charged
        # to a block loop's controller it would measure the load, and a governor would compare a
        # narrow round's yield with a floor set for full blocks (it adds no verify evidence, as
        # the contract has gated-out rows add none).
        if not self._narrowed:
            self.source.observe(tokens, proposed, verdict, seconds)
        return self.source.notes()


@dataclass(frozen=True)
class WidthChange:
    """The goodput choice moved: the cap its tick chose (None: none) for `batch` decoding rows,
    and its expected tokens per second over no cap's."""

    batch: int
    cap: int | None
    previous: int | None
    expected_gain: float


@dataclass
class Goodput:
    """Per tick, the cap on the load-free rows' widths that maximises the batch's expected tokens
    per second: each row's expected round length at its width against the measured cost of the
    tick's target forward at the positions those widths make (`ForwardCost`)."""

    cost: Callable[[], ForwardCost | None]  # the target's measured forward costs
    cap: int | None = None  # the latest tick's
    ticks: int = 0

    def choose(self, rows: Sequence[WidthPolicy], positions: int) -> WidthChange | None:
        """Set this tick's cap on `rows` (the tick's decoding rows' policies; `positions`: the
        target positions of its other rows); the change, if the cap moved."""
        cap, gain = self._best(rows, positions)
        self.ticks += 1
        # At cap 0 no draft is verified, so no row's acceptance could ever show the cap wrong:
        # every EXPLORE_EVERY-th such tick verifies one draft a row.
        applied = 1 if cap == 0 and self.ticks % EXPLORE_EVERY == 0 else cap
        for row in rows:
            row.limit = applied if row.load_free else None
        if cap == self.cap:
            return None
        change = WidthChange(batch=len(rows), cap=cap, previous=self.cap, expected_gain=round(gain, 4))
        self.cap = cap
        return change

    def _best(self, rows: Sequence[WidthPolicy], positions: int) -> tuple[int | None, float]:
        """(cap, expected gain over no cap); (None, 1.0) where no cap pays or nothing is measured."""
        cost = self.cost()
        line = cost.line() if cost is not None else None
        free = [row.wanted() for row in rows if row.load_free]
        widest = max(free, default=0)
        if line is None or len(rows) < 2 or widest == 0:
            return None, 1.0
        fixed_s, position_s = line
        # the other rows' part of the tick, whatever the cap: their positions and expected tokens
        held = [(row.wanted(), row.alpha) for row in rows if not row.load_free]
        base_positions = positions + sum(1 + w for w, _ in held)
        base_tokens = sum(expected_tokens(alpha, w) for w, alpha in held)
        # expected[i][k]: load-free row i's expected tokens at width k (each row's table built once)
        alphas = [row.alpha for row in rows if row.load_free]
        expected = [[expected_tokens(alpha, k) for k in range(w + 1)] for w, alpha in zip(free, alphas, strict=True)]

        def rate(cap: int) -> float:
            widths = [min(w, cap) for w in free]
            tokens = base_tokens + sum(table[k] for table, k in zip(expected, widths, strict=True))
            seconds = fixed_s + position_s * (base_positions + sum(1 + k for k in widths))
            return tokens / seconds if seconds > 0 else 0.0

        rates = [rate(cap) for cap in range(widest + 1)]
        best, uncapped = max(range(widest + 1), key=rates.__getitem__), rates[widest]
        if rates[best] <= ADOPT_GAIN * uncapped:  # no cap pays clearly
            return None, 1.0
        # a cap in force that still pays stays unless another beats it too: no flapping between neighbours
        held = self.cap if self.cap is not None and self.cap < widest else None
        if held is not None and rates[held] > ADOPT_GAIN * uncapped and rates[best] <= ADOPT_GAIN * rates[held]:
            best = held
        return best, rates[best] / uncapped if uncapped else 1.0
