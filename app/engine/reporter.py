"""The reporter: what the engine tells the outside about requests (log events, metrics).

Called on the engine thread only. The events and their keys are a contract (app/events/,
docs/log-events.md); the counters are what /metrics serves.
"""

from __future__ import annotations

import dataclasses

from app.decoding.generation import Generation
from app.decoding.goodput import WidthChange
from app.decoding.outcome import Note, log_notes
from app.decoding.row_events import Finished
from app.engine.metrics import Metrics
from app.engine.row import Job, Row
from app.events import engine as events
from app.events.speculation import speculation_width_changed, speculative_request, tick_timed
from app.execution.cost import TickClock


class Reporter:
    def __init__(self, profile: str) -> None:
        self.profile = profile
        self.metrics = Metrics()

    def occupancy(self, waiting: int, running: int) -> None:
        """llama-server's requests_deferred and requests_processing gauges."""
        self.metrics.requests_deferred, self.metrics.requests_processing = waiting, running

    def noted(self, job: Job, generation: Generation) -> None:
        """What the row noted since the last call: how its loop was chosen (block loops: drafter
        loaded, probes, declines), prompt lookup's governor pausing or resuming (with the tokens
        the row has decided)."""
        generation.log_notes(job.request_id)

    def width_changed(self, job: Job, change: WidthChange) -> None:
        """The tick's choice moved the width it holds a row at (app/decoding/goodput.py `Goodput`)."""
        speculation_width_changed(request_id=job.request_id, **dataclasses.asdict(change))

    def timed(self, rows: list[Row], clock: TickClock, predicted: float | None) -> None:
        """A tick of decoding rows, part by part, and the seconds the width choice predicted."""
        widths = [row.generation.widths.current or 0 for row in rows if row.generation.widths is not None]
        tick_timed(
            rows=len(rows),
            drafting_rows=len(widths),
            widths=widths,
            passes=clock.passes,
            drafting_ms=1e3 * clock.drafting_s,
            forward_ms=1e3 * clock.forward_s,
            rest_ms=1e3 * clock.rest_s,
            predicted_ms=None if predicted is None else 1e3 * predicted,
        )

    def prepared(self, notes: list[Note]) -> None:
        """What preparing a block drafter before any request noted (no request id: none asked)."""
        log_notes(notes, request_id=None)

    def drafter_unavailable(self, job: Job, reason: str) -> None:
        events.drafter_unavailable(request_id=job.request_id, reason=reason)

    def bound_reached(self, job: Job, reason: str) -> None:
        """A row stopped at its request's bound (the client got 400 with `reason`)."""
        events.request_bound_reached(request_id=job.request_id, reason=reason)

    def cancelled(self, job: Job, decided: int) -> None:
        events.request_cancelled(request_id=job.request_id, decided=decided)

    def finished(self, row: Row, result: Finished) -> None:
        """Count the result and its latencies; after a verify round, emit `speculative_request`."""
        job, generation = row.job, row.generation
        self.metrics.observe(result, generation.stats)
        first = generation.prefill_finished  # the first token is decided as the prefill ends
        last = generation.last_token_at or first
        self.metrics.latencies.observe(job.created, job.admitted, first, last, len(generation.emitted))
        if (speculated := generation.speculated()) is not None:
            speculative_request(request_id=job.request_id, route=job.route, profile=self.profile, **speculated)
