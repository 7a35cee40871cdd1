"""Verify widths: how many proposals a round asks for, fixed or adaptive.

The classic kinds ask for a fixed number (the plan's, capped by the request's n_max; prompt
lookup's governor may then propose fewer). The block loops adapt (the upstream controller's
constants):

Warm up at the drafter's declared width, then measure emitted tokens per millisecond over
32-round windows. A trial of the wider width is adopted only if it beats the held width by more
than 2 %; it is abandoned early below 0.65x after at least 4 rounds. A loser is re-challenged
after 4 windows, four times later after each further consecutive loss, at most 64 windows.
One controller per loaded drafter: every row's rounds feed it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum
from typing import Protocol

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
    BASELINE = "baseline"
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
    baseline: float = 0.0
    losses: int = 0
    trials: int = 0
    cooldown_windows: int = 0
    window: Window = field(default_factory=Window)

    def __post_init__(self) -> None:
        self.held = self.declared
        active = self.enabled and self.ceiling > self.declared
        self.phase = Phase.WARMUP if active else Phase.SETTLED

    @property
    def widths(self) -> list[int]:
        """Every width this controller may use (each must pass the exactness probe)."""
        return sorted({self.declared, self.ceiling}) if self.phase is not Phase.SETTLED else [self.held]

    def width(self) -> int:
        return self.ceiling if self.phase is Phase.TRIAL else self.held

    def settle(self) -> None:
        """Stop adapting (e.g. the wider width failed the exactness probe)."""
        self.phase = Phase.SETTLED

    def observe(self, tokens: int, seconds: float) -> None:
        """One verify round at `width()`: tokens emitted and its wall time."""
        if self.phase is Phase.SETTLED:
            return
        self.window.add(tokens, seconds)
        rounds = self.window.rounds
        if self.phase is Phase.WARMUP and rounds >= WARMUP_ROUNDS:
            self._next(Phase.BASELINE)
        elif self.phase in (Phase.BASELINE, Phase.COOLDOWN) and rounds >= WINDOW_ROUNDS:
            self.baseline = self.window.rate
            if self.phase is Phase.COOLDOWN and self.cooldown_windows > 1:
                self.cooldown_windows -= 1
                self._next(Phase.COOLDOWN)
            else:
                self._next(Phase.TRIAL)
        elif self.phase is Phase.TRIAL:
            self._judge_trial()

    def _judge_trial(self) -> None:
        window = self.window
        if window.rounds >= ABANDON_AFTER and window.rate < ABANDON_BELOW * self.baseline:
            self._lose()
        elif window.rounds >= WINDOW_ROUNDS:
            if window.rate > ADOPT_ABOVE * self.baseline:
                self.held, self.trials = self.ceiling, self.trials + 1
                self._next(Phase.SETTLED)
            else:
                self._lose()

    def _lose(self) -> None:
        self.trials += 1
        self.losses += 1
        self.cooldown_windows = min(MAX_BACKOFF_WINDOWS, RECHALLENGE_WINDOWS * BACKOFF ** (self.losses - 1))
        self._next(Phase.COOLDOWN)

    def _next(self, phase: Phase) -> None:
        self.phase, self.window = phase, Window()


class Widths(Protocol):
    """Where a speculative loop takes each round's width from."""

    def proposals(self) -> int:
        """Proposals to ask for this round (the loop caps them by the tokens left)."""
        ...

    def observe(self, tokens: int, seconds: float) -> None:
        """A verify round of proposals emitted `tokens` in `seconds`."""
        ...


@dataclass
class FixedWidth:
    """The classic kinds: the plan's width, capped by the request's n_max."""

    width: int

    def proposals(self) -> int:
        return self.width

    def observe(self, tokens: int, seconds: float) -> None:
        """A fixed width learns nothing from a round."""


@dataclass
class ControlledWidth:
    """A block loop row: the shared controller's verify width (bonus row included), capped by n_max."""

    controller: WidthController
    n_max: int | None = None

    def proposals(self) -> int:
        width = self.controller.width() - 1
        return width if self.n_max is None else min(width, self.n_max)

    def observe(self, tokens: int, seconds: float) -> None:
        self.controller.observe(tokens, seconds)
