"""The engine: one worker thread owns MLX and serves requests as rows of a tick scheduler.

Each tick advances every active row by one step (a prefill, a decode step, or one verify
round), so concurrent streams interleave fairly and a long request cannot starve a short one.
Rows never share state (caches, samplers, key streams), so each row's output is exactly what
it would be alone. Requests beyond `max_rows` wait in a queue; beyond `max_queue` they are
refused. The step boundary is per row, which is where batched forwards would slot in.
"""

from __future__ import annotations

import os
import threading
import time
from collections import deque
from collections.abc import Callable
from enum import StrEnum
from functools import cached_property

import structlog

from app import events
from app.acceptance import Rule, select_rule, stochastic_requested
from app.decoding.block_builder import DrafterUnavailableError
from app.decoding.builder import LoopBuilder, LoopSpec
from app.drafters.block import declared_widths
from app.drafters.governor import Governor
from app.engine.metrics import Metrics
from app.engine.row import Failed, Job, Row
from app.loading import Checkpoint, CheckpointKind, LoadedModel, load_model, read_checkpoint
from app.profiles.schema import Settings
from app.sampling import SamplingParams

IDLE_WAIT_S = 0.05


class EngineState(StrEnum):
    LOADING = "loading"
    READY = "ready"
    FAILED = "failed"
    STOPPED = "stopped"


class QueueFullError(Exception):
    """More requests are waiting than the server accepts."""


class Engine:
    def __init__(
        self,
        settings: Settings,
        on_failure: Callable[[BaseException], None] | None = None,
        on_ready: Callable[[Engine], None] | None = None,
    ) -> None:
        self.settings = settings
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

    def wait_ready(self, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while self.state is EngineState.LOADING and time.monotonic() < deadline:
            time.sleep(0.02)
        return self.state is EngineState.READY

    @property
    def target(self) -> LoadedModel:
        assert self.builder is not None
        return self.builder.target

    @cached_property
    def block_checkpoint(self) -> Checkpoint | None:
        """The MTP or DFlash-family drafter's checkpoint (read without loading the weights)."""
        if self.settings.drafter.kind not in ("mtp", "dflash"):
            return None
        return read_checkpoint(self.settings.drafter.model)

    def block_widths(self) -> tuple[int, int]:
        """(declared, widest) verify width of the block drafter, a profile's block_size winning."""
        checkpoint = self.block_checkpoint
        declared, widest = declared_widths(checkpoint.kind, checkpoint.config)
        declared = self.settings.drafter.block_size or declared
        adaptive = self.settings.adaptive
        return declared, max(declared, min(widest, adaptive.max_width)) if adaptive.enabled else declared

    def rule_at(self, sampling: SamplingParams) -> Rule | None:
        """The rule a request with this sampler gets (None when no drafter runs)."""
        kind = self.settings.drafter.kind
        if kind == "none":
            return None
        if kind in ("mtp", "dflash"):
            greedy_only = self.block_checkpoint.kind is CheckpointKind.DSPARK
            return None if greedy_only and not sampling.is_greedy else Rule.ARGMAX_AGAINST_ARGMAX
        one_hot = kind == "prompt-lookup"
        return select_rule(
            sampling, stochastic=stochastic_requested(), reports_distribution=True, one_hot_proposals=one_hot
        )

    def _load(self) -> None:
        settings = self.settings
        os.environ.update(settings.env)  # acceptance-rule overrides, before the loop is built
        started = time.perf_counter()
        target = load_model(settings.target)
        drafter = None
        if settings.drafter.kind == "draft-model":
            drafter = load_model(settings.drafter.model, role="drafter")
        spec = LoopSpec(
            drafter_kind=settings.drafter.kind,
            num_draft_tokens=7 if settings.drafter.kind == "prompt-lookup" else settings.drafter.num_draft_tokens,
            governor_policy=settings.governor.policy,
            governor_adaptive=settings.governor.adaptive,
            governor_floor=settings.governor.floor,
            drafter_model=settings.drafter.model,  # block drafters load on first use
            adaptive_enabled=settings.adaptive.enabled,
            adaptive_max_width=settings.adaptive.max_width,
            block_size=settings.drafter.block_size,
        )
        self.builder = LoopBuilder(target, drafter, spec)
        self._log.info("models_loaded", target=str(target.path), seconds=round(time.perf_counter() - started, 3))

    # --- requests --------------------------------------------------------------------------

    def submit(self, job: Job) -> None:
        with self._wake:
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
        while not self._stopping:
            self._admit()
            if not self.rows:
                with self._wake:
                    if not self._queue and not self._stopping:
                        self._wake.wait(IDLE_WAIT_S)
                continue
            for slot in list(self.rows):
                self._tick(self.rows[slot])

    def _admit(self) -> None:
        with self._wake:
            while self._queue and len(self.rows) < self.settings.server.max_rows:
                job = self._queue.popleft()
                slot = next(i for i in range(self.settings.server.max_rows) if i not in self.rows)
                try:
                    generation = self.builder.build(job.request, self._governor_listener(job))
                except DrafterUnavailableError as exc:
                    self._log.warning("drafter_unavailable", request_id=job.request_id, reason=str(exc))
                    job.sink(Failed(str(exc), 503, "unavailable_error"))
                    continue
                except (ValueError, RuntimeError) as exc:
                    job.sink(Failed(str(exc), 400, "invalid_request_error"))
                    continue
                for note in generation.notes:
                    events.loop_note(note.event, request_id=job.request_id, **note.fields)
                row = Row(job, generation, slot)
                row.excluded_s = generation.excluded_s
                self.rows[slot] = row
            self.metrics.requests_deferred = len(self._queue)
            self.metrics.requests_processing = len(self.rows)

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
            update = row.advance()
        except Exception as exc:  # a failing row must not take the server down
            self._log.exception("row_failed", request_id=job.request_id)
            self._retire(row)
            job.sink(Failed(f"generation failed: {exc}"))
            return
        if row.generation.finished:
            self._retire(row)
            result = row.finished()
            self.metrics.observe(result, row.generation.loop.stats)
            self._report(row)
            if job.stream and (update.text or update.tokens):
                job.sink(update)
            job.sink(result)
        elif job.stream and (update.text or update.tokens):
            job.sink(update)

    def _retire(self, row: Row) -> None:
        self.rows.pop(row.slot, None)
        self.metrics.requests_processing = len(self.rows)

    def _report(self, row: Row) -> None:
        loop = row.generation.loop
        if loop.stats is None or loop.stats.rounds == 0 or loop.rule is None:
            return
        governor = getattr(loop.drafter, "governor", None)
        events.speculative_request(
            request_id=row.job.request_id,
            route=row.job.route,
            rule=str(loop.rule),
            draft_kind=str(loop.draft_kind),
            stats=loop.stats,
            predicted_n=len(row.generation.emitted),
            biased=not loop.rule.lossless and not row.generation.state.sampler.is_greedy,
            governor_pauses=governor.pauses if governor else 0,
            governor_resumes=governor.resumes if governor else 0,
            profile=self.settings.profile,
        )
