"""Many profiles behind one server: which engine a request's `model` reaches, and which models are loaded.

Each routed profile (app/profiles/routing.py) is a `Route` holding, while loaded, one EngineSwitch:
its engine, and those its reload replaced until their requests end. A model loads on first use: its
engine is built and started, and loads its models on its own thread while the others serve. The
memory budget counts the weights on disk (target and drafter) of the models loaded or loading; a
load that would pass it first unloads the least recently used models that no request holds, and a
model no request used for `idle_unload_s` is unloaded too. An unloaded model's engine is retired as
a reload retires one: it finishes its rows, then stops (`release_retired`); a later request loads it
again. A model in use is never unloaded, so a load may pass the budget while every other is busy.
"""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from enum import StrEnum
from pathlib import Path

from app.engine.engine import Engine, EngineState
from app.engine.reload import Reloader, ReloadRefusedError, release_retired
from app.engine.switch import EngineSwitch
from app.events import router as events
from app.execution.device import backend
from app.profiles.routing import RoutedProfile
from app.profiles.schema import Settings
from app.profiles.tenants import Tenants

LOAD_NICENESS = 10  # how much lower a load's thread runs than the serving engines' (nice values)
IDLE_CHECK_S = 1.0  # how often idle models are looked for (at most; a shorter idle_unload_s looks more often)


class Status(StrEnum):
    """A model's state as llama-server's router lists it (`status.value`)."""

    LOADED = "loaded"
    LOADING = "loading"
    UNLOADED = "unloaded"


class ClosedError(Exception):
    """The server drains: no model loads any more."""


def weights_bytes(settings: Settings) -> int:
    """Bytes on disk of the profile's target and draft model weights: what loading it costs, about."""
    directories = [settings.target.model, *([settings.drafter.model] if settings.drafter.model else [])]
    return sum(f.stat().st_size for d in directories for f in Path(d).glob("*.safetensors"))


class Route:
    """One routed profile: its settings (the last its reload read), and its engines while loaded."""

    def __init__(self, profile: RoutedProfile) -> None:
        self.profile = profile
        self.name = profile.name
        self.settings = profile.settings
        self.weights = weights_bytes(profile.settings)
        self.switch: EngineSwitch | None = None
        self.reloader: Reloader | None = None
        self.holders = 0  # requests holding its engine now
        self.last_used = 0.0  # time.monotonic() of its last hold's start or end

    @property
    def serving(self) -> Engine | None:
        """Its current engine while that serves (READY); None unloaded, loading or failed."""
        switch = self.switch  # read once: an unload may clear it meanwhile
        return switch.current if switch is not None and switch.current.state is EngineState.READY else None

    @property
    def status(self) -> Status:
        if self.switch is None:
            return Status.UNLOADED
        return Status.LOADING if self.switch.current.state is EngineState.LOADING else Status.LOADED


