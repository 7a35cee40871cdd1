"""structlog set-up, done once per process by the command that runs."""

from __future__ import annotations

import logging
import os
import secrets
import sys
from pathlib import Path
from typing import Any, TextIO

import msgspec
import structlog

FIELD_CAP = 4096  # characters one logged string may keep: a grammar, a body or a path is cut here
EXCEPTION_CAP = 32_768  # a traceback's: larger, since a deep one is worth reading, but still bounded


def capped(value: Any, cap: int) -> Any:
    """`value` with every string in it (through dicts, lists and tuples) cut to `cap` characters,
    each cut one ending with a marker saying how many characters went."""
    if isinstance(value, str):
        return value if len(value) <= cap else f"{value[:cap]}...[{len(value) - cap} characters cut]"
    if isinstance(value, dict):
        return {key: capped(item, cap) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [capped(item, cap) for item in value]
    return value


def cap_fields(_logger: object, _method: str, event: dict) -> dict:
    """A processor: no logged field carries a whole grammar, body or prompt, so no line runs to
    megabytes; `exception` (the traceback) gets the larger EXCEPTION_CAP."""
    return {key: capped(value, EXCEPTION_CAP if key == "exception" else FIELD_CAP) for key, value in event.items()}


def _as_text(value: object) -> str:
    return capped(str(value), FIELD_CAP)


def _json(_logger: object, _method: str, event: dict) -> str:
    """One JSON object per line (msgspec is several times faster than json.dumps here); a value
    JSON has no form for is written as its str(), capped like any field."""
    return msgspec.json.encode(event, enc_hook=_as_text).decode()


STANDARD_STREAMS = ("stdout", "stderr")


def destination_problem(destination: str) -> str | None:
    """Why the log cannot go to `destination` (None when it can), found before anything starts.

    Checked without creating the file, so `profiles check` can report it too.
    """
    if destination in STANDARD_STREAMS:
        return None
    path = Path(destination).expanduser()
    if path.is_dir():
        return f"{path} is a directory; give a file path (appended to), stdout or stderr"
    if path.exists():
        return None if os.access(path, os.W_OK) else f"{path} is not writable by this user"
    if not path.parent.is_dir():
        return f"directory {path.parent} does not exist; create it, or log to stdout or stderr"
    if not os.access(path.parent, os.W_OK | os.X_OK):
        return f"cannot create {path}: directory {path.parent} is not writable by this user"
    return None


def log_stream(destination: str) -> TextIO:
    """The stream `logging.destination` names; a path is appended to, line-buffered.

    The profile loader has already checked it with `destination_problem`.
    """
    if destination in STANDARD_STREAMS:
        return getattr(sys, destination)
    return Path(destination).expanduser().open("a", buffering=1)  # lives as long as the process


HANDLER_NAME = "mlxcel"  # the one root handler configure_logging installs (and replaces on a second call)
# Libraries that log through the standard library, and the least level each reaches the stream at:
# uvicorn's INFO lines (startup banner, one access line per request) are replaced by our own
# `listening` and `http_request` events, so only its warnings and errors pass (its loggers are
# all children of "uvicorn").
LIBRARY_LEVELS = {"uvicorn": logging.WARNING}


def configure_logging(level: str | None, *, fmt: str = "json", stream: TextIO | None = None) -> None:
    """Send structlog's events and the standard library's records (uvicorn, Litestar, warnings) to
    `stream` (stderr by default) at `level`, through one handler: every line is one JSON object,
    or, with `fmt = "console"` on a terminal, one human line. None silences it.

    Silencing matters: unconfigured structlog prints to stdout, and offline commands promise
    unchanged output when MLXCEL_LOG is unset.
    """
    root = logging.getLogger()
    for handler in [h for h in root.handlers if h.name == HANDLER_NAME]:
        root.removeHandler(handler)
    if level is None:
        structlog.configure(
            processors=[],
            wrapper_class=structlog.make_filtering_bound_logger(logging.CRITICAL),
            logger_factory=structlog.ReturnLoggerFactory(),
            cache_logger_on_first_use=False,
        )
        return
    level_no = logging.getLevelNamesMapping().get(level.upper())
    if level_no is None:
        raise ValueError(f"unknown log level {level!r} (use debug, info, warning, error)")
    stream = stream or sys.stderr
    # Both kinds of record get the same keys before rendering: structlog's through its own chain,
    # the standard library's through foreign_pre_chain (their message becomes `event`). Both then
    # pass the formatter's `processors`, where the fields are capped (renderers).
    stamp = [
        structlog.contextvars.merge_contextvars,
        structlog.stdlib.add_log_level,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
    ]
    handler = logging.StreamHandler(stream)
    handler.name = HANDLER_NAME
    handler.setFormatter(
        structlog.stdlib.ProcessorFormatter(
            foreign_pre_chain=[*stamp, structlog.stdlib.add_logger_name],
            processors=[structlog.stdlib.ProcessorFormatter.remove_processors_meta, *renderers(fmt, stream)],
        )
    )
    root.addHandler(handler)
    root.setLevel(level_no)
    for name, least in LIBRARY_LEVELS.items():
        logging.getLogger(name).setLevel(max(least, level_no))
    logging.captureWarnings(True)  # Python warnings become `py.warnings` events, not stderr text
    structlog.configure(
        processors=[*stamp, structlog.stdlib.ProcessorFormatter.wrap_for_formatter],
        wrapper_class=structlog.make_filtering_bound_logger(level_no),
        logger_factory=structlog.stdlib.LoggerFactory(),
        cache_logger_on_first_use=False,
    )


def renderers(fmt: str, stream: TextIO) -> list[structlog.typing.Processor]:
    """JSON lines, unless the profile asks for the console format and a person reads the stream.

    `log.exception` puts the traceback into the JSON line's "exception"; the console renderer
    formats tracebacks itself. Fields are capped (cap_fields) once the traceback is text, the
    last step before rendering, which every record of both chains passes.
    """
    if fmt == "console" and stream.isatty():
        return [cap_fields, structlog.dev.ConsoleRenderer(colors=True)]
    return [structlog.processors.format_exc_info, cap_fields, _json]


def new_error_id() -> str:
    """The id of an unexpected failure: its log line (with the traceback) and the client's error
    message both carry it, so one grep finds the traceback."""
    return secrets.token_hex(6)


def internal_error_message(error_id: str, exc: BaseException) -> str:
    """What a client is told about an unexpected failure: no internals, only the id to report."""
    return f"internal error {error_id} ({type(exc).__name__}); the server log has its traceback under this id"
