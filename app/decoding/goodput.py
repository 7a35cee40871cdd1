"""The tick's choice of every load-free row's width (`Goodput`), before each tick.

Every load-free row's width (0 included: the row decodes plainly this tick; which rows are
load-free: app/decoding/width.py) is chosen to maximise the tick's expected tokens per second:
each row's expected round length at its width, from its own acceptance, against what the whole
tick costs at those widths, measured (app/execution/cost.py): the target's forward at the
positions the widths make, the drafter's passes (a draft model's or an MTP head's chain, one pass
per draft position over the rows drafting that far; a DFlash-family block forward; prompt
lookup's nothing) and the rows' host work (judging, sampling, settling) at their positions, each
fitted from the measured ticks, and the whole tick's measured time scaling the part with no row
drafting and the part drafting adds (`Goodput.measured`), so what the fits leave out is weighed
too. A tick where any row drafts also forfeits what a plain tick saves by having its forward
queued a tick ahead (`Tick.unqueuing`: the fits' plain tick less its calibrated price). The
choice reads the rows' width policies and returns a `WidthOffer` per row (a limit and a price),
which the scheduler hands to the row's step; what it keeps of a row across ticks (the width it
holds the row at, its probes) is its own (`Hold`).

The choice leaves the rows' own widths only for an expected gain of 5 % (`LEAVE_GAIN`: a smaller
one is within the model's error) and moves widths in force only for 2 % more (`ADOPT_GAIN`).

A row the choice holds at width 0 still learns: a probe round of one verified draft comes after
`PROBE_FIRST` ticks, again at once after a probe that was accepted (its acceptance is recovering),
and after twice the gap (up to `PROBE_MAX`) after one that was not. A row held at 0 that even the
acceptance an accepted probe would leave it (`Acceptance.hopeful`) would not get drafting again
(the tick's costs hold it there, or its rate rests on too many positions for one probe to move
it) probes only every `PROBE_MAX` ticks: probes then cost more than they can tell. A probe
due after a gap of `PROBE_FIRST` or more waits for the next tick that is a multiple of
`PROBE_FIRST`, so the held rows probe together. Every `SURVEY_EVERY` ticks a survey runs the
load-free rows at width 0, the next at half their chosen widths and the one after at their own,
so every record keeps seeing more than one width (a fit needs two) and the widths not chosen
lately are timed afresh (a cost measured while another process held the cores must not keep them
out for good). The plain survey matters most, and comes first: while every row drafts, every row
also verifies, so the host's fit cannot tell a row's own work from its verifying and charges a
plain tick for both (on the CPU, 8 rows of the embedded pair: a plain tick priced at 32 ms that
took 15 to 21, so drafting at 0.84x target-only's throughput looked like a gain).

Probes and surveys are paid from an exploration budget (`ExplorationBudget`): `EXPLORATION_SHARE`
of every tick's seconds, kept up to `EXPLORATION_BANK` ticks' worth. A tick explores where the
budget covers what its probes or survey lose against the choice (the seconds past what their
expected tokens take at the choice's rate, and the next tick's forfeited queue where the choice
drafts nowhere), or where the budget is full; a survey that has to wait for it goes before any
probe the budget pays for, and a promising probe (an accepted one would get its row drafting
again) runs when due whatever the budget, charged all the same. So where drafting cannot pay (on
a GPU, the embedded pair's draft model costs about what its target does), probing and surveying
cost about that share of the time, whatever the rows and however dear a probe tick is. The next
tick's exploration is decided a tick ahead, so that on every other tick each held row's plain
step is queued a tick ahead (`WidthOffer.then_plain`): a tick's forwards overlap the host only
when all of them were queued. Probes and surveys log nothing: the width in force has not moved.
"""

from __future__ import annotations

import weakref
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import partial

from app.decoding.width import MAX_ACCEPTANCE, OWN_WIDTH, Acceptance, WidthOffer, WidthPolicy, expected_tokens
from app.drafters.passes import PassShape
from app.execution.cost import DRAFTING, ForwardCost, PlaneCost, plane_of