class Router:
    def __init__(
        self,
        profiles: list[RoutedProfile],
        settings: Settings,
        tenants: Tenants,
        on_failure: Callable[[BaseException], None] | None = None,
    ) -> None:
        self.settings = settings  # the router profile's: the listener, keys and limits of the whole server
        self.tenants = tenants
        self.on_failure = on_failure  # told when a loaded model's engine dies (the server then exits)
        self.routes = [Route(profile) for profile in profiles]
        self._names = {name: route for route in self.routes for name in (route.name, *route.profile.aliases)}
        self.budget = settings.router.memory_budget_mb << 20
        self.idle_unload_s = settings.router.idle_unload_s
        self.load_wait_s = settings.router.load_wait_s
        # On the CPU a load's forwards (its tool probe, its warm-up) take cores from the models
        # serving beside it; its thread yields to theirs (Linux). A GPU's work is queued on the device.
        self.niceness = LOAD_NICENESS if sys.platform == "linux" and not backend().gpu else 0
        self._lock = threading.Lock()
        self._retiring: list[EngineSwitch] = []  # unloaded models' switches still finishing their rows
        self._stopped = threading.Event()
        self._draining = False

    @property
    def names(self) -> list[str]:
        return [route.name for route in self.routes]

    def find(self, model: str | None) -> Route | None:
        """The route a request's `model` names (by name or alias); the first for none; None if unknown."""
        if not model:
            return self.routes[0]
        # Ollama's clients name a model with its default tag
        return self._names.get(model) or self._names.get(model.removesuffix(":latest"))

    # --- what requests do --------------------------------------------------------------------

    @contextmanager
    def hold(self, route: Route) -> Iterator[Engine]:
        """The route's current engine, kept from unload and release until the block ends. An
        unloaded model starts loading (its engine loads on its own thread: its state is LOADING
        until it serves), a failed load is tried again; held, a loading model is never unloaded."""
        with self._lock:
            if self._draining:
                raise ClosedError("the server is draining")
            if route.switch is not None and route.switch.current.state is EngineState.FAILED:
                self._unload(route, "failed")
            if route.switch is None:
                self._load(route)
            switch = route.switch
            assert switch is not None
            route.holders += 1  # counted under the lock: an unload never picks a held model
            route.last_used = time.monotonic()
        try:
            with switch.hold() as engine:
                yield engine
        finally:
            with self._lock:
                route.holders -= 1
                route.last_used = time.monotonic()

    def reload(self, route: Route, trigger: str) -> Engine:
        """Reload one loaded model's profile: its engine alone is swapped (ReloadRefusedError if
        refused, or if it is not loaded: it loads its profile as read at startup or its last reload)."""
        reloader = route.reloader
        if reloader is None:
            raise ReloadRefusedError(f"model {route.name!r} is not loaded; nothing to reload")
        return reloader.reload(trigger)

    def reload_in_background(self, trigger: str) -> None:
        """SIGHUP: every loaded model's profile reloads (each its own engine, refused or not alone)."""
        for route in self.routes:
            if route.reloader is not None:
                route.reloader.reload_in_background(trigger)

    # --- loading and unloading (under the lock) -----------------------------------------------

    def _load(self, route: Route) -> None:
        self._fit(route)
        events.router_model_loading(
            model=route.name, profile=route.settings.profile, weights_mb=route.weights / (1 << 20),
            budget_mb=self.settings.router.memory_budget_mb,
        )  # fmt: skip
        started = time.perf_counter()

        def on_ready(engine: Engine) -> None:
            # a failed load is this model's alone; a serving engine that dies takes the server down
            engine.on_failure = self.on_failure
            events.router_model_loaded(
                model=route.name, profile=engine.settings.profile, seconds=time.perf_counter() - started
            )

        def on_failure(exc: BaseException) -> None:
            events.router_model_load_failed(model=route.name, profile=route.settings.profile, reason=str(exc))

        engine = Engine(
            route.settings, on_failure=on_failure, on_ready=on_ready, tenants=self.tenants, load_niceness=self.niceness
        )
        route.switch = EngineSwitch(engine)
        route.switch.on_swap.append(lambda new: setattr(route, "settings", new.settings))
        route.reloader = Reloader(route.switch, route.profile.resolve, self.on_failure, tenants=self.tenants)
        engine.start()

    def _fit(self, route: Route) -> None:
        """Unload the least recently used idle models until `route` fits the budget (if any)."""
        others = [r for r in self.routes if r.switch is not None and r is not route]
        while self.budget and sum(r.weights for r in others) + route.weights > self.budget:
            idle = [r for r in others if not r.holders]
            if not idle:
                return
            victim = min(idle, key=lambda r: r.last_used)
            self._unload(victim, "memory_budget")
            others.remove(victim)

    def _unload(self, route: Route, reason: str) -> None:
        switch = route.switch
        assert switch is not None
        route.switch, route.reloader = None, None  # no new request reaches its engines
        switch.retire()
        started = time.perf_counter()

        def release() -> None:
            release_retired(switch)
            with self._lock:
                self._retiring.remove(switch)
            events.router_model_unloaded(model=route.name, reason=reason, seconds=time.perf_counter() - started)

        self._retiring.append(switch)
        threading.Thread(target=release, name="mlxcel-unload", daemon=True).start()

    def unload_idle(self) -> None:
        """Unload the models no request has used for `idle_unload_s`."""
        now = time.monotonic()
        with self._lock:
            for route in self.routes:
                idle = route.switch is not None and not route.holders and now - route.last_used > self.idle_unload_s
                if idle and route.status is Status.LOADED:
                    self._unload(route, "idle")

    def _watch_idle(self) -> None:
        while not self._stopped.wait(min(IDLE_CHECK_S, self.idle_unload_s / 4)):
            self.unload_idle()

    # --- the whole server: startup, shutdown and its drain ----------------------------------

    @property
    def switches(self) -> list[EngineSwitch]:
        with self._lock:
            return [r.switch for r in self.routes if r.switch is not None] + self._retiring

    def start(self) -> None:
        """Nothing loads until a request names a model; idle models are watched for."""
        if self.idle_unload_s:
            threading.Thread(target=self._watch_idle, name="mlxcel-idle-unload", daemon=True).start()

    def stop(self) -> None:
        self._stopped.set()
        for switch in self.switches:
            switch.stop()

    def drain(self) -> None:
        with self._lock:
            self._draining = True
        for switch in self.switches:
            switch.drain()

    def abort(self, message: str) -> None:
        for switch in self.switches:
            switch.abort(message)

    @property
    def closing(self) -> bool:
        """A SIGTERM's drain began: no model loads any more."""
        return self._draining

    @property
    def draining(self) -> bool:
        return any(switch.draining for switch in self.switches)

    @property
    def drain_timeout_s(self) -> float:
        return self.settings.server.drain_timeout_s

    @property
    def idle(self) -> bool:
        return all(switch.idle for switch in self.switches)

    @property
    def running_rows(self) -> int:
        return sum(switch.running_rows for switch in self.switches)

    @property
    def engines(self) -> list[Engine]:
        return [engine for switch in self.switches for engine in switch.engines]
