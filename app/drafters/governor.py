"""Prompt-lookup governors: how many tokens to propose, and when to stop proposing.

A proposal costs a wider verify forward; lookups that keep missing cost more than they save.
Evidence is only ever a verified round (`observe_round`). While paused, a governor keeps
watching emitted tokens through *shadow* lookups: it proposes without verifying and compares
with what the target then decides (`observe_emitted`), resuming once enough of them match.

Policies (EMA of accepted tokens per drafted round, alpha 0.5):
- graded: budget = clamp(round(2 * ema) + 2, 1, max_draft); three misses in a row pause for
  4 rounds, doubling on every consecutive pause up to 32.
- gated: narrow 2-token blocks until the EMA reaches 1.5, then full blocks; a miss on a narrow
  block or three misses in a row pause with no timer until 2 shadow tokens in a row match.
- break-even (the server's default): full blocks while active; pausing is decided by tokens
  per verify (EMA + 1) against a floor (see `BreakEvenGovernor`).
`adaptive = False` always proposes the full block and never pauses, whatever the policy.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

ALPHA = 0.5
MISSES_TO_PAUSE = 3
GRADED_FIRST_PAUSE = 4
GRADED_MAX_PAUSE = 32
GATED_WIDE_EMA = 1.5
GATED_NARROW = 2
CLI_SHADOW_MATCHES = 2
SERVER_SHADOW_MATCHES = 7
MIN_ROUNDS_BEFORE_PAUSE = 2
DEFAULT_FLOOR = 4.0

Lookup = Callable[[int], list[int]]


@dataclass
class Shadow:
    """Unverified proposals compared against the tokens the target goes on to decide."""

    needed: int
    pending: list[int] = field(default_factory=list)
    streak: int = 0

    def observe(self, emitted: list[int], lookup: Lookup, width: int) -> bool:
        """Feed emitted tokens; True once `needed` shadow tokens in a row matched."""
        for token in emitted:
            if not self.pending:
                self.streak = 0
            elif self.pending[0] == token:
                self.pending.pop(0)
                self.streak += 1
            else:
                self.pending, self.streak = [], 0
        if self.streak >= self.needed:
            return True
        if not self.pending:
            self.pending = lookup(width)
        return False


@dataclass
class Governor:
    """Shared state: the EMA of accepted tokens per drafted round and pause bookkeeping."""

    max_draft: int
    adaptive: bool = True
    ema: float = 0.0
    rounds: int = 0  # verified rounds since the start or the last resume
    observed_rounds: int = 0  # every verified round ever observed (the evidence count)
    misses: int = 0
    paused: bool = False
    pauses: int = 0
    resumes: int = 0
    # (event, ema) of each pause and resume not yet reported: the row's width policy turns them
    # into notes its round reports (app/decoding/width.py)
    changes: list[tuple[str, float]] = field(default_factory=list, repr=False, compare=False)

    def budget(self) -> int:
        """Tokens to propose now (0: paused)."""
        if not self.adaptive:
            return self.max_draft
        return 0 if self.paused else self.active_budget()

    def active_budget(self) -> int:
        return self.max_draft

    def observe_round(self, proposed: int, accepted: int) -> None:
        """A verified round: the only evidence a governor takes."""
        if not self.adaptive:
            return
        previous = self.ema
        self.ema = (1 - ALPHA) * self.ema + ALPHA * accepted
        self.rounds += 1
        self.observed_rounds += 1
        self.misses = self.misses + 1 if accepted == 0 else 0
        self.after_round(proposed, accepted, previous)

    def after_round(self, proposed: int, accepted: int, previous_ema: float) -> None:
        """Policy-specific pausing."""

    def observe_emitted(self, emitted: list[int], lookup: Lookup) -> None:
        """Tokens decided by a plain step (no proposal was verified)."""

    def pause(self) -> None:
        self.paused = True
        self.pauses += 1
        self._notify("governor_paused")

    def resume(self) -> None:
        self.paused = False
        self.resumes += 1
        self.ema, self.rounds, self.misses = 0.0, 0, 0
        self._notify("governor_resumed")

    def _notify(self, event: str) -> None:
        self.changes.append((event, self.ema))


@dataclass
class GradedGovernor(Governor):
    pause_length: int = GRADED_FIRST_PAUSE
    paused_for: int = 0

    def active_budget(self) -> int:
        return max(1, min(self.max_draft, round(2 * self.ema) + 2))

    def after_round(self, proposed: int, accepted: int, previous_ema: float) -> None:
        if accepted > 0:
            self.pause_length = GRADED_FIRST_PAUSE
        elif self.misses >= MISSES_TO_PAUSE:
            self.pause()
            self.paused_for = 0

    def observe_emitted(self, emitted: list[int], lookup: Lookup) -> None:
        if not self.paused:
            return
        self.paused_for += 1
        if self.paused_for >= self.pause_length:
            self.pause_length = min(GRADED_MAX_PAUSE, 2 * self.pause_length)
            ema = self.ema
            self.resume()
            self.ema = ema  # a timed pause keeps the EMA it had


@dataclass
class GatedGovernor(Governor):
    shadow: Shadow = field(default_factory=lambda: Shadow(CLI_SHADOW_MATCHES))

    def active_budget(self) -> int:
        return self.max_draft if self.ema >= GATED_WIDE_EMA else min(GATED_NARROW, self.max_draft)

    def after_round(self, proposed: int, accepted: int, previous_ema: float) -> None:
        on_probation = previous_ema < GATED_WIDE_EMA
        if accepted == 0 and (on_probation or self.misses >= MISSES_TO_PAUSE):
            self.pause()
            self.shadow = Shadow(CLI_SHADOW_MATCHES)

    def observe_emitted(self, emitted: list[int], lookup: Lookup) -> None:
        if self.paused and self.shadow.observe(emitted, lookup, GATED_NARROW):
            self.resume()


@dataclass
class BreakEvenGovernor(Governor):
    """The server's governor: pause rows whose verify rounds do not pay for themselves.

    Tokens per verify is the accepted EMA plus one (every round emits a bonus token). After at
    least two drafted rounds, a row whose EMA has fallen below `floor` pauses when its latest
    round is below the floor too; a latest round at or above the floor repays the EMA's
    startup debt instead. An isolated zero-accept round right after an accepted-token EMA (the
    EMA itself, not tokens per verify) at or above the floor gets one round of grace; a partial
    low-yield round does not, and grace never covers a second consecutive low round. Paused rows
    run shadow lookups; 7 matching shadow tokens in a row resume verification.
    """

    floor: float = DEFAULT_FLOOR
    low_streak: int = 0
    shadow: Shadow = field(default_factory=lambda: Shadow(SERVER_SHADOW_MATCHES))

    def after_round(self, proposed: int, accepted: int, previous_ema: float) -> None:
        if accepted + 1 >= self.floor:
            self.low_streak = 0
            return
        graced = accepted == 0 and self.low_streak == 0 and previous_ema >= self.floor
        self.low_streak += 1
        if graced:
            return
        if self.rounds >= MIN_ROUNDS_BEFORE_PAUSE and self.ema + 1 < self.floor:
            self.pause()
            self.shadow = Shadow(SERVER_SHADOW_MATCHES)

    def observe_emitted(self, emitted: list[int], lookup: Lookup) -> None:
        if self.paused and self.shadow.observe(emitted, lookup, self.max_draft):
            self.resume()
            self.low_streak = 0


POLICIES = ("break-even", "graded", "gated")


def make_governor(max_draft: int, *, policy: str, adaptive: bool = True, floor: float = DEFAULT_FLOOR) -> Governor:
    """break-even is the default (`governor.policy`, the server's and the CLI's alike); `floor`
    only applies to break-even."""
    if policy == "break-even":
        return BreakEvenGovernor(max_draft=max_draft, adaptive=adaptive, floor=floor)
    if policy == "graded":
        return GradedGovernor(max_draft=max_draft, adaptive=adaptive)
    if policy == "gated":
        return GatedGovernor(max_draft=max_draft, adaptive=adaptive)
    raise ValueError(f"unknown governor policy {policy!r}: use one of {', '.join(POLICIES)}")
