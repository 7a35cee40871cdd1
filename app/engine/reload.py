"""Hot profile reload: a new engine built from the profile, beside the serving one, then swapped in.

The profile is resolved again from the same sources (file, environment, flags: `resolve` is the
command line's own resolution). The new engine loads its models, and a block drafter's exactness
probes run, while the old engine goes on serving; only a READY engine is swapped in. New
requests then go to it, and the old one finishes its requests and is stopped (EngineSwitch).

Anything that goes wrong leaves the old engine serving and refuses the reload with one line
(`ReloadRefusedError`): the profile's own error (naming the file and key, environment variable or
flag, as at startup), a profile file that sets nothing, a key that only a restart can change, a
change to who may call that the new profile does not allow, or models that do not load.
"""

from __future__ import annotations

import contextlib
import gc
import threading
import time
from collections.abc import Callable
from typing import Any, NoReturn

import msgspec

from app.engine.engine import Engine
from app.engine.scheduler import EngineState
from app.engine.switch import EngineSwitch
from app.events import reload as events
from app.execution.device import release_buffers
from app.loading import ModelLoadError
from app.profiles.loader import ProfileError, Resolved, leaves
from app.profiles.schema import Settings
from app.profiles.tenants import Tenants

# Keys bound when the process started: the listener, the HTTP app's body limit and CORS layer,
# logging, and the ranks a tensor-parallel target runs on. A reload that changes one is refused,
# naming it.
RESTART_ONLY = (
    "target.parallel",
    "target.world_size",
    "server.host",
    "server.port",
    "server.max_body_bytes",
    "server.max_connections",
    "server.max_header_bytes",
    "server.max_headers",
    "server.header_timeout_s",
    "server.body_timeout_s",
    "server.keep_alive_timeout_s",
    "server.write_timeout_s",
    "server.max_unsent_bytes",
    "server.cors_origins",
    "server.responses_stored",
    "server.responses_store_mb",
    "logging.level",
    "logging.format",
    "logging.destination",
)
# Keys that say who may call and what they see. A reload that changes one is refused unless the new
# profile sets `server.reload_may_change_auth = true`: a profile half written by an editor, or a
# deployment tool that dropped a table, must not open the server. An accepted change is a warning.
# (server.host and server.cors_origins say so too, but are restart-only above: no reload changes them.)
ACCESS_KEYS = (
    "server.api_key",
    "server.api_keys",
    "server.api_key_file",
    "server.admin_reload",
    "server.allowed_hosts",
    "server.props_show_paths",
)
POLL_S = 0.05  # how often a reload looks at the engine it waits on (loading, or finishing its requests)


class ReloadRefusedError(Exception):
    """The reload did not happen; the old engine goes on serving. The message is one line."""


def changes(old: Settings, new: Settings, keys: tuple[str, ...]) -> dict[str, tuple[Any, Any]]:
    """(old value, new value) of each of `keys` the new profile changes."""
    before, after = leaves(msgspec.to_builtins(old)), leaves(msgspec.to_builtins(new))
    return {key: (before[key], after[key]) for key in keys if before[key] != after[key]}


def restart_only_changes(old: Settings, new: Settings) -> list[str]:
    """`key: old -> new` for each restart-only key the new profile changes."""
    return [f"{key}: {was!r} -> {now!r}" for key, (was, now) in changes(old, new, RESTART_ONLY).items()]


KEY_FILE_CONTENTS = "server.api_key_file (the keys in it)"


def access_changes(old: Engine, new: Settings, new_tenants: Tenants) -> list[str]:
    """The access keys the new profile changes, by name only (the values may be secrets); a key
    file edited under the same path changes who may call too."""
    changed = list(changes(old.settings, new, ACCESS_KEYS))
    if not changed and new_tenants != old.tenants:
        changed.append(KEY_FILE_CONTENTS)
    return changed


