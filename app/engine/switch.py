"""The engine new requests go to, and the engines a reload replaced, until their requests end.

A request holds the engine that was current when it began (`hold`) for as long as its handler
runs, and submits its rows to that one: a reload swapping engines meanwhile never sends half a
request to each, nor refuses a row the old engine would have taken. A replaced engine is
stopped once no request holds it and no row runs on it (`release_finished`).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from app.engine.engine import Engine, EngineState


class EngineSwitch:
    def __init__(self, engine: Engine) -> None:
        self.current = engine
        self.on_swap: list[Callable[[Engine], None]] = []  # told of each new current engine
        self._retired: list[Engine] = []
        self._held: dict[Engine, int] = {}  # engine -> requests holding it
        self._lock = threading.Lock()
        self._releasing = threading.Lock()

    @property
    def engines(self) -> list[Engine]:
        """The current engine, then the replaced ones still finishing requests."""
        with self._lock:
            return list(dict.fromkeys([self.current, *self._retired]))  # a retired switch's current is both

    @property
    def retiring(self) -> bool:
        """Some replaced engine is not stopped yet."""
        with self._lock:
            return bool(self._retired)

    @contextmanager
    def hold(self) -> Iterator[Engine]:
        """The current engine, kept from release until the block ends."""
        with self._lock:
            engine = self.current
            self._held[engine] = self._held.get(engine, 0) + 1
        try:
            yield engine
        finally:
            with self._lock:
                self._held[engine] -= 1
                if not self._held[engine]:
                    del self._held[engine]

    def swap(self, engine: Engine) -> Engine:
        """Send new requests to `engine`; the replaced one (returned) finishes what it holds."""
        with self._lock:
            replaced, self.current = self.current, engine
            self._retired.append(replaced)
        for listener in self.on_swap:
            listener(engine)
        return replaced

    def retire(self) -> None:
        """Send no more requests here (the router unloads this model): the current engine joins the
        replaced ones, stopped once no request holds it and no row runs on it."""
        with self._lock:
            self._retired.append(self.current)

    def release_finished(self) -> list[Engine]:
        """Stop the replaced engines no request holds and no row runs on; those stopped."""
        with self._releasing:  # a caller returns once the engines another caller is stopping have stopped too
            with self._lock:
                finished = [e for e in self._retired if e not in self._held and e.idle]
                self._retired = [e for e in self._retired if e not in finished]
            for engine in finished:
                engine.stop()
        return finished

    # --- the whole server: startup, shutdown and its drain ----------------------------------

    def start(self) -> None:
        self.current.start()

    def stop(self) -> None:
        for engine in self.engines:
            engine.stop()

    def drain(self) -> None:
        for engine in self.engines:
            engine.drain()

    def abort(self, message: str) -> None:
        for engine in self.engines:
            engine.abort(message)

    @property
    def drain_timeout_s(self) -> float:
        return self.current.settings.server.drain_timeout_s

    @property
    def draining(self) -> bool:
        """A SIGTERM's drain is still waiting on rows (the engine drains, and some row runs)."""
        return self.current.state is EngineState.DRAINING and not self.idle

    @property
    def idle(self) -> bool:
        return all(engine.idle for engine in self.engines)

    @property
    def running_rows(self) -> int:
        return sum(len(engine.snapshot().rows) for engine in self.engines)