ADOPT_GAIN = 1.02  # new widths must beat the widths in force by 2 % of expected tokens/s
LEAVE_GAIN = 1.05  # and the rows' own widths by 5 %: a model's small gain is within its error
PROBE_FIRST = 4  # ticks at width 0 before a row's first probe round
PROBE_MAX = 16  # the longest gap between two probe rounds of a row
SURVEY_EVERY = 16  # ticks between two that run the load-free rows at half, then at their own widths, then at 0
SURVEYS = 3  # the survey widths in turn: none, half the chosen, the rows' own
EXPLORATION_SHARE = 0.04  # probes and surveys may cost at most this share of the ticks' seconds
EXPLORATION_BANK = 64  # ticks of that share the budget keeps (and starts with)
SURVEY, PROBES = "survey", "probes"  # what a tick explores (`Goodput._upcoming`)


@dataclass(frozen=True)
class WidthChange:
    """The tick's choice moved one row's width: `cap` the width it holds the row at (None: the
    row's own), `previous` the one before, for `batch` decoding rows, expecting `expected_gain`
    times the tick's tokens per second at every row's own width, at `prices` (`TickPrices.summary`)."""

    batch: int
    cap: int | None
    previous: int | None
    expected_gain: float
    prices: dict[str, list[float]] = field(default_factory=dict)


@dataclass(frozen=True)
class WidthChoice:
    """The tick's choice: each row's offer, in the rows' order, and the rows whose held width
    moved, by index (for the log)."""

    offers: tuple[WidthOffer, ...]
    changes: dict[int, WidthChange] = field(default_factory=dict)


@dataclass
class Hold:
    """What the tick's choice keeps of one row across ticks: the width it holds the row at and
    the row's probe rounds while held at 0 (module docstring)."""

    held_at: int | None = None  # the width the choice holds the row at (None: its source's)
    probe_gap: int = PROBE_FIRST  # ticks between two probe rounds while the row is held at width 0
    since_probe: int = 0  # ticks at width 0 since the last probe round (or since it was held there)
    probe_at: int | None = None  # the row's verified rounds when its last probe was offered (None: no probe out)

    def probe(self, tick: int, promising: bool, acceptance: Acceptance, exploring: bool) -> bool:
        """Whether `tick` is a probe round for the row held at width 0 (one draft, verified);
        `promising`: a good probe could get the row drafting again; `exploring`: the tick may
        explore (`Goodput`'s exploration budget), else a due probe waits (module docstring)."""
        self.since_probe += 1
        probing = exploring and self.due(tick, self.since_probe, self.gap(promising))
        if probing:
            self.since_probe, self.probe_at = 0, acceptance.rounds
        return probing

    def due_next(self, tick: int, promising: bool) -> bool:
        """Whether a probe is due at `tick` + 1."""
        return self.due(tick + 1, self.since_probe + 1, self.gap(promising))

    def gap(self, promising: bool) -> int:
        return self.probe_gap if promising else PROBE_MAX

    @staticmethod
    def due(tick: int, waited: int, gap: int) -> bool:
        """A probe after `waited` ticks of a `gap`: a long gap's on the grid all held rows share."""
        return waited >= gap and (gap < PROBE_FIRST or tick % PROBE_FIRST == 0)

    def drafting(self) -> None:
        """The row drafts this tick: its next hold at 0 starts the probes afresh."""
        self.since_probe, self.probe_gap = 0, PROBE_FIRST

    def settle(self, acceptance: Acceptance) -> None:
        """The last probe's verdict, read from the row's acceptance: accepted, probe again at once;
        missed, wait twice as long; not verified (retracted, ended), it tells nothing."""
        if self.probe_at is None:
            return
        if acceptance.rounds > self.probe_at:
            self.probe_gap = 1 if acceptance.latest else min(PROBE_MAX, 2 * self.probe_gap)
        self.probe_at = None


@dataclass(frozen=True)
class Line:
    """A record's estimate: `fixed` seconds plus `slope` per position. A record of one bucket
    prices every count at that bucket's mean until a second bucket gives a slope."""

    fixed: float
    slope: float

    @classmethod
    def of(cls, record: ForwardCost | None) -> Line | None:
        if record is None or not record.buckets:
            return None
        line = record.line()
        if line is None:
            (bucket,) = record.buckets.values()
            return cls(bucket.seconds, 0.0)
        return cls(*line)


