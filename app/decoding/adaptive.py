"""Width sources: how many proposals a row's round asks for before the width policy
(app/decoding/width.py) caps them by the row's n_max, the tick's load and the tokens left.

The draft model asks for a fixed number (the plan's); prompt lookup's governor is a source of its
own (width.py `GovernedWidth`). The block loops adapt (the upstream controller's constants):

Warm up at the drafter's declared width, then measure emitted tokens per millisecond. A trial
runs the held width and the other one (the wider, or once that was adopted the declared) in
alternate rounds, 32 rounds each, and adopts the other width only if it beats the held one by
more than 2 %; it is abandoned early below 0.65x after at least 4 rounds of each. A loser is
re-challenged after 4 windows of 32 rounds, four times later after each further consecutive loss,
at most 64 windows; a width that was just dethroned re-challenges after 4. One controller per
loaded drafter: every row's rounds feed it, each charged to the width that row ran.

Why alternate rounds rather than a baseline window and then a trial window, and why no width is
adopted for good: how many drafts the target accepts depends on the text far more than on the
width (on the held-out code prompts, 1.7 to 3.3 tokens per round at width 4 from one prompt to
the next, and low in a request's first rounds). Two successive windows compare two stretches of
text, not two widths; interleaved, both widths see the same stretch. And a width that wins on
one stretch (repetitive code, where width 8 accepts 30 % more a round) can lose on the rest, so
the other width keeps being re-challenged.

A round is charged what the tick's measured prices say it cost (app/decoding/width.py
`WidthPolicy.observe`): its share of the tick had no row drafted, plus what its own drafting
added (its verify positions, its drafter's passes, the context rows they carry, its host work).
The wall clock of a shared tick would charge each row every batch-mate's work, and narrow a width
that pays. Before anything is measured a round is charged its wall time.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from app.acceptance import Verdict
    from app.decoding.outcome import Note

WARMUP_ROUNDS = 8
WINDOW_ROUNDS = 32
ADOPT_ABOVE = 1.02
ABANDON_BELOW = 0.65
ABANDON_AFTER = 4
RECHALLENGE_WINDOWS = 4
BACKOFF = 4
MAX_BACKOFF_WINDOWS = 64


class Phase(StrEnum):
    WARMUP = "warmup"
    TRIAL = "trial"
    COOLDOWN = "cooldown"
    SETTLED = "settled"


@dataclass
class Window:
    rounds: int = 0
    tokens: int = 0
    seconds: float = 0.0

    def add(self, tokens: int, seconds: float) -> None:
        self.rounds += 1
        self.tokens += tokens
        self.seconds += seconds

    @property
    def rate(self) -> float:
        """Emitted tokens per millisecond."""
        return self.tokens / (self.seconds * 1000.0) if self.seconds > 0 else 0.0


@dataclass
class WidthController:
    declared: int
    ceiling: int
    enabled: bool = True
    held: int = field(init=False)
    phase: Phase = field(init=False)
    losses: int = 0  # consecutive lost trials
    trials: int = 0
    cooldown_windows: int = 0
    window: Window = field(default_factory=Window)  # warm-up / cooldown rounds, or the trial's held width
    challenger: Window = field(default_factory=Window)  # the trial's rounds at the other width

    def __post_init__(self) -> None:
        self.held = self.declared
        active = self.enabled and self.ceiling > self.declared
        self.phase = Phase.WARMUP if active else Phase.SETTLED

    @property
    def widths(self) -> list[int]:
        """Every width this controller may use (each must pass the exactness probe)."""
        return sorted({self.declared, self.ceiling}) if self.phase is not Phase.SETTLED else [self.held]

    @property
    def other(self) -> int:
        return self.declared if self.held == self.ceiling else self.ceiling

    def width(self) -> int:
        """The next round's width: in a trial, whichever width has run fewer of its rounds."""
        if self.phase is Phase.TRIAL and self.challenger.rounds <= self.window.rounds:
            return self.other
        return self.held

    def settle(self) -> None:
        """Stop adapting at the held width (e.g. the wider width failed the exactness probe)."""
        self.phase = Phase.SETTLED

    def observe(self, width: int, tokens: int, seconds: float) -> None:
        """One verify round run at `width`: tokens emitted and what it cost (module docstring)."""
        if self.phase is Phase.SETTLED:
            return
        if self.phase is Phase.TRIAL:
            (self.challenger if width == self.other else self.window).add(tokens, seconds)
            self._judge_trial()
            return
        self.window.add(tokens, seconds)
        rounds = self.window.rounds
        if self.phase is Phase.WARMUP and rounds >= WARMUP_ROUNDS:
            self._next(Phase.TRIAL)
        elif self.phase is Phase.COOLDOWN and rounds >= WINDOW_ROUNDS:
            if self.cooldown_windows > 1:
                self.cooldown_windows -= 1
                self._next(Phase.COOLDOWN)
            else:
                self._next(Phase.TRIAL)

    def _judge_trial(self) -> None:
        held, challenger = self.window, self.challenger
        measured = min(held.rounds, challenger.rounds)
        if measured >= ABANDON_AFTER and challenger.rate < ABANDON_BELOW * held.rate:
            self._lose()
        elif measured >= WINDOW_ROUNDS:
            if challenger.rate > ADOPT_ABOVE * held.rate:
                self._adopt()
            else:
                self._lose()

    def _adopt(self) -> None:
        self.held, self.trials, self.losses = self.other, self.trials + 1, 0
        self.cooldown_windows = RECHALLENGE_WINDOWS
        self._next(Phase.COOLDOWN)

    def _lose(self) -> None:
        self.trials += 1
        self.losses += 1
        self.cooldown_windows = min(MAX_BACKOFF_WINDOWS, RECHALLENGE_WINDOWS * BACKOFF ** (self.losses - 1))
        self._next(Phase.COOLDOWN)

    def _next(self, phase: Phase) -> None:
        self.phase, self.window, self.challenger = phase, Window(), Window()


class Widths(Protocol):
    """Where a row's width comes from before the width policy (app/decoding/width.py) caps it."""

    def proposals(self) -> int:
        """Proposals wanted for the next round (reads only: asked again until a round is observed)."""
        ...

    def observe(self, tokens: list[int], proposed: int, verdict: Verdict | None, seconds: float) -> None:
        """A step decided `tokens` in `seconds`; `verdict` when its `proposed` drafts were verified."""
        ...

    def notes(self) -> tuple[Note, ...]:
        """What the source wants logged since the last call."""
        ...


@dataclass
class FixedWidth:
    """The draft model: the plan's width."""

    width: int

    def proposals(self) -> int:
        return self.width

    def observe(self, tokens: list[int], proposed: int, verdict: Verdict | None, seconds: float) -> None:
        """A fixed width learns nothing from a round."""

    def notes(self) -> tuple[Note, ...]:
        return ()


@dataclass
class ControlledWidth:
    """A block loop row: the shared controller's verify width less the bonus row. Its rounds are
    charged to the width it asked for, whatever other rows did meanwhile."""

    controller: WidthController
    asked: int = 0  # the verify width of this row's round in flight

    def proposals(self) -> int:
        self.asked = self.controller.width()
        return self.asked - 1

    def observe(self, tokens: list[int], proposed: int, verdict: Verdict | None, seconds: float) -> None:
        if verdict is not None and proposed:
            self.controller.observe(self.asked, len(tokens), seconds)

    def notes(self) -> tuple[Note, ...]:
        return ()
