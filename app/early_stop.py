"""`mlxcel serve`'s stop from the process's first line until serve installs its own (stdlib only).

Before serve's handler is in (app/cli/serve.py `stop_early`), the imports run first: numpy,
structlog and the profile checks for the CLI, 0.3 s on an idle machine and past 1.5 s on two
loaded cores. A SIGINT there raised KeyboardInterrupt inside them (a traceback, or exit 130).
Nothing is held yet: one event line on stdout and exit 0, as serve's own early stop does once
logging is configured. A stop signal the process inherited as ignored stays ignored (a tensor
rank's, app/cli/tensor_launch.py; a background job of a non-interactive shell ignores SIGINT).
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
