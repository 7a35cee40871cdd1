"""`mlxcel serve`: the HTTP server on a profile (the embedded default unless told otherwise).

The profile and the port are checked before MLX, the engine and the HTTP app are imported
(`app/cli/serving.py`), so a bad profile fails in well under a second. A tensor-parallel profile
runs its ranks under mlx.launch (`app/cli/tensor_launch.py`); rank 0 serves.
"""

from __future__ import annotations

import argparse
import errno
import logging
import os
import signal
import socket
import sys
from pathlib import Path
from typing import NamedTuple, NoReturn

from app.cli import tensor_launch
from app.cli.exit_codes import EXIT_CONFIG
from app.events import serve as events
from app.profiles import add_profile_flags, origin, settled
from app.profiles.loader import flags_of, resolve
from app.profiles.routing import routed_profiles
from app.runtime.logging import configure_logging, log_stream


def add_parser(commands: argparse._SubParsersAction) -> None:
    p = commands.add_parser(
        "serve", allow_abbrev=False, help="run the HTTP server on a profile (default: profiles/default.toml)"
    )
    add_profile_flags(p)
    p.set_defaults(handler=run)


def port_holder(port: int) -> str | None:
    """The process listening on `port`, as `pid N (command)`, where this user may see it (None:
    unknown, or no process of this user holds it)."""
    import psutil  # only when a port is taken: psutil walks the process table

    def listens(connections: list) -> bool:
        return any(c.status == psutil.CONN_LISTEN and c.laddr and c.laddr.port == port for c in connections)

    for process in psutil.process_iter(["pid", "cmdline"]):
        try:
            if listens(process.net_connections(kind="inet")):
                command = " ".join(process.info["cmdline"] or [])
                return f"pid {process.pid} ({command[:120]})"
        except (psutil.AccessDenied, psutil.NoSuchProcess, psutil.ZombieProcess):
            continue
    return None


class ListenProblem(NamedTuple):
    key: str  # the settings key at fault: server.host or server.port
    reason: str
    taken: bool = False  # the port is in use: another process (perhaps this profile's own server) holds it


def listen_problem(host: str, port: int) -> ListenProblem | None:
    """Why the listener cannot bind, checked before any model loads, or None."""
    if port == 0:
        return None
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        # As uvicorn's own listener does: TIME_WAIT sockets of a previous run must not block a restart.
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((host, port))
        except socket.gaierror as exc:
            return ListenProblem("server.host", f"cannot listen on {host!r}: {exc.strerror}")
        except OSError as exc:
            if exc.errno == errno.EADDRINUSE:
                holder = port_holder(port) or "another server or profile"
                return ListenProblem(
                    "server.port", f"port {port} on {host} is already in use ({holder} holds it)", True
                )
            if exc.errno == errno.EADDRNOTAVAIL:
                return ListenProblem("server.host", f"{host} is not an address of this machine")
            return ListenProblem("server.port", f"cannot listen on {host}:{port}: {exc.strerror}")
    return None


def stop_early() -> None:
    """Until uvicorn installs its draining handlers, SIGTERM and SIGINT stop at once (a tensor
    rank's stop signals, ignored as its supervisor started it, stay ignored)."""
    for sig in tensor_launch.STOP_SIGNALS:
        if signal.getsignal(sig) is not signal.SIG_IGN:
            signal.signal(sig, stop_before_serving)


def stop_before_serving(sig: int, _: object) -> None:
    """SIGTERM or SIGINT while MLX, the app and the engine are still being imported and built:
    nothing serves or holds anything yet, so stop at once, as cleanly as a drained server (0),
    not by the signal's default action or a KeyboardInterrupt's traceback."""
    try:
        events.stopped_before_serving(signal=signal.Signals(sig).name)
    finally:  # the handler may run inside a write to the same stream, which then refuses this one
        exit_process(0)


def exit_process(status: int) -> NoReturn:
    """End `mlxcel serve` without the interpreter's finalization.

    MLX keeps per-thread state (a thread's compile cache) whose destructor, run as the thread
    exits, takes the GIL to release the Python objects it holds. A finalizing interpreter answers
    that with pthread_exit inside the C++ destructor, and the process aborted ("terminate called
    without an active exception", status 134): an engine thread ends just as the process does
    when a signal comes while it loads (13 of 19 SIGTERMs 2-5 s after start), and a reload's
    engine may still be loading at exit. By now the drain is done, the engines are stopped and
    the grammar worker closed; the log is flushed here: finalization has nothing left to do.
    """
    try:
        logging.shutdown()
        sys.stdout.flush()
        sys.stderr.flush()
    finally:
        # A signal handler that exits runs between any two bytecodes of the main thread, inside a
        # write to stdout too: a flush then raises ("reentrant call"), and an exception escaping
        # the handler is swallowed by the interrupted logging call, so the server went on serving
        # (seen once: a SIGINT as `listening` was written). The exit happens whatever the flush did.
        os._exit(status)


def run(args: argparse.Namespace) -> int:
    # Logging first (a profile's [logging] needs no model check), so that settling the drafter
    # below reports into the configured stream.
    stop_early()
    resolved = resolve(args.profile, flags_of(args))
    log = resolved.settings.logging
    configure_logging(log.level, fmt=log.format, stream=log_stream(log.destination))
    resolved = settled(resolved)
    settings = resolved.settings
    routed = routed_profiles(resolved)  # read and checked before MLX loads, as the profile itself
    rank = None
    if settings.target.parallel == "tensor":
        rank = tensor_launch.launched_rank()
        if rank is not None:
            tensor_launch.watch_supervisor()
        if rank is not None and rank > 0:
            return tensor_launch.follow_rank(settings)  # followers never open the port
    problem = listen_problem(settings.server.host, settings.server.port)
    if problem:
        key, reason, _ = problem
        fix = "choose another address (--host)" if key == "server.host" else "choose another port (--port)"
        print(f"error: {origin(key, resolved.sources, Path(settings.source))}: {reason}; {fix}", file=sys.stderr)
        return EXIT_CONFIG
    if settings.target.parallel == "tensor":
        if rank is None:
            return tensor_launch.supervise(settings, sys.argv[1:])
        tensor_launch.restore_stop_signals()
        stop_early()  # rank 0: the signals it inherited ignored are its own again
    from app.cli.serving import serve

    status = serve(settings, lambda: settled(resolve(args.profile, flags_of(args))), routed)
    exit_process(tensor_launch.record_status(status) if rank == 0 else status)
