"""Shared fixtures: the embedded pair (loaded once), tiny random models built on the fly, and the
shared servers, with the xdist groups that start each of them on one worker only."""

from __future__ import annotations

import gc
import os
import time
from collections import OrderedDict
from collections.abc import Callable, Iterator
from contextlib import ExitStack
from pathlib import Path

import httpx._transports.default
import pytest
import structlog

from app.execution.model import LoadedModel, load_model
from app.execution.prepare import prepared
from app.loading import EMBEDDED_DRAFTER, EMBEDDED_TARGET
from app.profiles.loader import shipped_profiles
from ops.models.tiny import build_tiny_model
from tests.support.server import API_KEY, RunningServer, serve

# The suite runs on two xdist workers (pyproject's addopts, `--dist loadgroup`). Session and module
# fixtures are per worker, so the tests of one server fixture join one group and run on one worker:
# each server starts once. A test that names a profile (parameter `profile` or `name`) of
# `profile_server` joins that profile's group; one that uses two servers joins the first's group
# and the other starts on its worker too (at most one extra start per server). Any other test that
# uses a module fixture (a module's own server, a model or reference it builds) joins its module's
# group, so the fixture is made once, not once per worker (issue 44: 90 server starts a run).
SERVER_FIXTURES = {"keyed_server": "keyed", "default_server": "default", "target_only_server": "target-only"}
SHIPPED = set(shipped_profiles())
# Profile servers a worker keeps running at once; the least recently used stops for a new one.
# Each holds its models, KV pools and buffers (0.3 to 2.6 GB seen): kept all session, every
# shipped profile on both workers plus the workers themselves outgrew CI's 24 GiB.
LIVE_PROFILE_SERVERS = 3
SESSION_STARTED = pytest.StashKey[float]()
WORKER_WALLS: dict[str, float] = {}  # the controller's: each xdist worker's wall time, as it reported


def server_group(item: pytest.Item) -> str | None:
    uses = getattr(item, "fixturenames", ())
    params = getattr(getattr(item, "callspec", None), "params", {})
    named = [params[key] for key in ("profile", "name") if params.get(key) in SHIPPED]
    if "profile_server" in uses and named:
        return named[0]
    if "server" in uses or module_fixtures(item):  # a module's own server, or a module's other fixtures
        return item.nodeid.split("::")[0]
    return next((group for fixture, group in SERVER_FIXTURES.items() if fixture in uses), None)


def module_fixtures(item: pytest.Item) -> list[str]:
    """The module-scoped fixtures the test uses."""
    definitions = getattr(getattr(item, "_fixtureinfo", None), "name2fixturedefs", {})
    return [name for name, defs in definitions.items() if defs and defs[-1].scope == "module"]


def pytest_configure(config: pytest.Config) -> None:
    """`make test` preloads mimalloc into pytest (Makefile): the controller hands it to its xdist
    workers, and a worker (or a serial run) hands it to nothing it starts. Servers, commands and
    browsers run on the system's malloc, as operators run them: the attack tests' RSS bounds hold
    there (under mimalloc a server's RSS stayed up to 29 % higher after a large request)."""
    if hasattr(config, "workerinput") or config.getoption("numprocesses", None) in (None, 0):
        os.environ.pop("LD_PRELOAD", None)


def pytest_sessionstart(session: pytest.Session) -> None:
    session.config.stash[SESSION_STARTED] = time.monotonic()
    share_one_tls_context()


def share_one_tls_context() -> None:
    """Every httpx client of the session (`httpx.get`, each `httpx.Client`, each OpenAI or
    Anthropic SDK client) gets one TLS context, built once. httpx builds one per client and loads
    certifi's CA bundle into it: 25 ms of CPU each, about 40 s of a run's CPU in all (issue 44,
    a `perf` profile of the suite). The suite's clients speak plain HTTP to 127.0.0.1; a client
    that asks for anything else (its own `verify`, a `cert`) still gets a context of its own."""
    build = httpx._transports.default.create_ssl_context
    shared = build()

    def create_ssl_context(verify: object = True, cert: object = None, trust_env: bool = True) -> object:
        if verify is True and cert is None and trust_env:
            return shared
        return build(verify=verify, cert=cert, trust_env=trust_env)  # type: ignore[arg-type]

    httpx._transports.default.create_ssl_context = create_ssl_context  # type: ignore[assignment]


def pytest_collection_finish(session: pytest.Session) -> None:
    """What the imports and the collection built (modules, the libraries' tables, the test items)
    lives all session: frozen out of the cyclic collector's reach, every later collection walks
    only what the tests allocate (its passes were 3 % of a worker's CPU in a `perf` profile)."""
    gc.collect()
    gc.freeze()


def pytest_sessionfinish(session: pytest.Session) -> None:
    """A worker reports its wall time to the controller (xdist's `workeroutput`)."""
    output = getattr(session.config, "workeroutput", None)
    if output is not None:
        output["wall_s"] = time.monotonic() - session.config.stash[SESSION_STARTED]