@dataclass(frozen=True)
class Plane:
    """An estimate against counts: `fixed` seconds plus `parts[i]` per unit of count i."""

    fixed: float
    parts: tuple[float, ...]

    @classmethod
    def of(cls, record: PlaneCost | None, near: int | None = None) -> Plane | None:
        fitted = record.plane(near) if record is not None else None
        return None if fitted is None else cls(fitted[0], tuple(fitted[1]))

    @classmethod
    def of_passes(cls, record: PlaneCost) -> Plane | None:
        """A drafter's pass (fixed, per position, per sampled position). One bucket prices a pass
        by its positions (a sixteen-row pass is not what a lone row's costs), so rows of other
        counts draft, and get measured."""
        if len(record.buckets) == 1:
            (bucket,) = record.buckets.values()
            return cls(0.0, (bucket.seconds / max(bucket.counts[0], 1.0), 0.0))
        return cls.of(record)

    def at(self, *counts: float) -> float:
        return self.fixed + sum(part * count for part, count in zip(self.parts, counts, strict=True))


@dataclass(frozen=True)
class TickPrices:
    """What a tick's parts cost, from the measured records: the target's forward (against the
    tick's rows and positions), the rows' host work (against rows, verifying rows and positions),
    each drafter's pass (against the rows' positions of the pass)."""

    target: Plane  # (rows, positions)
    host: Plane  # (rows, verifying rows, positions)
    drafters: dict[int, tuple[PassShape, Plane]]  # id(drafter module) -> its passes (positions, sampled)

    def summary(self) -> dict[str, list[float]]:
        """The parts in milliseconds, for the log: the target's forward (fixed, per row, per
        position), the host work (fixed, per row, per verifying row, per position), each drafter's
        pass (fixed, per position)."""
        ms = lambda values: [round(1000 * v, 4) for v in values]  # noqa: E731
        parts = {"target": ms([self.target.fixed, *self.target.parts]), "host": ms([self.host.fixed, *self.host.parts])}
        for shape, plane in self.drafters.values():
            parts[f"drafter_{shape}"] = ms([plane.fixed, *plane.parts])
        return parts


def _key(row: WidthPolicy) -> int | None:
    module = row.passes.module
    return None if row.passes.shape is PassShape.NONE or module is None else id(module)


