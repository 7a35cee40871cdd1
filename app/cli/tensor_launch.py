"""`mlxcel serve` on a tensor-parallel profile (`target.parallel = "tensor"`): the ranks' roles.

Not under mlx.launch, serve supervises: it starts `mlx.launch --backend ring -n WORLD_SIZE` on
this host running the same `serve` command, and waits. Each rank then finds itself by MLX_RANK:
rank 0 serves HTTP (app/cli/serving.py), the others follow (app/execution/tensor_parallel.py) and
never open the port. On two hosts the operator runs mlx.launch with a hostfile instead
(docs/deployment.md); the ranks behave the same.

Stopping. The supervisor starts mlx.launch with SIGTERM and SIGINT ignored (inherited through
exec) and forwards either signal to the job's process group as SIGTERM: mlx.launch, ignoring
it, stays to collect the ranks; rank 0 drains as any server does and then tells the followers to
stop; a follower outlives its first signal, so rank 0 can finish its rows, by the drain time
and a margin at most. A second signal ends every rank at once, and a rank that dies takes the
others with it (the ring reports the lost peer; mlx.launch ends the rest). The supervisor exits
with rank 0's status, or 1 when the job ended without being asked (a lost rank), so a service
manager restarts it; killed outright, it leaves no rank behind (`watch_supervisor`).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from types import FrameType

from app.cli.exit_codes import EXIT_CONFIG, EXIT_FAILURE
from app.early_stop import STOP_SIGNALS
from app.events import tensor as events
from app.loading import ModelLoadError
from app.profiles.schema import Settings

RANK_ENV = "MLX_RANK"  # set by mlx.launch in every rank it starts
# mlx.launch exits 0 whatever its ranks did, so rank 0 leaves its exit status here for the supervisor
STATUS_FILE_ENV = "MLXCEL_TENSOR_STATUS_FILE"
SUPERVISOR_ENV = "MLXCEL_TENSOR_SUPERVISOR_PID"  # the ranks end themselves if it is killed outright
SUPERVISOR_POLL_S = 1.0
FOLLOWER_MARGIN_S = 15.0  # after the drain time and rank 0's handler grace, a follower stops waiting


def launched_rank() -> int | None:
    """This process's rank when mlx.launch started it, else None."""
    rank = os.environ.get(RANK_ENV)
    return int(rank) if rank is not None else None


def launcher() -> str:
    """mlx.launch from the interpreter's own environment (the one that has this MLX)."""
    beside = Path(sys.executable).with_name("mlx.launch")
    return str(beside) if beside.exists() else shutil.which("mlx.launch") or "mlx.launch"


def free_ring_ports(count: int) -> int:
    """A first port with `count` consecutive free ones on loopback, for the ring's listeners."""
    while True:
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            first = probe.getsockname()[1]
        if first + count <= 65535 and all(_free(port) for port in range(first, first + count)):
            return first


def _free(port: int) -> bool:
    with socket.socket() as probe:
        try:
            probe.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def supervise(settings: Settings, serve_argv: list[str]) -> int:
    """Run the ranks on this host under mlx.launch; its exit status is this process's."""
    world_size = settings.target.world_size
    command = [
        launcher(), "--backend", "ring", "-n", str(world_size), "--starting-port", str(free_ring_ports(world_size)),
        "--", sys.executable, "-m", "app", *serve_argv,
    ]  # fmt: skip
    events.ranks_launching(world_size=world_size, command=command)
    with tempfile.TemporaryDirectory(prefix="mlxcel-ranks-") as folder:
        status_file = Path(folder) / "rank0-status"
        environment = os.environ | {STATUS_FILE_ENV: str(status_file), SUPERVISOR_ENV: str(os.getpid())}
        # mlx.launch polls its stdin to pass it on to the ranks; at end of file (/dev/null, a closed
        # pipe) that poll spins a core, so it gets a pipe that stays open and empty.
        quiet_stdin, keep_open = os.pipe()
        try:
            job = subprocess.Popen(
                command, stdin=quiet_stdin, env=environment, start_new_session=True, preexec_fn=_ignore_stop_signals
            )
        except OSError as exc:
            print(f"error: cannot start mlx.launch ({command[0]}): {exc.strerror}", file=sys.stderr)
            return EXIT_CONFIG
        finally:
            os.close(quiet_stdin)
        asked_to_stop = _wait_forwarding_signals(job)
        os.close(keep_open)
        status = int(status_file.read_text()) if status_file.exists() else 1
    # A job that ended unasked lost a rank (mlx.launch then stops rank 0, which drains and says 0).
    return status if status or asked_to_stop else 1


