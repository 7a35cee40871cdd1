"""The engine: one worker thread owns MLX and serves requests as rows of a tick scheduler.

Each tick advances every active row by one step (a prefill, a decode step, or one verify
round), so concurrent streams interleave fairly and a long request cannot starve a short one.
Rows never share state (caches, samplers, key streams), so each row's output is exactly what
it would be alone. Requests beyond `max_rows` wait in a queue; beyond `max_queue` they are
refused. The step boundary is per row, which is where batched forwards would slot in.

The thread is supervised: an exception in one row (building it, advancing it, reporting it)
fails that row alone with an error id that its 500 and the log line share. An exception outside
any row means the loop cannot go on: the engine turns FAILED, every waiting and running request
gets a 503, and `on_failure` lets the process exit so a supervisor restarts it.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable
from enum import StrEnum

import structlog

from app import events
from app.decoding.block_builder import DrafterUnavailableError
from app.decoding.builder import LoopBuilder
from app.decoding.plan import LoopPlan, plan_from_settings
from app.drafters.governor import Governor
from app.engine.metrics import Metrics
from app.engine.row import Failed, Finished, Job, Row, Update
from app.loading import LoadedModel, load_model
from app.profiles.schema import Settings
from app.runtime.logging import internal_error_message, log_internal_error

IDLE_WAIT_S = 0.05


class EngineState(StrEnum):
    LOADING = "loading"
    READY = "ready"
    DRAINING = "draining"  # shutting down: running rows may finish, new requests are refused
    FAILED = "failed"
    STOPPED = "stopped"


class UnavailableError(Exception):
    """The engine takes no new request now (its message says why)."""


class QueueFullError(UnavailableError):
    """More requests are waiting than the server accepts."""


class Engine:
    def __init__(
        self,
        settings: Settings,
        on_failure: Callable[[BaseException], None] | None = None,
        on_ready: Callable[[Engine], None] | None = None,
    ) -> None:
        self.settings = settings
        self.plan: LoopPlan = plan_from_settings(settings)  # decided once: the rules, widths and switches
        self.on_failure = on_failure
        self.on_ready = on_ready
        self.state = EngineState.LOADING
        self.failure: BaseException | None = None
        self.builder: LoopBuilder | None = None
        self.metrics = Metrics()
        self.rows: dict[int, Row] = {}
        self._queue: deque[Job] = deque()
        self._wake = threading.Condition()
        self._thread = threading.Thread(target=self._run, name="mlxcel-engine", daemon=True)
        self._stopping = False
        self._abort: str | None = None  # set by `abort`: fail every row and queued job with this
        self._log = structlog.get_logger("mlxcel.engine")

    # --- lifecycle -------------------------------------------------------------------------

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        with self._wake:
            self._stopping = True
            self._wake.notify_all()
        if self._thread.is_alive():
            self._thread.join(timeout=30)
        self.state = EngineState.STOPPED

    def drain(self) -> None:
        """Refuse new requests from now on; the running and queued ones go on."""
        with self._wake:
            if self.state is EngineState.READY:
                self.state = EngineState.DRAINING

    def abort(self, message: str) -> None:
        """End every running and queued request with a 503 carrying `message` (drain timed out)."""
        with self._wake:
            self._abort = message
            self._wake.notify_all()

    @property
    def idle(self) -> bool:
        """No request is queued or running (`abort`'s failures delivered)."""
        return not self.rows and not self._queue and self._abort is None

    def wait_ready(self, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while self.state is EngineState.LOADING and time.monotonic() < deadline:
            time.sleep(0.02)
        return self.state is EngineState.READY

    @property
    def target(self) -> LoadedModel:
        assert self.builder is not None
        return self.builder.target

    def _load(self) -> None:
        settings = self.settings
        started = time.perf_counter()
        target = load_model(settings.target)
        drafter = None
        if settings.drafter.kind == "draft-model":
            drafter = load_model(settings.drafter.model, role="drafter")
        self.builder = LoopBuilder(target, drafter, self.plan)
        self._log.info("models_loaded", target=str(target.path), seconds=round(time.perf_counter() - started, 3))

    # --- requests --------------------------------------------------------------------------

    def submit(self, job: Job) -> None:
        with self._wake:
            if self.state is not EngineState.READY:
                raise UnavailableError(unavailable_message(self.state))
            if len(self._queue) >= self.settings.server.max_queue and len(self.rows) >= self.settings.server.max_rows:
                raise QueueFullError(f"{len(self._queue)} requests are already waiting; try again later")
            self._queue.append(job)
            self.metrics.requests_deferred = len(self._queue)
            self._wake.notify()

    # --- the worker thread -----------------------------------------------------------------

    def _run(self) -> None:
        try:
            self._load()
        except BaseException as exc:
            self.failure, self.state = exc, EngineState.FAILED
            if self.on_failure is not None:
                self.on_failure(exc)
            return
        self.state = EngineState.READY
        if self.on_ready is not None:
            self.on_ready(self)
        try:
            self._serve()
        except BaseException as exc:  # the loop itself broke: fail loudly, never live on dead
            self._die(exc)

    def _serve(self) -> None:
        while not self._stopping:
            if self._abort is not None:
                self._fail_all(Failed(self._abort, 503, "unavailable_error"))
                self._abort = None
            self._admit()
            if not self.rows:
                with self._wake:
                    if not self._queue and not self._stopping and self._abort is None:
                        self._wake.wait(IDLE_WAIT_S)
                continue
            for slot in list(self.rows):
                self._tick(self.rows[slot])

    def _die(self, exc: BaseException) -> None:
        failure_id = log_internal_error(self._log, "engine_failed", exc)
        with self._wake:
            self.failure, self.state = exc, EngineState.FAILED
        self._fail_all(
            Failed(f"the engine failed (id {failure_id}); the server is restarting", 503, "unavailable_error")
        )
        if self.on_failure is not None:
            self.on_failure(exc)

    def _fail_all(self, event: Failed) -> None:
        with self._wake:
            jobs = [row.job for row in self.rows.values()] + list(self._queue)
            self.rows.clear()
            self._queue.clear()
            self.metrics.requests_processing = self.metrics.requests_deferred = 0
        for job in jobs:
            try:
                job.sink(event)
            except BaseException:  # one broken sink must not keep the others waiting
                self._log.exception("sink_failed", request_id=job.request_id)

    def _admit(self) -> None:
        with self._wake:
            while self._queue and len(self.rows) < self.settings.server.max_rows:
                job = self._queue.popleft()
                if job.cancelled:  # its client left while it waited
                    self._log.info("request_cancelled", request_id=job.request_id, decided=0)
                    continue
                slot = next(i for i in range(self.settings.server.max_rows) if i not in self.rows)
                try:
                    generation = self.builder.build(job.request, self._governor_listener(job))
                    for note in generation.notes:
                        events.loop_note(note.event, request_id=job.request_id, **note.fields)
                except DrafterUnavailableError as exc:
                    self._log.warning("drafter_unavailable", request_id=job.request_id, reason=str(exc))
                    self._deliver(job, Failed(str(exc), 503, "unavailable_error"))
                    continue
                except Exception as exc:
                    self._fail_row(job, exc, "admit")
                    continue
                row = Row(job, generation, slot)
                row.excluded_s = generation.excluded_s
                self.rows[slot] = row
            self.metrics.requests_deferred = len(self._queue)
            self.metrics.requests_processing = len(self.rows)

    def _fail_row(self, job: Job, exc: Exception, stage: str) -> None:
        """One row's internal error: logged with its traceback under an id the client also gets."""
        failure_id = log_internal_error(self._log, "row_failed", exc, request_id=job.request_id, stage=stage)
        self._deliver(job, Failed(internal_error_message(failure_id, exc)))

    def _deliver(self, job: Job, event: Update | Finished | Failed) -> None:
        """Hand an event to the job's sink; a sink that fails cancels its own job only."""
        try:
            job.sink(event)
        except Exception:
            self._log.exception("sink_failed", request_id=job.request_id)
            job.cancelled = True

    def _governor_listener(self, job: Job) -> Callable[[str, Governor], None]:
        def listener(event: str, governor: Governor) -> None:
            row = next((r for r in self.rows.values() if r.job is job), None)
            decided = len(row.generation.emitted) if row is not None else 0
            floor = getattr(governor, "floor", None)
            events.governor_changed(event, request_id=job.request_id, decided=decided, ema=governor.ema, floor=floor)

        return listener

    def _tick(self, row: Row) -> None:
        job = row.job
        if job.cancelled:
            self._retire(row)
            self._log.info("request_cancelled", request_id=job.request_id, decided=len(row.generation.emitted))
            return
        try:
            self._advance(row)
        except Exception as exc:  # a failing row must not take the server down
            self._retire(row)
            self._fail_row(job, exc, "tick")

    def _advance(self, row: Row) -> None:
        job = row.job
        update = row.advance()
        if row.generation.finished:
            self._retire(row)
            result = row.finished()
            self.metrics.observe(result, row.generation.loop.speculation.stats)
            self._report(row)
            if job.stream and (update.text or update.tokens):
                self._deliver(job, update)
            self._deliver(job, result)
        elif job.stream and (update.text or update.tokens):
            self._deliver(job, update)

    def _retire(self, row: Row) -> None:
        self.rows.pop(row.slot, None)
        self.metrics.requests_processing = len(self.rows)

    def _report(self, row: Row) -> None:
        speculation = row.generation.loop.speculation
        if not speculation.ran:
            return
        events.speculative_request(
            request_id=row.job.request_id,
            route=row.job.route,
            rule=str(speculation.rule),
            draft_kind=str(speculation.draft_kind),
            stats=speculation.stats,
            predicted_n=len(row.generation.emitted),
            biased=not speculation.rule.lossless and not row.generation.state.sampler.is_greedy,
            governor_pauses=speculation.governor_pauses,
            governor_resumes=speculation.governor_resumes,
            profile=self.settings.profile,
        )


def unavailable_message(state: EngineState) -> str:
    """Why requests get 503 in this state (the health check and every route say the same)."""
    if state is EngineState.LOADING:
        return "Loading model"
    if state is EngineState.DRAINING:
        return "the server is shutting down"
    return f"the model is not available ({state})"
