"""`mlxcel serve`'s stop from the process's first line until serve installs its own (stdlib only).

A SIGINT's KeyboardInterrupt raised inside the imports that run before `mlxcel serve`'s handler
is in (numpy, structlog, MLX, mlx-lm, transformers: 0.3 s on an idle machine, over 1.5 s on two
loaded cores) can land in a `__del__`, a weakref callback or an `except BaseException`, which
swallow it, and the server then served on (three full suites in a row, a SIGINT 1.5 s after
start). Nothing is held yet: one event line on stdout and exit 0, as serve's own early stop
(app/cli/serve.py `stop_before_serving`) does once logging is configured.
"""

import os
import signal

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)


def stop_at_once(sig: int, _: object) -> None:
    name = signal.Signals(sig).name
    try:
        os.write(1, f'{{"signal":"{name}","event":"stopped_before_serving","level":"info"}}\n'.encode())
    finally:
        os._exit(0)


def install(argv: list[str]) -> None:
    """For `serve` only (every other command keeps Python's Ctrl-C); a signal its parent ignored
    (a tensor rank's, app/cli/tensor_launch.py) stays ignored."""
    if argv[1:2] == ["serve"]:
        for sig in STOP_SIGNALS:
            if signal.getsignal(sig) is not signal.SIG_IGN:
                signal.signal(sig, stop_at_once)