class Reloader:
    def __init__(
        self,
        engines: EngineSwitch,
        resolve: Callable[[], Resolved],
        on_failure: Callable[[BaseException], None] | None = None,
        tenants: Tenants | None = None,
    ) -> None:
        self.engines = engines
        self.resolve = resolve
        self.on_failure = on_failure  # the serving engine's: given to the new one once it serves
        # a routed profile's: the keys are the router profile's, which no reload of one model changes
        self.tenants = tenants
        self._busy = threading.Lock()

    def reload(self, trigger: str) -> Engine:
        """Swap in an engine built from the profile as it reads now; ReloadRefusedError if not."""
        events.reload_requested(trigger=trigger)
        started = time.perf_counter()
        if not self._busy.acquire(blocking=False):
            self._refuse(trigger, "a reload is already running; wait for it to finish")
        try:
            # Replaced engines that finished are stopped before another engine thread starts: each
            # engine that runs at once holds a pooled MLX stream, a native thread that never ends
            # (app/execution/streams.py), so back-to-back reloads must not outrun the release thread.
            log_released(self.engines.release_finished())
            try:
                engine, changed = self._build()
            except ReloadRefusedError as exc:
                self._refuse(trigger, str(exc))
            replaced = self.engines.swap(engine)
        finally:
            self._busy.release()
        settings = engine.settings
        if changed:
            events.reload_changed_access(trigger=trigger, keys=changed, profile_file=settings.source)
        events.reload_succeeded(
            trigger=trigger,
            profile=settings.profile,
            profile_file=settings.source,
            drafter_kind=settings.drafter.kind,
            seconds=time.perf_counter() - started,
        )
        del replaced  # the release thread finds it among the retired: a reference here would keep it alive
        release_in_background(self.engines)
        return engine

    def reload_in_background(self, trigger: str) -> None:
        """For a signal handler, which must return at once; the outcome is in the log."""

        def run() -> None:
            with contextlib.suppress(ReloadRefusedError):  # logged as reload_refused
                self.reload(trigger)

        threading.Thread(target=run, name="mlxcel-reload", daemon=True).start()

    def _refuse(self, trigger: str, reason: str) -> NoReturn:
        events.reload_refused(trigger=trigger, reason=reason)
        raise ReloadRefusedError(reason)

    def _build(self) -> tuple[Engine, list[str]]:
        """The new engine, serving, and the access keys it changes."""
        current = self.engines.current
        if current.state is not EngineState.READY:
            raise ReloadRefusedError(f"the server is {current.state}; reload once it serves")
        if current.settings.target.parallel == "tensor":  # the follower ranks hold the serving target's shards
            raise ReloadRefusedError("target.parallel = tensor: only a restart reloads a tensor-parallel target")
        try:
            resolved = self.resolve()
        except (ProfileError, ModelLoadError) as exc:
            raise ReloadRefusedError(str(exc)) from exc
        settings = resolved.settings
        if "file" not in resolved.sources.values():
            raise ReloadRefusedError(
                f"{settings.source}: the profile file sets no key (empty, or read while it was being written); "
                "nothing was reloaded; write the whole profile (to a temporary file renamed over this one) and reload"
            )
        changed = restart_only_changes(current.settings, settings)
        if changed:
            raise ReloadRefusedError(f"{'; '.join(changed)}: only a restart changes these; nothing was reloaded")
        tenants, changed = self._access(current, settings)
        if changed and not settings.server.reload_may_change_auth:
            raise ReloadRefusedError(
                f"{', '.join(changed)}: the new profile changes who may call or what they see; set "
                "server.reload_may_change_auth = true in it to allow that, or restore them; nothing was reloaded"
            )
        try:
            engine = Engine(settings, prepare_drafter=True, tenants=tenants)
        except (ProfileError, ModelLoadError) as exc:
            raise ReloadRefusedError(str(exc)) from exc
        engine.start()
        while engine.state is EngineState.LOADING:
            time.sleep(POLL_S)
        if engine.state is not EngineState.READY:
            engine.stop()
            raise ReloadRefusedError(f"the new profile's models did not load: {engine.failure}")
        if current.state is not EngineState.READY:  # a SIGTERM's drain began while it loaded
            engine.stop()
            raise ReloadRefusedError(f"the server is {current.state}; the new engine was not swapped in")
        engine.on_failure = self.on_failure
        return engine, changed

    def _access(self, current: Engine, settings: Settings) -> tuple[Tenants, list[str]]:
        """The new engine's keys, and the access keys the new profile changes."""
        if self.tenants is not None:
            return self.tenants, []
        try:
            tenants = Tenants.of(settings.server)
        except (OSError, UnicodeDecodeError) as exc:  # the key file went away since the profile was checked
            raise ReloadRefusedError(f"server.api_key_file: cannot read the key file: {exc}") from exc
        return tenants, access_changes(current, settings, tenants)


def release_in_background(engines: EngineSwitch) -> threading.Thread:
    thread = threading.Thread(target=release_retired, args=(engines,), name="mlxcel-release", daemon=True)
    thread.start()
    return thread


def release_retired(engines: EngineSwitch) -> None:
    """Stop each replaced engine once its requests end, then hand its memory back to the system.

    It holds no reference to an engine past the one that stops it, so the engine is freed
    here (cycles and all, by gc) and MLX's cache and malloc's arenas can give its weights and
    KV pool back: kept, they added ~80 MB to the first reload's RSS (`docs/reliability.md`)."""
    while engines.retiring:  # another reload's thread may be the one that stops some
        log_released(engines.release_finished())
        time.sleep(POLL_S)
    gc.collect()
    release_buffers()


def log_released(engines: list[Engine]) -> None:
    for engine in engines:
        events.engine_released(profile=engine.settings.profile)
