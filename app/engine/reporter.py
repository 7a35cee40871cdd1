"""The reporter: what the engine tells the outside about requests (log events, metrics).

Called on the engine thread only. The events and their keys are a contract (app/events.py,
docs/log-events.md); the counters are what /metrics serves.
"""

from __future__ import annotations

import dataclasses

import structlog

from app import events
from app.decoding.generation import Generation
from app.decoding.outcome import Note
from app.decoding.row_events import Finished
from app.decoding.width import WidthChange
from app.engine.metrics import Metrics
from app.engine.row import Job, Row

GOVERNOR_EVENTS = ("governor_paused", "governor_resumed")


class Reporter:
    def __init__(self, profile: str) -> None:
        self.profile = profile
        self.metrics = Metrics()
        self._log = structlog.get_logger("mlxcel.engine")

    def occupancy(self, waiting: int, running: int) -> None:
        """llama-server's requests_deferred and requests_processing gauges."""
        self.metrics.requests_deferred, self.metrics.requests_processing = waiting, running

    def noted(self, job: Job, generation: Generation) -> None:
        """What the row noted since the last call: how its loop was chosen (block loops: drafter
        loaded, probes, declines), prompt lookup's governor pausing or resuming (with the tokens
        the row has decided)."""
        for note in generation.stats.unlogged():
            if note.event in GOVERNOR_EVENTS:
                decided = len(generation.emitted)
                events.governor_changed(note.event, request_id=job.request_id, decided=decided, **note.fields)
            else:
                events.loop_note(note.event, request_id=job.request_id, warning=note.warning, **note.fields)

    def width_changed(self, job: Job, change: WidthChange) -> None:
        """The tick's choice moved the width it holds a row at (app/decoding/width.py `Goodput`)."""
        events.speculation_width_changed(request_id=job.request_id, **dataclasses.asdict(change))

    def prepared(self, notes: list[Note]) -> None:
        """What preparing a block drafter before any request noted (no request id: none asked)."""
        for note in notes:
            events.loop_note(note.event, request_id=None, warning=note.warning, **note.fields)

    def drafter_unavailable(self, job: Job, reason: str) -> None:
        self._log.warning("drafter_unavailable", request_id=job.request_id, reason=reason)

    def bound_reached(self, job: Job, reason: str) -> None:
        """A row stopped at its request's bound (the client got 400 with `reason`)."""
        self._log.warning("request_bound_reached", request_id=job.request_id, reason=reason)

    def cancelled(self, job: Job, decided: int) -> None:
        self._log.info("request_cancelled", request_id=job.request_id, decided=decided)

    def finished(self, row: Row, result: Finished) -> None:
        """Count the result and its latencies; after a verify round, emit `speculative_request`."""
        job, generation = row.job, row.generation
        speculation, stats = generation.speculation, generation.stats
        self.metrics.observe(result, stats)
        first = generation.prefill_finished  # the first token is decided as the prefill ends
        last = generation.last_token_at or first
        self.metrics.latencies.observe(job.created, job.admitted, first, last, len(generation.emitted))
        if not (speculation.drafting and stats.ran):
            return
        events.speculative_request(
            request_id=job.request_id,
            route=job.route,
            rule=str(speculation.rule),
            draft_kind=str(speculation.draft_kind),
            stats=stats.acceptance,
            predicted_n=len(generation.emitted),
            biased=speculation.biased(generation.state.sampler.is_greedy),
            coupled=speculation.coupled,
            n_max=result.n_max,
            widths=stats.widths,
            plain_steps=stats.plain_steps,
            governor_pauses=stats.governor_pauses,
            governor_resumes=stats.governor_resumes,
            profile=self.profile,
        )
