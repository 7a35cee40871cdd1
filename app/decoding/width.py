"""The width policy: how many proposals each row's next round carries, decided once per round.

A row's width is decided here and nowhere else (`WidthPolicy.decide`), from (in this order):

- the row's cap, `row_n_max`: the plan's widest round (the classic kinds' num_draft_tokens, a
  block loop's ceiling) lowered, never raised, by the request's `speculative.n_max`; /props,
  /slots, `generation_settings`, `timings` and the events all report this one number;
- the row's source, what its drafter kind wants next: a fixed width (draft model), prompt
  lookup's governor (app/drafters/governor.py: its budget, its pauses and shadow lookups, the
  contract's rules), or a block loop's adaptive width controller (app/decoding/adaptive.py);
- the tick's offer (`WidthOffer`): the limit the tick's choice (app/decoding/goodput.py
  `Goodput`) sets on a load-free row's round this tick (0 included: the row decodes plainly this
  tick), and the price of the round at any width, handed to the row's step with its tick; the
  choice reads the rows' policies (their acceptance, their wanted widths) and changes none;
- the tokens the row has left (a round never drafts past its budget).

The request's `speculative.n_min` retracts shorter proposals (the loop asks `retracts`).

Load-free rows are those whose tokens are the same at every width, so a width their batch-mates
made cheap or dear changes nothing they emit: the argmax rules (every width emits the target's
argmax stream) and sampler-match (every emitted token is the target stream's draw at its position,
whatever was drafted, app/sampling/streams.py; at T > 0 too). The stochastic rule's tokens depend
on the drafts (its accept test and residual read q), so its rows keep their source's width, as
does any row whose plan turns the choice off (`adaptive.under_load = false`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from app.acceptance import Verdict
from app.decoding.adaptive import Widths
from app.decoding.outcome import Note
from app.drafters.governor import Governor, Lookup
from app.drafters.passes import NO_PASSES, DrafterPasses

ACCEPTANCE_PRIOR = 0.5  # per-position acceptance assumed before a row's first verified round
PRIOR_WEIGHT = 1.0  # tested positions the prior counts as
FORGET = 0.85  # per verified round, the weight the counts before it keep (about twenty positions remembered)
MAX_ACCEPTANCE = 0.99  # the expected length stays finite (alpha = 1 accepts every draft)


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
class Acceptance:
    """A row's per-position acceptance: accepted over tested positions of its verified rounds,
    each older round weighing `FORGET` times less, the prior counting `PRIOR_WEIGHT` positions."""

    accepted: float = ACCEPTANCE_PRIOR * PRIOR_WEIGHT
    tested: float = PRIOR_WEIGHT
    rounds: int = 0  # verified rounds observed
    latest: int = 0  # drafts accepted in the latest verified round (what a probe round showed)

    @classmethod
    def prior(cls, rate: float) -> Acceptance:
        return cls(rate * PRIOR_WEIGHT, PRIOR_WEIGHT)

    @property
    def rate(self) -> float:
        return self.accepted / self.tested

    def hopeful(self) -> float:
        """The rate one more verified round with its one draft accepted would leave: what a probe
        can show at best. Little for a row whose rate rests on many positions (its rate is
        known), much for one whose recent rounds are few."""
        return min(MAX_ACCEPTANCE, (FORGET * self.accepted + 1) / (FORGET * self.tested + 1))

    def observe(self, accepted: int, tested: int) -> None:
        self.accepted = FORGET * self.accepted + accepted
        self.tested = FORGET * self.tested + tested
        self.rounds += 1
        self.latest = accepted


@dataclass(frozen=True)
class WidthOffer:
    """The tick's choice for one row's round, handed to `WidthPolicy.decide` with the row's step:
    `limit` the most proposals the round may carry (None: its source's width), `price` the
    round's seconds at a width, its share of the tick (None: not priced, the wall clock counts)."""

    limit: int | None = None
    price: Callable[[int], float] | None = None
    # The choice holds the row at 0 this tick and expects to next tick too (no probe, no survey
    # due): a plain round may queue its next step's forward a tick ahead (app/decoding/loop.py).
    then_plain: bool = False


OWN_WIDTH = WidthOffer()  # no choice made: the row's own width, unpriced (a lone row, a tick not priced)


@dataclass(eq=False)
class WidthPolicy:
    """One row's width: its source's, within the row's cap and the tick's offer, decided once per
    round by `decide` (the round's outcome carries it to the row's stats). Only the row's own
    steps change it; the tick's choice reads it (`alpha`, `wanted`) and answers with an offer."""

    source: Widths  # FixedWidth, ControlledWidth (app/decoding/adaptive.py) or GovernedWidth
    n_max: int  # row_n_max: the row's cap
    n_min: int = 0  # speculative.n_min: proposals shorter than this are retracted unverified
    load_free: bool = False  # the row's tokens do not depend on its width: the tick's choice may set it
    passes: DrafterPasses = NO_PASSES  # what its drafting costs (app/drafters/passes.py)
    sampled: bool = False  # its sampler draws (T > 0, not an argmax rule): its positions cost the sampler's work
    acceptance: Acceptance = field(default_factory=Acceptance)
    current: int | None = None  # the row's latest step's width (0: it decoded plainly; None: none yet), for /slots
    _narrowed: bool = False  # the latest round ran below its source's width because of the load
    _seconds: float | None = None  # the priced seconds of the round in flight (None: not priced)

    @property
    def alpha(self) -> float:
        return self.acceptance.rate

    def wanted(self) -> int:
        """The width the source asks for within the row's cap (the load not weighed); reads only."""
        return min(self.source.proposals(), self.n_max)

    def decide(self, budget: int, limit: int | None = None, price: Callable[[int], float] | None = None) -> int:
        """The round's width, given the `budget` of tokens the row may still decide (at least one
        of them is the round's last token), within the tick's `limit` (None: none), the round
        priced by the tick's `price` (None: by the wall clock); both are this round's alone."""
        width = max(0, min(self.wanted(), budget - 1))
        self._narrowed = limit is not None and limit < width
        if self._narrowed:
            width = limit
        self._seconds = price(width) if price is not None else None
        self.current = width
        return width

    def retracts(self, proposed: int) -> bool:
        return proposed < max(1, self.n_min)

    def observe(self, tokens: list[int], proposed: int, verdict: Verdict | None, seconds: float) -> tuple[Note, ...]:
        """A step decided `tokens` (`verdict`: its `proposed` drafts were verified) in `seconds` of
        wall time; the notes it leaves to log. The round is charged what the tick's prices say it
        cost where they priced it: a shared tick's wall time is every row's."""
        if verdict is not None and proposed:
            self.acceptance.observe(verdict.accepted, max(1, verdict.tested))
        # A round the load narrowed is no evidence about the width its source asked for: charged
        # to a block loop's controller it would measure the load, and a governor would compare a
        # narrow round's yield with a floor set for full blocks (it adds no verify evidence, as
        # the contract has gated-out rows add none).
        if not self._narrowed:
            self.source.observe(tokens, proposed, verdict, self._seconds if self._seconds is not None else seconds)
        return self.source.notes()
