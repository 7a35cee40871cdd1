"""The reporter: what the engine tells the outside about requests (log events, metrics).

Called on the engine thread only. The events and their keys are a contract (app/events.py,
docs/log-events.md); the counters are what /metrics serves.
"""

from __future__ import annotations

from collections.abc import Callable

import structlog

from app import events
from app.decoding.generation import Generation
from app.drafters.governor import Governor, Listener
from app.engine.metrics import Metrics
from app.engine.row import Finished, Job, Row


class Reporter:
    def __init__(self, profile: str) -> None:
        self.profile = profile
        self.metrics = Metrics()
        self._log = structlog.get_logger("mlxcel.engine")

    def occupancy(self, waiting: int, running: int) -> None:
        """llama-server's requests_deferred and requests_processing gauges."""
        self.metrics.requests_deferred, self.metrics.requests_processing = waiting, running

    def governor_listener(self, job: Job, decided: Callable[[], int]) -> Listener:
        """`governor_paused` / `governor_resumed` for this job, with how many tokens it had decided."""

        def listener(event: str, governor: Governor) -> None:
            floor = getattr(governor, "floor", None)
            events.governor_changed(event, request_id=job.request_id, decided=decided(), ema=governor.ema, floor=floor)

        return listener

    def built(self, job: Job, generation: Generation) -> None:
        """How the request's loop was chosen (block loops: drafter loaded, probes, declines)."""
        for note in generation.notes:
            events.loop_note(note.event, request_id=job.request_id, warning=note.warning, **note.fields)

    def drafter_unavailable(self, job: Job, reason: str) -> None:
        self._log.warning("drafter_unavailable", request_id=job.request_id, reason=reason)

    def cancelled(self, job: Job, decided: int) -> None:
        self._log.info("request_cancelled", request_id=job.request_id, decided=decided)

    def finished(self, row: Row, result: Finished) -> None:
        """Count the result; after a verify round, emit `speculative_request`."""
        speculation = row.generation.loop.speculation
        self.metrics.observe(result, speculation.stats)
        if not speculation.ran:
            return
        generation = row.generation
        events.speculative_request(
            request_id=row.job.request_id,
            route=row.job.route,
            rule=str(speculation.rule),
            draft_kind=str(speculation.draft_kind),
            stats=speculation.stats,
            predicted_n=len(generation.emitted),
            biased=not speculation.rule.lossless and not generation.state.sampler.is_greedy,
            governor_pauses=speculation.governor_pauses,
            governor_resumes=speculation.governor_resumes,
            profile=self.profile,
        )
