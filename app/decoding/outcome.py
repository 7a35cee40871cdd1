"""What one round (or plain step) reports, and the row's counters folded from those reports.

A round loop never keeps counters: each step returns an immutable `RoundOutcome`, and the row's
`Generation` folds it into its `RowStats` once it knows how many of the tokens it kept (a stop
inside a round keeps fewer; the drafts past it are not counted as accepted). Responses, /slots,
events and metrics read the stats; nothing reads a loop.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from app.acceptance import AcceptanceStats, Verdict
from app.decoding.speculation import Speculation
from app.decoding.timings import SpeculativeDiagnostics
from app.events import speculation as events

GOVERNOR_EVENTS = {"governor_paused": events.governor_paused, "governor_resumed": events.governor_resumed}
LOOP_EVENTS = {  # how a block loop was chosen
    "drafter_loaded": events.drafter_loaded,
    "exactness_probe": events.exactness_probe,
    "exactness_probe_overridden": events.exactness_probe_overridden,
    "block_loop_declined": events.block_loop_declined,
}


@dataclass
class Note:
    """Something the row wants logged: `event` name, its fields, and whether it is the warning of
    that outcome (block-loop choices: a decline warns, not also the probe behind it; prompt
    lookup's governor: `governor_paused`, `governor_resumed`)."""

    event: str
    fields: dict[str, object]
    warning: bool = False


def log_notes(notes: list[Note], request_id: str | None, decided: int = 0) -> None:
    """Emit each note's event for row `request_id` (None: no request asked, as for a reload's
    engine preparing its drafter); the governor's carry the tokens the row has `decided`."""
    for note in notes:
        if note.event in GOVERNOR_EVENTS:
            GOVERNOR_EVENTS[note.event](request_id=request_id, decided=decided, **note.fields)
        else:
            LOOP_EVENTS[note.event](request_id=request_id, level="warning" if note.warning else "info", **note.fields)


@dataclass(frozen=True)
class ClosedForms:
    """sum_x min(p, q), sum_x p q and the coupled drafts' agreement (app/acceptance/rules.py
    sum_coupled) of each position a round tested (MLXCEL_SPECULATIVE_ACCEPT_DIAG)."""

    sum_min: tuple[float, ...]
    sum_prod: tuple[float, ...]
    coupled: tuple[float, ...]


@dataclass(frozen=True)
class RoundOutcome:
    """One step of a row: the tokens it decided, the grammar-forced ones first (`jumped`), then
    the round's; `verdict` when proposals were verified (`proposed` of them, the policy having
    decided `width`); `notes` to log."""

    tokens: tuple[int, ...]
    jumped: int = 0
    width: int = 0
    proposed: int = 0
    verdict: Verdict | None = None
    closed_forms: ClosedForms | None = None
    notes: tuple[Note, ...] = ()

    @property
    def verified(self) -> bool:
        return self.verdict is not None and self.proposed > 0

    def drafted(self, kept: int) -> list[bool]:
        """Which of the first `kept` tokens are accepted drafts (the round's, after the forced ones)."""
        accepted = self.verdict.accepted if self.verified else 0
        return [self.jumped <= i < self.jumped + accepted for i in range(kept)]


@dataclass
class RowStats:
    """One row's counters: acceptance, jump-forward, the widths its rounds ran at, the steps it
    decoded plainly, the governor's pauses, and the notes not yet logged."""

    acceptance: AcceptanceStats = field(default_factory=AcceptanceStats)
    jumped: int = 0
    widths: dict[int, int] = field(default_factory=dict)  # width -> verify rounds run at it
    # steps that verified no draft (width 0: the tick's choice or a paused governor; a retracted proposal)
    plain_steps: int = 0
    governor_pauses: int = 0
    governor_resumes: int = 0
    notes: list[Note] = field(default_factory=list)
    _logged: int = 0  # notes[:_logged] were logged (log_notes)

    @property
    def ran(self) -> bool:
        """At least one round was verified."""
        return self.acceptance.rounds > 0

    def fold(self, outcome: RoundOutcome, kept: int) -> None:
        """Count a step of which the row kept the first `kept` tokens."""
        self.jumped += min(kept, outcome.jumped)
        self.notes += outcome.notes
        self.governor_pauses += sum(note.event == "governor_paused" for note in outcome.notes)
        self.governor_resumes += sum(note.event == "governor_resumed" for note in outcome.notes)
        if not outcome.verified:
            self.plain_steps += len(outcome.tokens) > outcome.jumped
            return
        self.widths[outcome.width] = self.widths.get(outcome.width, 0) + 1
        self.acceptance.observe(outcome.proposed, outcome.verdict)
        if (forms := outcome.closed_forms) is not None:
            self.acceptance.observe_closed_forms(list(forms.sum_min), list(forms.sum_prod), list(forms.coupled))
        if kept < len(outcome.tokens):  # the round's tokens follow the forced ones
            self.acceptance.clamp_last_round(max(0, kept - outcome.jumped))

    def unlogged(self) -> list[Note]:
        """The notes since the last call (each is logged once)."""
        notes, self._logged = self.notes[self._logged :], len(self.notes)
        return notes

    def diagnostics(self, speculation: Speculation, greedy: bool) -> SpeculativeDiagnostics | None:
        """What this row's rounds did, for a request that asked; None where no drafter runs."""
        if speculation.rule is None:
            return None
        stats = self.acceptance
        return SpeculativeDiagnostics(
            rule=str(speculation.rule),
            identity=speculation.rule.identity,
            biased=speculation.biased(greedy),
            coupled=speculation.coupled,
            rounds=stats.rounds,
            proposed=stats.proposed,
            positions_tested=stats.positions_tested,
            accepted=stats.accepted,
            per_position_acceptance=stats.per_position_acceptance,
            accepted_per_position=list(stats.accepted_per_position),
            accepted_lengths=list(stats.accepted_lengths),
            closed_form_sum_min=stats.closed_form_sum_min if speculation.diagnose else None,
            closed_form_sum_prod=stats.closed_form_sum_prod if speculation.diagnose else None,
            closed_form_coupled=stats.closed_form_coupled if speculation.diagnose else None,
        )
