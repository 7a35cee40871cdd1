"""The scheduler: the queue, its lock, admission, ticks and cancellation.

Each tick advances the active rows by one step each, all together, their forwards batched
(app/execution/steps.py `run_together`: every row's draft step j in one pass on the drafter, every row's target
forward in one tick of the target): a prefilling row feeds one chunk of its prompt, a decoding
row takes a decode step or a verify round, so prompts that arrive together are prefilled
together and time to first token does not grow with the queue of prompts. Each drafting row's width
is limited first by the tick's choice (app/decoding/goodput.py `Goodput`), an offer per row handed
to the row's step. Target-only rows pipeline:
each queues its next forward before its token is read.
Rows never share state (caches, samplers, key streams), so each row's output is exactly what
it would be alone. A tick forwards at most `max_batch_tokens` target positions (at least one
row); rows left over go first next tick, so none starves. Requests beyond `max_rows` wait in
the queue, admitted fairly across requests (app/engine/admission.py: one request's `n` rows
never hold the rows another request's first row needs); beyond `max_queue` they are refused.

Heavy work takes at most `heavy_work_share` of the engine's time while other rows decode
(app/engine/share.py): an embedding runs one chunk at a time between ticks, and grammar rows
whose last step's masks were costly (over COSTLY_MASK_S) get ticks of their own, only when the
share allows, with at most TICK_MASK_S of expected mask time each. Deferred, a row waits; its
output does not change.

The lock guards the queue and the rows table only and is never held while a loop is built or a
row advances: `submit` runs on the HTTP event loop, and a block drafter's first load (seconds)
must not keep it, or any route, waiting. Everything else runs on the engine thread (`serve`).
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Generator
from concurrent.futures import Future
from enum import StrEnum

from app.decoding.block_builder import DrafterUnavailableError
from app.decoding.goodput import Goodput
from app.decoding.row_events import Delta, Event, Failed, Started
from app.decoding.width import OWN_WIDTH, WidthOffer
from app.engine import admission
from app.engine.host import ModelHost
from app.engine.reporter import Reporter
from app.engine.row import Job, Row
from app.engine.share import HeavyShare
from app.engine.tick_plan import TickPlan
from app.events import engine as events
from app.execution.steps import run_together
from app.profiles.schema import ServerSettings
from app.runtime.bounds import RequestBoundError
from app.runtime.logging import internal_error_message, new_error_id
from app.sampling.grammar import GrammarError

IDLE_WAIT_S = 0.05
COSTLY_MASK_S = 0.001  # a step whose grammar masks took more CPU than this is heavy work (ordinary masks: microseconds)
TICK_MASK_S = 0.05  # the costly rows' expected mask time one tick may carry (at least one such row)


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


def unavailable_message(state: EngineState) -> str:
    """Why requests get 503 in this state (the health check and every route say the same)."""
    if state is EngineState.LOADING:
        return "Loading model"
    if state is EngineState.DRAINING:
        return "the server is shutting down"
    return f"the model is not available ({state})"


class Scheduler:
    def __init__(self, limits: ServerSettings, host: ModelHost, reporter: Reporter) -> None:
        self.limits = limits
        self.host = host
        self.reporter = reporter
        self.state = EngineState.LOADING
        self.rows: dict[int, Row] = {}
        self._queue: deque[Job] = deque()
        self._admitting: Job | None = None  # taken off the queue, its loop being built (outside the lock)
        self._wake = threading.Condition()
        self._stopping = False
        self._abort: str | None = None  # set by `abort`: fail every row and queued job with this
        self._deferred: list[int] = []  # slots of the rows the last tick's budget left out
        # work that needs the models but is no row (embeddings), a step at a time between ticks
        self._calls: deque[tuple[Generator[None, None, object], Future]] = deque()
        self.share = HeavyShare(limits.heavy_work_share)
        self.goodput = Goodput(
            host.forward_cost, host.host_cost, host.target_cost
        )  # each drafting row's width, per tick

    # --- called from other threads (HTTP, signal handlers): the lock only -------------------

    def submit(self, job: Job) -> None:
        with self._wake:
            if self.state is not EngineState.READY:
                raise UnavailableError(unavailable_message(self.state))
            if len(self._queue) >= self.limits.max_queue and self._running() >= self.limits.max_rows:
                raise QueueFullError(f"{len(self._queue)} requests are already waiting; try again later")
            self._queue.append(job)
            self._count()
            self._wake.notify()

    def call(self, work: Generator[None, None, object]) -> Future:
        """Run `work` on the engine thread, one step (up to its next `yield`) between two ticks;
        the future holds its return value or exception. The calls take turns, a step each, within
        the heavy-work share; one whose future is cancelled (its client left) stops at its next
        step. Beyond `max_queue` waiting calls, 503 as for requests."""
        future: Future = Future()
        with self._wake:
            if self.state is not EngineState.READY:
                raise UnavailableError(unavailable_message(self.state))
            if len(self._calls) >= self.limits.max_queue:
                raise QueueFullError(f"{len(self._calls)} embeddings are already waiting; try again later")
            self._calls.append((work, future))
            self._wake.notify()
        return future

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

    def stop(self) -> None:
        with self._wake:
            self._stopping = True
            self._wake.notify_all()

    def ready_unless_stopped(self) -> bool:
        """READY once the models loaded, unless a stop came meanwhile; whether it serves."""
        with self._wake:
            if self._stopping:
                return False
            self.state = EngineState.READY
            return True

    def set_state(self, state: EngineState) -> None:
        with self._wake:
            self.state = state

    @property
    def idle(self) -> bool:
        """No request is queued, being admitted or running (`abort`'s failures delivered).

        Read under the lock: a job moves from the queue to `_admitting` inside it, and a reload
        stops a replaced engine once it reads idle, which must never strand that job."""
        with self._wake:
            return (
                not self.rows
                and not self._queue
                and not self._calls
                and self._admitting is None
                and self._abort is None
            )

    # --- the engine thread -----------------------------------------------------------------

    def serve(self) -> None:
        while not self._stopping:
            if self._abort is not None:
                self.fail_all(Failed(self._abort, 503, "unavailable_error"))
                self._abort = None
            self._run_calls()
            self._admit()
            if not self.rows:
                with self._wake:
                    if not self._queue and not self._calls and not self._stopping and self._abort is None:
                        self._wake.wait(IDLE_WAIT_S)
                continue
            self._tick()
        with self._wake:  # stopped: a call left waiting is answered, never stranded
            left = list(self._calls)
            self._calls.clear()
        for _, future in left:
            _refuse(future, unavailable_message(EngineState.DRAINING))

    def _run_calls(self) -> None:
        """A step of the call whose turn it is, if the heavy-work share allows one now; it goes
        to the back of the queue unless it ended. A future stays pending until its call ends, so
        its caller may still cancel it."""
        if self.rows and not self.share.free:
            return
        busy = bool(self.rows)
        with self._wake:
            if not self._calls:
                return
            work, future = self._calls.popleft()
        if future.cancelled():
            work.close()
            return
        started = time.perf_counter()
        try:
            next(work)
        except StopIteration as done:
            if future.set_running_or_notify_cancel():
                future.set_result(done.value)
            return
        except Exception as exc:  # the caller's failure, answered to it alone
            if future.set_running_or_notify_cancel():
                future.set_exception(exc)
            return
        finally:
            if busy:  # beside decoding rows: they are owed their share
                self.share.spent(time.perf_counter() - started)
        with self._wake:
            self._calls.append((work, future))

    def fail_all(self, event: Failed) -> None:
        with self._wake:
            for _, future in self._calls:
                _refuse(future, event.message)
            self._calls.clear()
            jobs = [row.job for row in self.rows.values()] + list(self._queue)
            if self._admitting is not None:  # the engine broke while building its loop
                jobs.append(self._admitting)
            self.rows.clear()
            self._queue.clear()
            self._admitting = None
            self._count()
        for job in jobs:
            try:
                job.sink(event)
            except BaseException as exc:  # one broken sink must not keep the others waiting
                events.sink_failed(request_id=job.request_id, exception=exc)

    def _running(self) -> int:
        return len(self.rows) + (self._admitting is not None)

    def _count(self) -> None:
        self.reporter.occupancy(waiting=len(self._queue), running=self._running())

    def _admit(self) -> None:
        while (job := self._next_job()) is not None:
            slot = next(i for i in range(self.limits.max_rows) if i not in self.rows)
            row = self._build(job, slot)  # outside the lock: this may take seconds
            with self._wake:
                self._admitting = None
                if row is not None:
                    self.rows[slot] = row
                self._count()

    def _next_job(self) -> Job | None:
        """The next queued job still wanted, if a row is free for it (marked as being admitted);
        fair across requests (app/engine/admission.py)."""
        with self._wake:
            for job in [job for job in self._queue if job.cancelled]:  # their clients left while they waited
                self._queue.remove(job)
                self.reporter.cancelled(job, decided=0)
            index = admission.next_index(self._queue, [row.job for row in self.rows.values()], self.limits.max_rows)
            if index is None:
                self._count()
                return None
            job = self._queue[index]
            del self._queue[index]
            self._admitting = job
            self._count()
            return job

    def _build(self, job: Job, slot: int) -> Row | None:
        job.admitted = time.perf_counter()
        try:
            generation = self.host.build(job.request)
            self.reporter.noted(job, generation)
        except DrafterUnavailableError as exc:
            self.reporter.drafter_unavailable(job, str(exc))
            self._deliver(job, Failed(str(exc), 503, "unavailable_error"))
            return None
        except Exception as exc:
            self._fail_row(job, exc, "admit")
            return None
        row = Row(job, generation, slot)
        if job.stream:  # its response headers wait for the rule (non-streamed: Finished.rule)
            self._deliver(job, Started(generation.speculation.rule_name))
        self._report_progress(row)  # the prefill starts: as llama-server, a first frame at the cached tokens
        return row

    def _fail_row(self, job: Job, exc: Exception, stage: str) -> None:
        """One row's failure. A row that reached its request's bound, or whose grammar's mask went
        over llguidance's fuel or the CPU budget, failed by the request's doing: a 400 naming the
        limit, logged without the grammar. Any other is an internal error, logged with its
        traceback under an id the client also gets."""
        if isinstance(exc, RequestBoundError):
            self.reporter.bound_reached(job, str(exc))
        elif isinstance(exc, GrammarError):
            events.row_grammar_failed(request_id=job.request_id, stage=stage, reason=str(exc))
        if isinstance(exc, RequestBoundError | GrammarError):
            self._deliver(job, Failed(str(exc), 400, "invalid_request_error"))
            return
        failure_id = new_error_id()
        events.row_failed(
            request_id=job.request_id, stage=stage, error_id=failure_id, error_type=type(exc).__name__, exception=exc
        )
        self._deliver(job, Failed(internal_error_message(failure_id, exc)))

    def _deliver(self, job: Job, event: Event) -> None:
        """Hand an event to the job's sink; a sink that fails cancels its own job only."""
        try:
            job.sink(event)
        except Exception as exc:
            events.sink_failed(request_id=job.request_id, exception=exc)
            job.cancelled = True

    def _tick(self) -> None:
        """Every chosen row's prefill chunk or step, their forwards batched: one tick of the
        target serves every row's (a prompt's chunk beside the other rows' steps). The tick is
        planned first (`TickPlan`), run (`run_together`: a `TickResult`), then settled."""
        self._sweep_cancelled()
        plan = self._plan()
        masks_before = [row.generation.mask_seconds for row in plan.rows]
        started = time.perf_counter()
        result = run_together(plan.steps())
        if plan.priced:
            self.reporter.timed(list(plan.rows), result.clock, self.goodput.measured(result.seconds))
        for row, outcome in zip(plan.rows, result.outcomes, strict=True):
            self._settle(row, outcome)
        if plan.heavy:  # costly rows' own tick, while cheap rows waited: they are owed their share
            self.share.spent(time.perf_counter() - started)
        for row, before in zip(plan.rows, masks_before, strict=True):
            row.mask_cost = row.generation.mask_seconds - before

    def _plan(self) -> TickPlan:
        """This tick's rows (`_this_tick`) and each decoding drafting row's width offer."""
        rows, heavy = self._this_tick()
        decoding = [row for row in rows if row.generation.prefilled]  # before this tick's prefills end
        offers = self._weigh_widths(decoding) if decoding else {}
        return TickPlan(
            rows=tuple(rows),
            offers=tuple(offers.get(row.slot, OWN_WIDTH) for row in rows),
            budget=self.limits.max_batch_tokens,
            heavy=heavy,
            priced=len(decoding) == len(rows),  # the choice priced decoding rows alone: a prompt's chunk is none of it
        )

    def _weigh_widths(self, decoding: list[Row]) -> dict[int, WidthOffer]:
        """The tick's choice of each drafting row's width (app/decoding/goodput.py), by slot: each
        offer goes to its row's step; logged per row when the width it holds the row at moves."""
        drafting = [row for row in decoding if row.generation.widths is not None]
        if not drafting:
            return {}
        policies = [row.generation.widths for row in drafting]
        choice = self.goodput.choose(policies, positions=len(decoding) - len(policies))
        for index, change in choice.changes.items():
            self.reporter.width_changed(drafting[index].job, change)
        return {row.slot: offer for row, offer in zip(drafting, choice.offers, strict=True)}

    def _sweep_cancelled(self) -> None:
        for row in [row for row in self.rows.values() if row.job.cancelled]:
            self._retire(row)
            self.reporter.cancelled(row.job, decided=len(row.generation.emitted))

    def _this_tick(self) -> tuple[list[Row], bool]:
        """The rows whose positions fit this tick's budget: last tick's leftovers first, then the
        rest in the order they joined; one that does not fit is left for the next tick's front.

        Rows whose last step's masks were costly never share a tick with the others (rows without
        a grammar, or with cheap masks): beside those they get a tick of their own only when the
        heavy-work share is free, and with at most TICK_MASK_S of expected mask time (one such row
        at least). Also whether this is such a heavy tick (others waited through it)."""
        leftover = [self.rows[slot] for slot in self._deferred if slot in self.rows]
        order = leftover + [row for row in self.rows.values() if row not in leftover]
        cheap = [row for row in order if row.mask_cost <= COSTLY_MASK_S]
        costly = [row for row in order if row.mask_cost > COSTLY_MASK_S]
        heavy = bool(costly) and (not cheap or self.share.free)
        candidates = costly if heavy else cheap
        chosen: list[Row] = []
        deferred = [row.slot for row in (cheap if heavy else costly)]
        room, masks = self.limits.max_batch_tokens, TICK_MASK_S
        for row in candidates:
            positions = row.generation.positions()
            if chosen and (positions > room or (heavy and row.mask_cost > masks)):
                deferred.append(row.slot)
                continue
            chosen.append(row)
            room -= positions
            masks -= row.mask_cost
        self._deferred = deferred
        return chosen, heavy and bool(cheap)

    def _settle(self, row: Row, outcome: Delta | Exception) -> None:
        """Deliver a row's step (its last delta and result once it has finished) or its failure."""
        job = row.job
        try:
            if isinstance(outcome, Exception):
                raise outcome
            self._emit(row, outcome)
        except Exception as exc:  # a failing row must not take the server down
            self._retire(row)
            self._fail_row(job, exc, "tick")

    def _report_progress(self, row: Row) -> None:
        if row.job.progress and (progress := row.progress()) is not None:
            self._deliver(row.job, progress)

    def _emit(self, row: Row, delta: Delta) -> None:
        job = row.job
        streamed = job.stream and (delta.text or delta.tokens)
        self._report_progress(row)  # a prefill chunk went in: before the first token it may bring
        self.reporter.noted(job, row.generation)
        if row.generation.finished:
            self._retire(row)
            result = row.finished()
            self.reporter.finished(row, result)
            if streamed:
                self._deliver(job, delta)
            self._deliver(job, result)
        elif streamed:
            self._deliver(job, delta)

    def _retire(self, row: Row) -> None:
        with self._wake:
            self.rows.pop(row.slot, None)
            self._count()


def _refuse(future: Future, message: str) -> None:
    """End a waiting call's future with UnavailableError, unless its caller cancelled it."""
    if future.set_running_or_notify_cancel():
        future.set_exception(UnavailableError(message))