class Tick:
    """One tick's rows at the prices: its seconds and expected tokens at any widths (closed forms:
    every line is straight), and what each row's drafting adds to it. `plain` and `drafting`
    scale the tick with no row drafting and what the drafting adds (`Goodput.measured`)."""

    def __init__(
        self, prices: TickPrices, rows: Sequence[WidthPolicy], others: int, plain: float = 1.0, drafting: float = 1.0
    ) -> None:
        self.prices, self.rows, self.others, self.drafting = prices, rows, others, drafting
        self.alphas = [min(row.alpha, MAX_ACCEPTANCE) for row in rows]
        self.expected = [
            [expected_tokens(a, w) for w in range(row.n_max + 1)] for a, row in zip(self.alphas, rows, strict=True)
        ]
        groups: dict[int, list[int]] = defaultdict(list)
        for i, row in enumerate(rows):
            if (key := _key(row)) is not None:
                groups[key].append(i)
        self.groups = [(*prices.drafters[key], members) for key, members in groups.items()]
        self.group_of = {i: g for g, (_, _, members) in enumerate(self.groups) for i in members}
        host, target = prices.host.parts, prices.target.parts
        self.costs = []  # per row: (its drafting at all, each of its drafts), passes' fixed parts left out
        for i, row in enumerate(rows):
            shape, passes = self.groups[self.group_of[i]][:2] if i in self.group_of else (PassShape.NONE, NO_PASS)
            # a position: the target's, its host work, its pass's; each the more for a row whose sampler draws
            position = target[1] + host[2] + passes.parts[0] + (host[3] + passes.parts[1] if row.sampled else 0.0)
            first = host[1] + (position - target[1] - host[2] if shape is PassShape.BLOCK else 0.0)  # the anchor
            self.costs.append((drafting * first, drafting * position))
        count, sampled = len(rows) + others, sum(row.sampled for row in rows)
        at_zero = prices.target.at(count, count) + prices.host.at(count, 0, count, sampled)  # every row at 0
        unqueued = max(at_zero, 1e-6)  # a neighbourhood's plane may reach below 0 far from it
        self.fixed = plain * unqueued
        # A tick where any row drafts runs its forward there and then; a plain tick's was queued a
        # tick ahead, and what that overlap saves is in the plain scale (the fits are of ticks whose
        # forwards ran unqueued). Drafting at all forfeits it: measured on the CPU, 8 rows with
        # four probing at width 1 took 34.4 ms where the plain scale priced 28.5.
        self.unqueuing = max(0.0, unqueued - self.fixed)

    def seconds(self, widths: Sequence[int]) -> float:
        total = self.fixed + (self.unqueuing if any(widths) else 0.0)
        for (first, each), w in zip(self.costs, widths, strict=True):
            if w:
                total += first + each * w
        for shape, passes, members in self.groups:
            deepest = max(widths[i] for i in members)
            if deepest:  # a chain's pass per draft position, a block drafter's one pass
                total += self.drafting * passes.fixed * (deepest if shape is PassShape.CHAIN else 1)
        return total

    def tokens(self, widths: Sequence[int]) -> float:
        return self.others + sum(table[w] for table, w in zip(self.expected, widths, strict=True))

    def rate(self, widths: Sequence[int]) -> float:
        seconds = self.seconds(widths)
        return self.tokens(widths) / seconds if seconds > 0 else 0.0

    def added(self, widths: Sequence[int], index: int, width: int) -> float:
        """What row `index` at `width` adds to the tick over it at 0, the others at `widths`:
        its own costs, for the passes it makes deeper their fixed parts, and as the tick's first
        drafting row the queued forward's overlap the tick forfeits (`unqueuing`)."""
        if not width:
            return 0.0
        first, each = self.costs[index]
        added = first + each * width
        if not any(w for i, w in enumerate(widths) if i != index):  # the tick's first drafting row
            added += self.unqueuing
        if index in self.group_of:
            shape, passes, members = self.groups[self.group_of[index]]
            others = max((widths[i] for i in members if i != index), default=0)
            deeper = max(0, width - others) if shape is PassShape.CHAIN else int(others == 0)
            added += self.drafting * passes.fixed * deeper
        return added


@dataclass
class ExplorationBudget:
    """What probes and surveys may still cost, in seconds: `EXPLORATION_SHARE` of every tick's
    seconds, kept up to `EXPLORATION_BANK` ticks' worth (where it starts: a fresh server explores
    at once); an exploration dearer than the whole budget runs when the budget is full, and the
    debt it leaves holds the next back until the share has paid for it."""

    seconds: float | None = None  # None: full
    ceiling: float = 0.0

    def spend(self, tick_seconds: float, loss: float) -> None:
        """A tick of `tick_seconds` whose exploration lost `loss` seconds (0: none explored)."""
        self.ceiling = EXPLORATION_BANK * EXPLORATION_SHARE * tick_seconds
        banked = self.ceiling if self.seconds is None else self.seconds
        self.seconds = min(banked + EXPLORATION_SHARE * tick_seconds, self.ceiling) - loss

    def affords(self, loss: float) -> bool:
        return self.seconds is None or self.seconds >= min(loss, self.ceiling)


