"""The engine: one worker thread owns MLX and serves requests as rows of a tick scheduler.

`Engine` puts three parts together and runs the thread: the model host loads the models and
builds each row's loop (host.py), the scheduler admits and ticks rows (scheduler.py), the
reporter logs events and counts metrics (reporter.py). HTTP handlers read `model` (fixed once
loaded) and `snapshot()` (a frozen copy), never the rows or the builder.

The thread is supervised: an exception in one row (building it, advancing it, reporting it)
fails that row alone with an error id that its 500 and the log line share. An exception outside
any row means the loop cannot go on: the engine turns FAILED, every waiting and running request
gets a 503, and `on_failure` lets the process exit so a supervisor restarts it.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future

from app.decoding.row_events import Failed
from app.engine.host import ModelHost, ModelInfo
from app.engine.reporter import Reporter
from app.engine.row import Job
from app.engine.scheduler import EngineState, Scheduler, UnavailableError, unavailable_message
from app.engine.snapshot import EngineSnapshot, copy_metrics, row_view
from app.events import engine as events
from app.execution.embedding import embeddings
from app.execution.streams import pooled_streams
from app.profiles.schema import Settings
from app.profiles.tenants import Tenants
from app.runtime.logging import new_error_id

__all__ = ["Engine", "EngineState", "UnavailableError", "unavailable_message"]


class Engine:
    def __init__(
        self,
        settings: Settings,
        on_failure: Callable[[BaseException], None] | None = None,
        on_ready: Callable[[Engine], None] | None = None,
        prepare_drafter: bool = False,
        tenants: Tenants | None = None,
        load_niceness: int = 0,
    ) -> None:
        self.settings = settings
        # the API keys, read once: the key file as it was when this engine was built (a reload
        # compares the next file's keys with these)
        self.tenants = Tenants.of(settings.server) if tenants is None else tenants
        # a reload's engine: load a block drafter and run its exactness probes before turning READY
        self.prepare_drafter = prepare_drafter
        # a router's load beside serving models: loaded on a thread of lower CPU priority (`niced`)
        self.load_niceness = load_niceness
        self.host = ModelHost(settings)
        self.plan = self.host.plan
        self.reporter = Reporter(settings.profile)
        self.scheduler = Scheduler(settings.server, self.host, self.reporter)
        self.on_failure = on_failure
        self.on_ready = on_ready
        self.failure: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="mlxcel-engine", daemon=True)

    # --- what other threads read and call --------------------------------------------------

    @property
    def state(self) -> EngineState:
        return self.scheduler.state

    @property
    def model(self) -> ModelInfo | None:
        return self.host.info

    def snapshot(self) -> EngineSnapshot:
        rows = dict(self.scheduler.rows)  # one atomic copy; the engine thread may change it next
        return EngineSnapshot(
            state=self.state,
            settings=self.settings,
            plan=self.plan,
            model=self.host.info,
            metrics=copy_metrics(self.reporter.metrics, self.host.prompt_cache_counters),
            rows=tuple(row_view(rows[slot]) for slot in sorted(rows)),
        )

    def submit(self, job: Job) -> None:
        self.scheduler.submit(job)

    def embed(self, prompts: list[list[int]], pooling: str) -> Future:
        """The target's embedding rows of each prompt (app/execution/embedding.py), computed on the
        engine thread a chunk at a time between ticks; cancelling the future stops it at the next chunk."""
        return self.scheduler.call(embeddings(self.host.target, prompts, pooling))

    @property
    def idle(self) -> bool:
        return self.scheduler.idle

    def drain(self) -> None:
        self.scheduler.drain()

    def abort(self, message: str) -> None:
        self.scheduler.abort(message)

    # --- lifecycle -------------------------------------------------------------------------

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        loading = self.state is EngineState.LOADING
        self.scheduler.stop()
        # A load is not cut short: joining a thread still loading (and warming) its models held a
        # signalled start's exit for its whole load, past a minute on loaded cores. Its thread is
        # a daemon, and it stops serving before it starts (`_serve` reads the stop).
        if self._thread.is_alive() and not loading:
            self._thread.join(timeout=30)
        self.scheduler.set_state(EngineState.STOPPED)

    def wait_ready(self, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while self.state is EngineState.LOADING and time.monotonic() < deadline:
            time.sleep(0.02)
        return self.state is EngineState.READY

    def _load(self) -> None:
        if self.load_niceness:
            niced(self._load_models, self.load_niceness)
        else:
            self._load_models()

    def _load_models(self) -> None:
        self.host.load()
        if self.prepare_drafter or self.host.warms:  # a warm-up's block rows would load the drafter anyway
            self.reporter.prepared(self.host.prepare())
        if self.host.warms:
            self.host.warm()

    # --- the worker thread -----------------------------------------------------------------

    def _run(self) -> None:
        with pooled_streams():  # this thread's MLX streams outlive it: the next engine takes them
            self._serve()

    def _serve(self) -> None:
        try:
            self._load()
        except BaseException as exc:
            self.failure = exc
            self.scheduler.set_state(EngineState.FAILED)
            if self.on_failure is not None:
                self.on_failure(exc)
            return
        if not self.scheduler.ready_unless_stopped():  # stopped while it loaded: it never serves, nor says so
            return
        if self.on_ready is not None:
            self.on_ready(self)
        try:
            self.scheduler.serve()
        except BaseException as exc:  # the loop itself broke: fail loudly, never live on dead
            self._die(exc)

    def _die(self, exc: BaseException) -> None:
        failure_id = new_error_id()
        events.engine_failed(error_id=failure_id, error_type=type(exc).__name__, exception=exc)
        self.failure = exc
        self.scheduler.set_state(EngineState.FAILED)
        self.scheduler.fail_all(
            Failed(f"the engine failed (id {failure_id}); the server is restarting", 503, "unavailable_error")
        )
        if self.on_failure is not None:
            self.on_failure(exc)


def niced(work: Callable[[], None], niceness: int) -> None:
    """`work` on a thread of its own whose CPU priority is lowered by `niceness` (Linux: a
    thread's own nice value), so that models serving beside a load keep the cores they need
    while it reads weights, probes and warms up. The thread ends with the work: the engine's own
    thread serves at the priority it started with (raising a nice value back needs privileges)."""
    failure: list[BaseException] = []

    def run() -> None:
        try:
            os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), niceness)
            with pooled_streams("loading"):  # their workers are niced too: never a serving engine's
                work()
        except BaseException as exc:  # raised again on the engine's thread, as a load's failure
            failure.append(exc)

    thread = threading.Thread(target=run, name="mlxcel-load", daemon=True)
    thread.start()
    thread.join()
    if failure:
        raise failure[0]
