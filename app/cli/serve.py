"""`mlxcel serve`: the HTTP server on a profile (the embedded default unless told otherwise)."""

from __future__ import annotations

import argparse
import errno
import socket
import sys

import structlog
import uvicorn

from app import events
from app.engine.engine import Engine
from app.loading import ModelLoadError
from app.profiles import add_profile_flags, settings_from_args
from app.runtime.logging import configure_logging, log_stream
from app.sampling import SamplingParams

EXIT_CONFIG = 2
EXIT_FAILURE = 1


def add_parser(commands: argparse._SubParsersAction) -> None:
    p = commands.add_parser("serve", help="run the HTTP server on a profile (default: profiles/default.toml)")
    add_profile_flags(p)
    p.set_defaults(handler=run)


def port_problem(host: str, port: int) -> str | None:
    """Why the listener cannot bind, checked before any model loads (None when it can)."""
    if port == 0:
        return None
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        try:
            probe.bind((host, port))
        except OSError as exc:
            if exc.errno == errno.EADDRINUSE:
                return f"port {port} on {host} is already in use (another server or profile holds it)"
            return f"cannot listen on {host}:{port}: {exc.strerror}"
    return None


def announce(engine: Engine) -> None:
    """The startup line and the `acceptance_rule_active` event, once the loop is built."""
    settings = engine.settings
    rule = engine.rule_at(SamplingParams(temperature=max(settings.sampling.temperature, 0.8)))
    fields = startup_fields(engine, str(rule) if rule else None)
    structlog.get_logger("mlxcel.serve").info("server_ready", **fields)
    events.acceptance_rule_active(**fields)


def startup_fields(engine: Engine, rule: str | None) -> dict[str, object]:
    settings = engine.settings
    drafter = settings.drafter
    widths = engine.block_widths() if engine.block_checkpoint else None
    width = {"prompt-lookup": 7, "draft-model": drafter.num_draft_tokens}.get(drafter.kind, widths and widths[0])
    return {
        "profile": settings.profile,
        "profile_file": settings.source,
        "target": settings.target,
        "drafter_kind": drafter.kind,
        "drafter_model": drafter.model,
        "rule": rule,
        "width": width if drafter.kind != "none" else None,
        "adaptive_max_width": widths[1] if widths and settings.adaptive.enabled else None,
        "governor_floor": settings.governor.floor if drafter.kind == "prompt-lookup" else None,
        "governor_policy": settings.governor.policy if drafter.kind == "prompt-lookup" else None,
        "env_overrides": dict(settings.env),
        "host": settings.server.host,
        "port": settings.server.port,
    }


def run(args: argparse.Namespace) -> int:
    from app.server.app import create_app

    settings = settings_from_args(args)
    configure_logging(
        settings.logging.level, fmt=settings.logging.format, stream=log_stream(settings.logging.destination)
    )
    problem = port_problem(settings.server.host, settings.server.port)
    if problem:
        print(f"error: {settings.source}: server.port: {problem}; choose another port (--port)", file=sys.stderr)
        return EXIT_CONFIG
    server: uvicorn.Server | None = None

    def on_failure(exc: BaseException) -> None:
        if server is not None:
            server.should_exit = True

    engine = Engine(settings, on_failure=on_failure, on_ready=announce)
    config = uvicorn.Config(
        create_app(engine),
        host=settings.server.host,
        port=settings.server.port,
        log_level="warning",
        access_log=False,
        lifespan="on",
    )
    server = uvicorn.Server(config)
    server.run()
    if engine.failure is not None:
        print(f"error: cannot start: {engine.failure}", file=sys.stderr)
        return EXIT_CONFIG if isinstance(engine.failure, ModelLoadError) else EXIT_FAILURE
    return 0
