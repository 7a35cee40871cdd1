"""A served model's pace while the router loads another (issue 50: within 1.5x of idle).

One router server (`[router]`, `tests/server/test_router.py`'s: the embedded default, target-only
named `plain`, and a 4-bit copy named `small`, in a budget that holds two of them). Per round:
`default` and `plain` are loaded, `plain` streams alone (its idle inter-token gaps), then streams
again while a request for `small` makes the router load it (unloading `default`). The ratio is
the median gap during the load over the median gap alone; a fresh server per round, so each
round's load is a first load.

    python -m ops.bench.router_pace [--rounds 3] [--tokens 100] [--log server.jsonl]

With `--log`, the servers' events go to that file, and the router's load and unload times (its
`router_model_loaded` and `router_model_unloaded` events: decision to ready, or to stopped) are
listed after the rounds.
"""

from __future__ import annotations

# isort: off
from ops.bench.common import machine, stage  # first: sets up MLX's BLAS

# isort: on
import argparse
import json
import statistics
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

import httpx

from app.profiles import resolve
from ops.bench.spawn import spawned
from ops.models.grown import quantized_copy

PROMPT = "def fibonacci(n):\n"
BODY = {"prompt": PROMPT, "n_predict": 24, "temperature": 0, "ignore_eos": True}
# The embedded default (target 17.8 MB and drafter 4.2 MB on disk) and target-only (17.8 MB) fit
# 40 MB together; the 4-bit copy (5.0 MB) beside them does not: its load unloads one.
ROUTER = """
[router]
memory_budget_mb = 40
[[router.models]]
profile = "default"
[[router.models]]
name = "plain"
profile = "target-only"
aliases = ["target-only"]
[[router.models]]
name = "small"
profile = "small.toml"
"""
SMALL = 'target = "target-4bit"\n[drafter]\nkind = "none"\n'


class Gap(NamedTuple):
    at: float  # time.perf_counter() of the token that ended it
    seconds: float


@dataclass(frozen=True)
class Pace:
    """One load beside one stream: the stream's gaps alone and while the load ran."""

    load_s: float  # the loading request's wait, from its send to its answer
    status: int  # the loading request's answer
    idle: list[float]
    during: list[float]  # the gaps that ended after the load's request was sent

    @property
    def ratio(self) -> float:
        return statistics.median(self.during) / statistics.median(self.idle)

    def summary(self) -> str:
        return (
            f"load {self.load_s:.2f} s; gap idle median {statistics.median(self.idle) * 1e3:.1f} ms, during the "
            f"load {statistics.median(self.during) * 1e3:.1f} ms (mean {statistics.mean(self.during) * 1e3:.1f}, "
            f"longest {max(self.during) * 1e3:.0f} ms, {len(self.during)} gaps): {self.ratio:.2f}x"
        )


def write_profiles(root: Path) -> Path:
    """The router profile and its `small.toml` beside a 4-bit copy of the embedded target."""
    quantized_copy(resolve("target-only").settings.target.model, root / "target-4bit")
    (root / "small.toml").write_text(SMALL)
    (root / "router.toml").write_text(ROUTER)
    return root / "router.toml"


def stream_gaps(client: httpx.Client, model: str, n: int, until: threading.Event | None = None) -> list[Gap]:
    """The gaps between the tokens of one streamed answer of `n` tokens, or until `until` is set
    (the stream is then closed: its row is cancelled)."""
    gaps, last = [], None
    with client.stream("POST", "/completion", json=BODY | {"model": model, "n_predict": n, "stream": True}) as response:
        for line in response.iter_lines():
            if until is not None and until.is_set():
                break
            if line.startswith("data: "):
                now = time.perf_counter()
                gaps += [] if last is None else [Gap(now, now - last)]
                last = now
    return gaps


def load_models(url: str, models: tuple[str, ...]) -> list[int]:
    """Load `models` one after another (a one-token request each); their answers' statuses."""
    body = BODY | {"n_predict": 1}
    return [httpx.post(f"{url}/completion", json=body | {"model": model}, timeout=120).status_code for model in models]


def pace_during_load(url: str, streamed: str, loaded: str, idle_tokens: int) -> Pace:
    """`streamed`'s gaps alone, then while a one-token request for `loaded` (not loaded yet) waits
    for its load; the stream starts before that request is sent and stops once it is answered."""
    with httpx.Client(base_url=url, timeout=120) as client:
        idle = stream_gaps(client, streamed, idle_tokens)
        done, load = threading.Event(), {}

        def load_it() -> None:
            time.sleep(0.2)  # the stream runs before the request comes
            load["started"] = time.perf_counter()
            try:
                load["status"] = httpx.post(f"{url}/completion", json=BODY | {"model": loaded, "n_predict": 1},
                                            timeout=120).status_code  # fmt: skip
            finally:
                load["seconds"] = time.perf_counter() - load["started"]
                done.set()

        loader = threading.Thread(target=load_it)
        loader.start()
        gaps = stream_gaps(client, streamed, 4096, until=done)
        loader.join()
    during = [gap.seconds for gap in gaps if gap.at > load["started"]]
    return Pace(load["seconds"], load.get("status", 0), [gap.seconds for gap in idle], during)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(allow_abbrev=False, description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--tokens", type=int, default=100, help="the idle stream's tokens")
    parser.add_argument("--log", type=Path, help="the servers' event log (then their load and unload times)")
    args = parser.parse_args(argv)
    log = str(args.log.resolve()) if args.log else "stderr"
    with tempfile.TemporaryDirectory() as tmp:
        stage("writing the router profile and its 4-bit copy")
        router = write_profiles(Path(tmp))
        paces = []
        for round_ in range(args.rounds):
            command = [sys.executable, "-m", "app", "serve", "--profile", str(router)]
            with spawned(command, {"MLXCEL_LOGGING__DESTINATION": log}) as (url, _):
                load_models(url, ("default", "plain"))
                pace = pace_during_load(url, "plain", "small", args.tokens)
            print(f"round {round_ + 1}: {pace.summary()}")
            paces.append(pace)
    ratios = sorted(pace.ratio for pace in paces)
    print(f"{machine()}\nratio of medians over {args.rounds} rounds: {', '.join(f'{r:.2f}x' for r in ratios)}")
    if args.log:
        print_router_times(args.log)


def print_router_times(log: Path) -> None:
    """Each model's load and unload seconds, from the router's events in `log`."""
    times: dict[tuple[str, str], list[float]] = {}
    for line in log.read_text().splitlines():
        event = json.loads(line) if line.startswith("{") else {}
        kind = {"router_model_loaded": "load", "router_model_unloaded": "unload"}.get(event.get("event"))
        if kind:
            times.setdefault((event["model"], kind), []).append(event["seconds"])
    for (model, kind), seconds in sorted(times.items()):
        print(f"{model} {kind}: " + ", ".join(f"{s:.2f}" for s in sorted(seconds)) + " s")


if __name__ == "__main__":
    main()