@dataclass
class Goodput:
    """Before each tick: every load-free row's width that maximises the tick's expected tokens per
    second, at the measured costs of the tick's parts (`TickPrices`); see the module docstring."""

    cost: Callable[[], ForwardCost | None]  # the target's forwards against positions (until `target` fits)
    host: Callable[[], PlaneCost | None] = lambda: None  # the rows' host work (None: not weighed)
    target: Callable[[], PlaneCost | None] = lambda: None  # the target's forwards against rows and positions
    ticks: int = 0
    # measured over predicted seconds: of a tick with no row drafting, and of what drafting adds
    plain_scale: float = 1.0
    drafting_scale: float = 1.0
    plain_ticks: int = 0  # ticks that calibrated `plain_scale` (rare while every row drafts)
    _surveys: int = field(default=0, repr=False)  # surveys run (their widths turn: `SURVEYS`)
    _surveyed_at: int = field(default=0, repr=False)  # the tick of the latest survey
    _budget: ExplorationBudget = field(default_factory=ExplorationBudget, repr=False)  # probes and surveys
    _exploring: str | None = field(default=None, repr=False)  # what the next tick explores (`_upcoming`)
    _fitted: dict[int, TickPrices | None] = field(default_factory=dict, repr=False)  # by rows' bit length
    _expected: tuple[float, float] | None = field(default=None, repr=False)  # the latest tick's (plain, drafting)
    # what the choice keeps of each row (held width, probes), for as long as the row lives
    _holds: weakref.WeakKeyDictionary[WidthPolicy, Hold] = field(default_factory=weakref.WeakKeyDictionary, repr=False)

    def prices(self, rows: Sequence[WidthPolicy]) -> TickPrices | None:
        """The tick's prices, fitted afresh every `REFIT_EVERY` ticks (and for a drafter not yet
        priced); None until the target's forward and every drafting row's drafter have been
        measured (until then each row runs its source's width)."""
        size = len(rows).bit_length()  # fitted near this many rows (PlaneCost.plane)
        fitted = self._fitted.get(size)
        if (
            fitted is None
            or self.ticks % REFIT_EVERY == 0
            or any((key := _key(row)) is not None and key not in fitted.drafters for row in rows)
        ):
            fitted = self._fitted[size] = self._fit(rows)
        return fitted

    def _fit(self, rows: Sequence[WidthPolicy]) -> TickPrices | None:
        target = Plane.of(self.target(), near=len(rows))
        if target is None:  # no tick timed yet: the forwards' positions line alone
            line = Line.of(self.cost())
            if line is None:
                return None
            target = Plane(line.fixed, (0.0, line.slope))
        drafters = {}
        for row in rows:
            if (key := _key(row)) is not None and key not in drafters:
                passes = Plane.of_passes(plane_of(row.passes.module, DRAFTING))
                if passes is None:
                    return None
                drafters[key] = (row.passes.shape, passes)
        return TickPrices(target, Plane.of(self.host(), near=len(rows)) or NO_HOST, drafters)

    def choose(self, rows: Sequence[WidthPolicy], positions: int = 0) -> WidthChoice:
        """This tick's offer to each of `rows` (the tick's decoding rows' policies; `positions`: its
        rows without one, a position each), and the rows whose held width moved, by index. The
        rows are read, never changed: each offer goes to its row's step (`WidthPolicy.decide`)."""
        self.ticks += 1
        holds = [self._hold(row) for row in rows]
        prices = self.prices(rows) if rows else None
        if prices is None:
            return WidthChoice((OWN_WIDTH,) * len(rows))
        tick = Tick(prices, rows, positions, self.plain_scale, self.drafting_scale)
        wanted = [row.wanted() for row in rows]
        # a row's first round runs at its own width: its acceptance is then its own, not the prior
        free = [i for i, row in enumerate(rows) if row.load_free and wanted[i] > 0 and row.acceptance.rounds]
        in_force = [min(w, holds[i].held_at) if i in free and holds[i].held_at is not None else w
                    for i, w in enumerate(wanted)]  # fmt: skip
        best = _best(tick, wanted, free)
        if tick.rate(best) <= LEAVE_GAIN * tick.rate(wanted):  # no clear gain over the rows' own widths
            best = list(wanted)
        if tick.rate(best) <= ADOPT_GAIN * tick.rate(in_force):  # nor over the widths in force: no flapping
            best = in_force
        gain = tick.rate(best) / max(tick.rate(wanted), 1e-12)
        changes = {}
        for i in free:
            hold, held = holds[i], best[i] if best[i] < wanted[i] else None
            if held != hold.held_at:
                changes[i] = WidthChange(len(rows), held, hold.held_at, round(gain, 4), prices.summary())
                hold.held_at = held
        seconds, tokens = tick.seconds(best), tick.tokens(best)
        promising = {i: _promising(tick, best, i, seconds, tokens, rows[i].acceptance) for i in free if best[i] == 0}
        exploring, self._exploring = self._exploring, None  # announced by the tick before
        surveying = exploring == SURVEY and self._survey_due(self.ticks)
        applied = self._surveyed(best, wanted, free) if surveying else list(best)
        if surveying:
            self._surveys, self._surveyed_at = self._surveys + 1, self.ticks
        for i in free:
            if surveying:
                continue
            if best[i] == 0 and holds[i].probe(self.ticks, promising[i], rows[i].acceptance, exploring is not None):
                applied[i] = 1
            elif best[i]:
                holds[i].drafting()
        rate = tokens / seconds if seconds > 0 else 0.0
        self._budget.spend(seconds, _loss(tick, applied, best, rate))
        self._exploring = self._upcoming(tick, best, wanted, free, holds, promising, rate)
        self._expected = (tick.fixed, tick.seconds(applied) - tick.fixed)
        plain = tick.fixed / (len(rows) + positions)  # each row's share of the tick with no row drafting
        offers = tuple(
            WidthOffer(
                applied[i] if i in free else None,
                partial(_share, tick, applied, i, plain),
                # queued a tick ahead unless the next tick explores (then its probes and survey
                # decide the row's width; the row's own release from the hold waits one tick)
                then_plain=i in free and applied[i] == 0 and self._exploring is None,
            )
            for i in range(len(rows))
        )
        return WidthChoice(offers, changes)

    def _survey_due(self, tick: int) -> bool:
        return tick - self._surveyed_at >= SURVEY_EVERY

    def _surveyed(self, best: list[int], wanted: list[int], free: list[int]) -> list[int]:
        """The survey's widths of the free rows: none, half the chosen, the rows' own, in turn."""
        surveyed = list(best)
        for i in free:
            surveyed[i] = (0, best[i] // 2, wanted[i])[self._surveys % SURVEYS]
        return surveyed

    def _upcoming(
        self,
        tick: Tick,
        best: list[int],
        wanted: list[int],
        free: list[int],
        holds: list[Hold],
        promising: dict[int, bool],
        rate: float,
    ) -> str | None:
        """What the next tick explores, at this tick's choice (`SURVEY`, `PROBES` or None):
        the survey once due, where the budget pays for it; else the probes then due, where the
        budget pays for them (not while a survey waits for it) or one of them is promising (an
        accepted probe would get its row drafting again: worth its price, and charged all the
        same). Decided a tick ahead: held rows queue their plain steps where nothing is explored."""
        survey_waits = self._survey_due(self.ticks + 1)
        if survey_waits and self._budget.affords(_loss(tick, self._surveyed(best, wanted, free), best, rate)):
            return SURVEY
        due = [i for i in promising if holds[i].due_next(self.ticks, promising[i])]
        if not due:
            return None
        probed = [1 if i in due else w for i, w in enumerate(best)]
        paid = not survey_waits and self._budget.affords(_loss(tick, probed, best, rate))
        return PROBES if paid or any(promising[i] for i in due) else None

    def held_at(self, row: WidthPolicy) -> int | None:
        """The width the choice holds `row` at (None: its own)."""
        hold = self._holds.get(row)
        return None if hold is None else hold.held_at

    def _hold(self, row: WidthPolicy) -> Hold:
        """The choice's own record of `row` (made on its first tick), its last probe settled."""
        hold = self._holds.get(row)
        if hold is None:
            hold = self._holds[row] = Hold()
        hold.settle(row.acceptance)
        return hold

    def measured(self, seconds: float) -> float | None:
        """The tick just chosen took `seconds` in all: the scales move toward what it says (a tick
        with no drafting calibrates the plain part, one with drafting what the drafting added),
        so what the parts' fits leave out is weighed all the same. The seconds the choice
        predicted for it (None: it priced no tick)."""
        if self._expected is None:
            return None
        plain, drafting = self._expected
        self._expected = None
        if drafting <= PLAIN_TICK * plain:
            # Plain ticks may come one in SURVEYS * SURVEY_EVERY while rows draft: their first few
            # weigh as a running mean's, or the price of width 0 would trail the truth for hundreds
            # of ticks (and what drafting is weighed against with it).
            self.plain_ticks += 1
            weight = max(CALIBRATION, 1.0 / self.plain_ticks)
            self.plain_scale = _rescaled(self.plain_scale, seconds / plain if plain > 0 else 1.0, weight)
        elif drafting > 0:
            self.drafting_scale = _rescaled(self.drafting_scale, (seconds - plain) / drafting, CALIBRATION)
        return plain + drafting


def _rescaled(scale: float, ratio: float, weight: float) -> float:
    """`scale` moved by `weight` toward `scale * ratio`, the ratio bounded (one tick is one noisy
    measurement) and a rise weighed half a fall (timing noise only adds, as app/execution/cost.py's
    buckets)."""
    bounded = min(max(ratio, 1 / SCALE_STEP), SCALE_STEP)
    weight = weight / 2 if bounded > 1 else weight
    return min(max(scale + weight * (scale * bounded - scale), SCALE_RANGE[0]), SCALE_RANGE[1])


NO_HOST = Plane(0.0, (0.0, 0.0, 0.0, 0.0))
NO_PASS = Plane(0.0, (0.0, 0.0))  # prompt lookup's: nothing forwarded
PLAIN_TICK = 0.02  # a tick whose drafting adds less than this share is a plain tick for the calibration
CALIBRATION = 0.05  # weight of one tick in the scales
SCALE_STEP = 2.0  # one tick moves a scale toward at most twice (or half) itself
SCALE_RANGE = (0.25, 4.0)
REFIT_EVERY = 4  # ticks between two fits of the records (a tick adds one measurement to each)
DINKELBACH_ROUNDS = 8  # enough: each round's rate is the best so far, and it settles in two or three


def _best(tick: Tick, wanted: list[int], free: list[int]) -> list[int]:
    """The widths of the most expected tokens per second. The tick's seconds are the free rows'
    costs (each a part for drafting at all and a part per draft) on top of a part the free rows
    share (the other rows', and the passes' fixed parts, which grow with the deepest width D);
    for each D, Dinkelbach's iteration (with the best rate R so far, every row takes the width
    that maximises its expected tokens minus R times its seconds) finds the best widths; the best
    over every D is taken."""
    widths = [0 if i in free else w for i, w in enumerate(wanted)]
    best, best_rate = widths, tick.rate(widths)
    if not free:
        return best
    for depth in range(1, max(wanted[i] for i in free) + 1):
        candidate, current = list(widths), best_rate
        for _ in range(DINKELBACH_ROUNDS):
            for i in free:
                first, each = tick.costs[i]
                alpha, top = tick.alphas[i], min(depth, wanted[i])
                # expected tokens past the first, less the rate times the seconds, at widths 1..top
                gain, choice, extra, power = 0.0, 0, 0.0, 1.0
                for w in range(1, top + 1):
                    power *= alpha
                    extra += power
                    if extra - current * (first + each * w) > gain:
                        gain, choice = extra - current * (first + each * w), w
                candidate[i] = choice
            achieved = tick.rate(candidate)
            if achieved <= current * (1 + 1e-9):
                break
            current = achieved
            if achieved > best_rate:
                best, best_rate = list(candidate), achieved
    return best


def _loss(tick: Tick, widths: list[int], best: list[int], rate: float) -> float:
    """The seconds a tick at `widths` loses against the choice (`best`, at `rate`): what its
    seconds exceed the time its expected tokens take at that rate (0 at the choice, and where no
    row drafts), and where the choice drafts nowhere, the queued overlap the next tick forfeits
    too: a row that drafted cannot have queued its next plain step (on the CPU, 8 rows of the
    embedded pair: 38 ms for that plain tick against 19 queued)."""
    if not any(widths) or rate <= 0:
        return 0.0
    requeue = 0.0 if any(best) else tick.unqueuing
    return max(0.0, tick.seconds(widths) + requeue - tick.tokens(widths) / rate)


def _promising(
    tick: Tick, widths: list[int], index: int, seconds: float, tokens: float, acceptance: Acceptance
) -> bool:
    """Whether one draft of row `index`, accepted at the rate a probe could show at best
    (`Acceptance.hopeful`), would raise the tick's rate (of `tokens` in `seconds` at `widths`)."""
    hopeful = acceptance.hopeful()
    return seconds > 0 and (tokens + hopeful) / (seconds + tick.added(widths, index, 1)) > tokens / seconds


def _share(tick: Tick, widths: list[int], index: int, plain: float, width: int) -> float:
    """Row `index`'s round at `width`: its share of the tick with no row drafting, plus what its
    drafting adds to the tick (the whole tick for a lone row)."""
    return plain + tick.added(widths, index, width)