def pytest_testnodedown(node: object, error: object) -> None:
    output = getattr(node, "workeroutput", {})
    if "wall_s" in output:
        WORKER_WALLS[node.gateway.id] = output["wall_s"]  # type: ignore[attr-defined]  (xdist's WorkerController)


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    """Each worker's wall time, after the slowest tests: an idle worker at the end shows as a gap."""
    if WORKER_WALLS:
        terminalreporter.section("wall time per worker")
        for worker, wall in sorted(WORKER_WALLS.items()):
            terminalreporter.write_line(f"{worker}: {wall:.0f} s ({wall / 60:.1f} min)")


@pytest.hookimpl(tryfirst=True)  # before xdist's own, which reads the groups into the node ids
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if item.get_closest_marker("xdist_group") is None and (group := server_group(item)):
            item.add_marker(pytest.mark.xdist_group(group))
    items.sort(key=dealt_order(items))


def dealt_order(items: list[pytest.Item]) -> Callable[[pytest.Item], int]:
    """The order xdist deals the work in (`--no-loadscope-reorder` keeps it): groups with a slow
    test first, then slow tests alone, then the quick ones, which fill both workers' last minutes.
    xdist's own order (most tests first) dealt a few long groups last (the seeded identity's eight
    tests, 3 minutes): one worker ran a minute past the other."""
    groups = {item: group_of(item) for item in items}
    slow_groups = {group for item, group in groups.items() if group and item.get_closest_marker("slow")}

    def rank(item: pytest.Item) -> int:
        if groups[item] in slow_groups:
            return 0
        return 1 if groups[item] is None and item.get_closest_marker("slow") else 2

    return rank


def group_of(item: pytest.Item) -> str | None:
    mark = item.get_closest_marker("xdist_group")
    return None if mark is None else str(mark.args[0] if mark.args else mark.kwargs.get("name", "default"))


@pytest.fixture(autouse=True)
def structlog_defaults() -> None:
    """Each test starts from structlog's defaults: a command run in-process (`generate` silences
    logging unless MLXCEL_LOG is set) would otherwise filter out a later test's captured events,
    and which tests share a process depends on how xdist splits them."""
    structlog.reset_defaults()


SHARED_MODELS = ("embedded_target", "embedded_drafter", "tiny_model")  # the session's, one per worker


@pytest.fixture(autouse=True)
def idle_pools_dropped(request: pytest.FixtureRequest) -> Iterator[None]:
    """After each test, the shared models' KV pools go if no row is left on them: each test starts
    from a small pool, not one grown by every test before it on this worker (issue 44)."""
    yield
    for name in SHARED_MODELS:
        if name in request.fixturenames:
            loaded = request.getfixturevalue(name)
            if prepared(loaded.model).unpooled() is None:
                prepared(loaded.model).drop_idle_pool()


@pytest.fixture(scope="session")
def embedded_target() -> LoadedModel:
    return load_model(EMBEDDED_TARGET)


@pytest.fixture(scope="session")
def embedded_drafter() -> LoadedModel:
    return load_model(EMBEDDED_DRAFTER, role="drafter")


@pytest.fixture(scope="session")
def tiny_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_model(tmp_path_factory.mktemp("tiny") / "qwen3")


@pytest.fixture(scope="session")
def tiny_model(tiny_dir: Path) -> LoadedModel:
    return load_model(tiny_dir)


@pytest.fixture(scope="session")
def profile_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Callable[[str], RunningServer]]:
    """`profile_server(name)`: a server for a shipped profile, started on first use and shared by
    the session's tests; at most LIVE_PROFILE_SERVERS run at once (a test that needs other flags
    starts its own). Ask for it in each test: a server asked for long ago may have been stopped."""
    running: OrderedDict[str, tuple[RunningServer, ExitStack]] = OrderedDict()

    def server_for(profile: str) -> RunningServer:
        if profile in running:
            running.move_to_end(profile)
            return running[profile][0]
        while len(running) >= LIVE_PROFILE_SERVERS:
            running.popitem(last=False)[1][1].close()
        stack = ExitStack()
        running[profile] = (stack.enter_context(serve(tmp_path_factory.mktemp(profile), "--profile", profile)), stack)
        return running[profile][0]

    try:
        yield server_for
    finally:
        for _, stack in reversed(running.values()):
            stack.close()


@pytest.fixture
def default_server(profile_server: Callable[[str], RunningServer]) -> RunningServer:
    """The embedded default profile (classic draft model), shared by the server tests."""
    return profile_server("default")


@pytest.fixture
def target_only_server(profile_server: Callable[[str], RunningServer]) -> RunningServer:
    return profile_server("target-only")


@pytest.fixture(scope="session")
def keyed_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    """Target only behind `--api-key s3cret`, with small body and JSON-depth limits and a CORS origin
    list (one origin and a wildcard one) to test against."""
    env = {
        "MLXCEL_SERVER__MAX_BODY_BYTES": "4096",
        "MLXCEL_SERVER__MAX_JSON_DEPTH": "512",
        "MLXCEL_SERVER__CORS_ORIGINS": '["http://app.example", "https://*.example.org"]',
    }
    with serve(tmp_path_factory.mktemp("keyed"), "--profile", "target-only", "--api-key", API_KEY, env=env) as server:
        yield server