def _wait_forwarding_signals(job: subprocess.Popen) -> bool:
    """Wait for mlx.launch, passing SIGTERM and SIGINT on to its whole job as SIGTERM; whether one came."""
    signalled: list[int] = []

    def forward(sig: int, frame: FrameType | None) -> None:
        signalled.append(sig)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(job.pid, signal.SIGTERM)

    for sig in STOP_SIGNALS:
        signal.signal(sig, forward)
    job.wait()
    return bool(signalled)


def _ignore_stop_signals() -> None:
    for sig in STOP_SIGNALS:
        signal.signal(sig, signal.SIG_IGN)


def watch_supervisor() -> None:
    """A rank started by `supervise` exits if the supervisor is gone (SIGKILL leaves it no time to
    stop the job), so no rank outlives it holding the port or a core."""
    pid = os.environ.get(SUPERVISOR_ENV)
    if pid is None:
        return

    def watch() -> None:
        while True:
            time.sleep(SUPERVISOR_POLL_S)
            try:
                os.kill(int(pid), 0)
            except ProcessLookupError:
                events.supervisor_gone(supervisor_pid=int(pid))
                os._exit(EXIT_FAILURE)

    threading.Thread(target=watch, name="mlxcel-supervisor-watch", daemon=True).start()


def record_status(status: int) -> int:
    """Rank 0's exit status, left for the supervisor (when one started this job)."""
    path = os.environ.get(STATUS_FILE_ENV)
    if path:
        Path(path).write_text(str(status))
    return status


def restore_stop_signals() -> None:
    """Rank 0 drains on SIGTERM like any server: undo the ignoring it inherited."""
    for sig in STOP_SIGNALS:
        signal.signal(sig, signal.SIG_DFL)


def follow_rank(settings: Settings) -> int:
    """A follower rank: repeat rank 0's forwards until it says stop (or a peer is lost)."""
    from app.execution.tensor_parallel import follow

    outcome: list[BaseException | None] = []

    def work() -> None:
        try:
            follow(settings.target.model, settings.target.world_size)
            outcome.append(None)
        except BaseException as exc:  # reported by the main thread
            outcome.append(exc)

    # The collectives block in C++, where no Python signal handler runs: the main thread stays free.
    worker = threading.Thread(target=work, name="mlxcel-follower", daemon=True)
    signalled: list[int] = []

    def on_signal(sig: int, frame: FrameType | None) -> None:
        signalled.append(sig)
        if len(signalled) > 1:
            os._exit(128 + sig)
        wait_s = settings.server.drain_timeout_s + FOLLOWER_MARGIN_S
        events.rank_waiting_for_rank_0(signal=signal.Signals(sig).name, timeout_s=wait_s)
        deadline = threading.Timer(wait_s, os._exit, args=(128 + sig,))
        deadline.daemon = True  # a follower that stops in time exits without waiting for it
        deadline.start()

    for sig in STOP_SIGNALS:
        signal.signal(sig, on_signal)
    worker.start()
    while worker.is_alive():
        worker.join(timeout=0.5)
    failure = outcome[0] if outcome else None
    if failure is None:
        return 0
    print(f"error: follower rank {launched_rank()}: {failure}", file=sys.stderr)
    return EXIT_CONFIG if isinstance(failure, ModelLoadError) else 1
