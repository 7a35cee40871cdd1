"""What `mlxcel serve` runs once its profile and port are checked: the engine, the Litestar app
under uvicorn, draining on SIGTERM/SIGINT, hot reload on SIGHUP, and the startup line."""

from __future__ import annotations

import os
import signal
import socket
import sys
import time
from collections.abc import Callable

import uvicorn

from app.cli.exit_codes import EXIT_CONFIG, EXIT_FAILURE
from app.engine.engine import Engine
from app.engine.host import startup
from app.engine.reload import Reloader
from app.engine.router import Router
from app.engine.switch import EngineSwitch
from app.events import serve as events
from app.events.speculation import Startup, acceptance_rule_active
from app.loading import ModelLoadError
from app.profiles import Resolved
from app.profiles.routing import RoutedProfile
from app.profiles.schema import Settings
from app.profiles.tenants import Tenants
from app.server.access import with_access_log
from app.server.app import create_app
from app.server.protocol import bounded_protocol, connection_cap

HANDLER_GRACE_S = 5.0  # after the drain: how long responses already decided get to reach their clients
# A signal to a process group reaches the server from the sender and, within a millisecond, again
# from a parent that forwards it (make does, under `make run`): the same signal this soon after the
# first is that one stop, not a second signal asking to exit at once.
REPEAT_WINDOW_S = 0.5


class DrainingServer(uvicorn.Server):
    """uvicorn, with SIGTERM/SIGINT draining the engine instead of closing the listener at once.

    The first signal turns the engine DRAINING: the listener stays open so new requests get a
    503 envelope, and running rows may finish for `drain_timeout_s`; then the unfinished ones end
    with a 503 (an error frame on streams) and uvicorn shuts down as usual, exit status 0. A
    second signal exits at once with 128 + its number, like a process the signal killed; the same
    signal again within REPEAT_WINDOW_S is the first one delivered twice, and is ignored.
    """

    def __init__(self, config: uvicorn.Config, engines: EngineSwitch | Router) -> None:
        super().__init__(config)
        self.engines = engines  # the serving engine, and any a reload replaced that still finish requests
        self.drain_deadline: float | None = None
        self._first: tuple[int, float] | None = None  # the signal that started the drain, and when

    def handle_exit(self, sig: int, frame: object) -> None:
        now = time.monotonic()
        if self.drain_deadline is not None or self.should_exit:
            if self._first is not None and self._first[0] == sig and now - self._first[1] < REPEAT_WINDOW_S:
                events.signal_repeated(signal=signal.Signals(sig).name)
                return
            events.forced_exit(signal=signal.Signals(sig).name)
            os._exit(128 + sig)
        timeout = self.engines.drain_timeout_s
        self._first = sig, now
        self.engines.drain()
        self.drain_deadline = now + timeout
        # Logged last: a handler runs between any two bytecodes of the main thread, inside a write
        # to the same stream too, where this line raises a reentrant-call error that the
        # interrupted write swallows (app/cli/serve.py `exit_process`); the drain has begun by then.
        events.draining(signal=signal.Signals(sig).name, timeout_s=timeout)

    async def on_tick(self, counter: int) -> bool:
        if self.drain_deadline is not None and not self.should_exit:
            if not self.engines.draining:
                self.should_exit = True
            elif time.monotonic() >= self.drain_deadline:
                events.drain_timed_out(rows=self.engines.running_rows)
                self.engines.abort("the server shut down before this request finished")
        return await super().on_tick(counter)


def announce(engine: Engine, address: tuple[str, int]) -> None:
    """The startup line and the `acceptance_rule_active` event, once the loop is built."""
    fields = startup_fields(engine, address)
    events.server_ready(**fields)
    acceptance_rule_active(**fields)


def startup_fields(engine: Engine, address: tuple[str, int]) -> Startup:
    """The loop this server built, and the address it listens on (the bound port, also for port 0)."""
    return startup(engine.settings, engine.plan, engine.model, address)


def listen(config: uvicorn.Config) -> socket.socket:
    """Bind the listener before the engine starts, so every line can name the real port (the
    kernel picks one for port 0), and say where: `listening` with the URL."""
    sock = config.bind_socket()
    host, port = sock.getsockname()[:2]
    url = f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"
    events.listening(url=url, host=host, port=port)
    return sock


def serve(settings: Settings, resolve: Callable[[], Resolved], routed: list[RoutedProfile] | None = None) -> int:
    """Load the models behind the HTTP app and serve until drained; the process's exit status.

    `resolve` reads the profile again from the same file, environment and flags: SIGHUP (and
    POST /admin/reload where the profile allows it) swaps in an engine built from it. With
    `routed` profiles, a Router serves them, each loaded on its first request; SIGHUP reloads
    every loaded one."""
    server: uvicorn.Server | None = None
    loaded = False
    died: list[BaseException] = []

    def on_ready(engine: Engine) -> None:
        nonlocal loaded
        loaded = True
        announce(engine, address)

    def on_failure(exc: BaseException) -> None:
        died.append(exc)
        if server is not None:
            server.should_exit = True

    engines: EngineSwitch | Router
    if routed:
        engines = Router(routed, settings, Tenants.of(settings.server), on_failure)
        app, reload_all = create_app(engines), engines.reload_in_background
        loaded = True  # a model that fails to load is that model's 503; only a serving engine's death ends the server
    else:
        engines = EngineSwitch(Engine(settings, on_failure=on_failure, on_ready=on_ready))
        engines.on_swap.append(lambda engine: acceptance_rule_active(**startup_fields(engine, address)))
        reloader = Reloader(engines, resolve, on_failure)
        app, reload_all = create_app(engines, reloader), reloader.reload_in_background
    limits = settings.server
    max_connections = connection_cap(limits.max_connections)
    if max_connections < limits.max_connections:
        events.connection_cap_lowered(
            wanted=limits.max_connections, max_connections=max_connections,
            reason="the descriptor limit (ulimit -n) leaves room for no more",
        )  # fmt: skip
    config = uvicorn.Config(
        with_access_log(app),
        host=settings.server.host,
        port=settings.server.port,
        log_config=None,  # uvicorn's records go to the root handler app/runtime/logging.py installs
        access_log=False,  # the access event is ours (app/server/access.py)
        lifespan="on",
        timeout_graceful_shutdown=HANDLER_GRACE_S,
        timeout_keep_alive=limits.keep_alive_timeout_s,  # type: ignore[arg-type]  (seconds, a float works)
        http=bounded_protocol(limits, max_connections),
        ws="none",  # no route serves a WebSocket: the protocol answers a handshake 426 (app/server/protocol.py)
    )
    sock = listen(config)
    address = sock.getsockname()[:2]
    server = DrainingServer(config, engines)
    if hasattr(signal, "SIGHUP"):  # not on Windows
        signal.signal(signal.SIGHUP, lambda *_: reload_all("SIGHUP"))
    try:
        server.run(sockets=[sock])
    finally:
        for engine in engines.engines:
            engine.host.stop_followers()
    failure = died[0] if routed and died else None
    if not routed:
        failure = next((engine.failure for engine in engines.engines if engine.failure is not None), None)
    if failure is None:
        return 0
    if loaded:
        print(f"error: the engine failed while serving: {failure!r}", file=sys.stderr)
        return EXIT_FAILURE
    print(f"error: cannot start: {failure}", file=sys.stderr)
    return EXIT_CONFIG if isinstance(failure, ModelLoadError) else EXIT_FAILURE
