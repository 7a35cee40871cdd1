"""Concurrent streaming clients: the profiles' servers and `mlx_lm.server`, side by side.

Starts one `mlxcel serve` per profile and `mlx_lm.server` on the same target (through
ops/bench/mlx_lm_server.py: same BLAS, float32, EOS ignored, batching up to the largest client
count, no prompt cache since ours has none), all at once. For each client count c the held-out
prompts are sent in waves of c concurrent streaming `/v1/completions` requests (a fixed token
count, EOS ignored), every arm taking the same wave in turn, so arms see the same machine state.
A cell covers every prompt at least once per repeat.

Per arm and client count: aggregate tokens/s (all tokens over the waves' wall time, prefill
included), time to first token, inter-token latency (the gap before a frame spread over the
tokens it carries: a speculative round of 3 tokens after 30 ms counts as three 10 ms gaps), and
the widths the server's rounds ran at (its /metrics before and after each wave): the mean width
over every step of a drafting row, and the share of plain steps (width 0).

    python -m ops.bench.concurrency [--clients 1,2,4,8,16] [--tokens 64] [--repeats 2]
        [--temperatures 0,0.7] [--sampled-clients 1,8,16]
        [--profiles target-only,default,prompt-lookup,mtp] [--target DIR | random-1.2b | grown-1.2b]
        [--no-fixed] [--no-fast] [--no-mlx-lm] [--note TEXT] [--write] [--json FILE]

A profile may carry variants after `+`, each a few settings in the server's environment
(`VARIANTS`): `mtp+lossless` (drafter.block_rule = "lossless"), `default+uncoupled`
(speculative.coupled = false), `default+stochastic` (the stochastic rule), combined as in
`mtp+lossless+stochastic`. Every arm reports its per-position acceptance (from
`timings.speculative`); with both `PROFILE` and `PROFILE+stochastic` present at a temperature
above 0, the section states issue 39's goals at 8 clients.

`--temperatures` runs the waves once per temperature on the same servers; above 0 every request
carries a seed (its prompt's, the same in every arm) and the client counts are
`--sampled-clients`; `mlx_lm.server` runs at T = 0 only (it batches no seeded request).

Every profile with a drafter also runs as a fixed-width arm, `PROFILE@fixed`: the same profile
with its widths held (no block-loop width trials, no governor, no per-row choice under load:
the `FIXED_WIDTH` settings), the fixed k most servers draft whatever the batch. The goals
compare each profile with the better of target-only and its fixed-width arm at every client
count and temperature (issue 36: at least 1.0x), and one client with target-only (issue 36, on
the H200: at least 1.5x). `--json` keeps every figure for ops/bench/plot.py.

Every profile also runs as a fast-path arm, `PROFILE@fast`: the same profile with
`execution.exact = false` (MLX's own kernels, a row's bits may depend on its batch-mates, as
llama-server and vLLM by default), so every run measures the price of exactness beside it.

`--target` serves every arm on another target: a model directory, `random-1.2b`, issue 25's
1.2 B random bf16 Qwen3 (ops/models/random_target.py), or `grown-1.2b`, issue 46's embedded
target grown to 1.2 B computing the same function (ops/models/grown.py), each built into a
temporary folder first. Each arm keeps its profile's drafter (`--profile NAME -m DIR`); on
`grown-1.2b` a profile's embedded block drafter (models/mtp, dflash, dspark, muse) is replaced
by its grown copy (`-md`). A drafter that cannot pair with the target stops its server at
startup, and an arm whose server serves another drafter kind than its profile's is an error
(ops/bench/spawn.py), never a row: a drafting arm that silently served target-only once made
rows of target-only throughput under drafting names (issue 46).
"""

from __future__ import annotations

# isort: off
from ops.bench.common import WRITE_HELP, arguments, machine, progress  # first: sets up MLX's BLAS
from ops.bench.common import section_name, stage, table, write_section

# isort: on
import argparse
import json
import math
import os
import re
import selectors
import socket
import sys
import tempfile
import time
from bisect import bisect_left
from concurrent.futures import ThreadPoolExecutor
from contextlib import AbstractContextManager, ExitStack
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from ops.bench.prompts import HELD_OUT_CODE
from ops.bench.spawn import REPO_ROOT, profile_drafter, spawned, spawned_server
from ops.models.grown import GROWN_1_2B, build_grown_1_2b
from ops.models.random_target import SIZE_1_2B, build_random_target

PROFILES = ["target-only", "default", "prompt-lookup", "mtp"]
TARGET_ONLY = "target-only"
FIXED = "@fixed"  # an arm's suffix: its profile with the widths held
FAST = "@fast"  # an arm's suffix: its profile through MLX's own kernels (execution.exact = false)
FAST_PATH = {"MLXCEL_EXECUTION__EXACT": "false"}
EXACTNESS_PRICE = 1.25  # issue 35: the exact path within this of the fast path's throughput
FIXED_WIDTH = {"MLXCEL_ADAPTIVE__ENABLED": "false", "MLXCEL_ADAPTIVE__UNDER_LOAD": "false",
               "MLXCEL_GOVERNOR__ADAPTIVE": "false"}  # fmt: skip
GOODPUT_GOAL = 1.0
SINGLE_STREAM_GOAL = 1.5  # one client against target-only (the H200's goal)
SEED = 1000  # a sampled request's seed: SEED + its prompt's index, in every arm
VARIANT = "+"  # PROFILE+VARIANT: the profile with VARIANTS[VARIANT] in its server's environment
VARIANTS = {
    "lossless": {"MLXCEL_DRAFTER__BLOCK_RULE": "lossless"},
    "uncoupled": {"MLXCEL_SPECULATIVE__COUPLED": "false"},
    "stochastic": {"MLXCEL_SPECULATIVE_STOCHASTIC_ACCEPT": "1"},
}
STOCHASTIC = "+stochastic"
ACCEPTANCE_GOAL, SPEED_GOAL, GOAL_CLIENTS = 0.9, 0.95, 8  # issue 39: coupled sampler-match against stochastic
MLX_LM = "mlx_lm.server"
RANDOM_1_2B = "random-1.2b"
EMBEDDED = REPO_ROOT / "models"
EMBEDDED_TARGET = EMBEDDED / "target"
FRAME = re.compile(rb"^data: (\{.*\})\r?$", re.M)
WARMUP_TOKENS = 8
WIDTH_BUCKET = re.compile(r'^mlxcel_spec_decode_width_bucket\{le="(\d+)"\} (\S+)$', re.M)
PLAIN_STEPS = re.compile(r"^mlxcel_spec_decode_plain_steps_total (\S+)$", re.M)


@dataclass
class Stream:
    """What one streaming request received: its bytes, and (time, bytes so far) at each recv."""

    sent: float
    received: bytearray = field(default_factory=bytearray)
    arrivals: list[tuple[float, int]] = field(default_factory=list)


@dataclass
class Cell:
    """One arm at one client count, summed over its waves."""

    tokens: int = 0
    seconds: float = 0.0
    first_token_s: list[float] = field(default_factory=list)
    inter_token_s: list[float] = field(default_factory=list)
    tested: int = 0  # speculative positions tested and drafts accepted (timings.speculative)
    accepted: int = 0
    widths: dict[int, int] = field(default_factory=dict)  # verify rounds by width (the server's /metrics)
    plain_steps: int = 0  # drafting rows' steps at width 0

    @property
    def tokens_per_second(self) -> float:
        return self.tokens / self.seconds if self.seconds else 0.0

    @property
    def per_position_acceptance(self) -> float:
        return self.accepted / self.tested if self.tested else 0.0

    def width_summary(self) -> str:
        """Mean width over every step of the drafting rows, and the share of plain steps."""
        steps = sum(self.widths.values()) + self.plain_steps
        if not steps:
            return ""
        mean = sum(w * n for w, n in self.widths.items()) / steps
        return f"{mean:.1f} ({100 * self.plain_steps / steps:.0f} %)"


@dataclass(frozen=True)
class Rounds:
    """A server's width counters (/metrics) at one moment."""

    widths: dict[int, int]
    plain_steps: int

    @classmethod
    def scrape(cls, url: str) -> Rounds:
        return cls.parse(httpx.get(f"{url}/metrics", timeout=30).text)

    @classmethod
    def parse(cls, text: str) -> Rounds:
        """From /metrics' exposition: the width histogram's cumulative buckets, the plain steps."""
        cumulative = sorted((int(w), float(count)) for w, count in WIDTH_BUCKET.findall(text))
        widths, below = {}, 0.0
        for width, count in cumulative:
            widths[width], below = int(count - below), count
        plain = PLAIN_STEPS.search(text)
        return cls(widths, int(float(plain.group(1))) if plain else 0)

    def since(self, earlier: Rounds, cell: Cell) -> None:
        """Add the rounds between `earlier` and this to `cell`."""
        for width, count in self.widths.items():
            if moved := count - earlier.widths.get(width, 0):
                cell.widths[width] = cell.widths.get(width, 0) + moved
        cell.plain_steps += self.plain_steps - earlier.plain_steps


def request_body(prompt: str, n: int, arm: str, temperature: float = 0.0) -> bytes:
    """One streaming request; a sampled one is seeded by its prompt, so every arm draws the same."""
    fields = {"prompt": prompt, "max_tokens": n, "temperature": temperature, "stream": True,
              "stream_options": {"include_usage": True}}  # fmt: skip
    if arm != MLX_LM:  # mlx_lm.server ignores EOS through its wrapper; its frames carry one token each
        fields |= {"ignore_eos": True, "timings_per_token": True, "speculative_diagnostics": True}
    if temperature > 0:  # the same draws in every arm: a seed per prompt
        fields["seed"] = SEED + HELD_OUT_CODE.index(prompt)
    return json.dumps(fields).encode()


def arm_settings(arm: str) -> tuple[str, dict[str, str]]:
    """An arm's profile and the environment its server runs with (its variants, its fixed widths,
    MLX's own kernels)."""
    base = arm.removesuffix(FIXED).removesuffix(FAST)
    profile, *variants = base.split(VARIANT)
    env = FIXED_WIDTH if arm.endswith(FIXED) else FAST_PATH if arm.endswith(FAST) else {}
    for variant in variants:
        env = env | VARIANTS[variant]
    return profile, env


def wave(url: str, bodies: list[bytes]) -> tuple[list[Stream], float]:
    """Send every request at once and read all streams from one thread: on a two-core machine the
    client shares the cores with the servers, so it only collects bytes and parses afterwards."""
    host, port = url.removeprefix("http://").split(":")
    selector = selectors.DefaultSelector()
    streams = []
    start = time.perf_counter()
    for body in bodies:
        connection = socket.create_connection((host, int(port)))
        head = (f"POST /v1/completions HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n"
                f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n")  # fmt: skip
        streams.append(Stream(time.perf_counter()))
        connection.sendall(head.encode() + body)
        selector.register(connection, selectors.EVENT_READ, streams[-1])
    while selector.get_map():
        for key, _ in selector.select():
            chunk = key.fileobj.recv(1 << 16)
            if chunk:
                key.data.received += chunk
                key.data.arrivals.append((time.perf_counter(), len(key.data.received)))
            else:
                selector.unregister(key.fileobj)
                key.fileobj.close()
    return streams, time.perf_counter() - start


def record(cell: Cell, stream: Stream, n: int) -> None:
    """Add one stream's tokens, first-token time and per-token gaps to `cell`."""
    times, ends = [t for t, _ in stream.arrivals], [size for _, size in stream.arrivals]
    usage, counted, last = None, 0, None
    for match in FRAME.finditer(stream.received):
        payload = json.loads(match.group(1))
        at = times[bisect_left(ends, match.end())]
        usage = payload.get("usage") or usage
        if speculative := payload.get("timings", {}).get("speculative"):  # the final frame's, once
            cell.tested += speculative["positions_tested"]
            cell.accepted += speculative["accepted"]
        if "timings" in payload:
            delivered = payload["timings"]["predicted_n"] - counted
        else:
            delivered = int(any(choice.get("text") for choice in payload.get("choices", [])))
        if not delivered:
            continue
        if last is None:
            cell.first_token_s.append(at - stream.sent)
        else:
            cell.inter_token_s += [(at - last) / delivered] * delivered
        last, counted = at, counted + delivered
    if usage is None or usage["completion_tokens"] != n:
        raise RuntimeError(f"expected {n} tokens, got {usage}: {bytes(stream.received[-300:])!r}")
    cell.tokens += n


def waves_of(clients: int, offset: int) -> list[list[str]]:
    """Every held-out prompt at least once, in waves of `clients` concurrent requests."""
    count = clients * math.ceil(len(HELD_OUT_CODE) / clients)
    prompts = [HELD_OUT_CODE[(offset + i) % len(HELD_OUT_CODE)] for i in range(count)]
    return [prompts[i : i + clients] for i in range(0, count, clients)]


def mlx_lm_command(max_clients: int, target: Path) -> list[str]:
    width = str(max_clients)
    return [sys.executable, "-m", "ops.bench.mlx_lm_server", "--model", str(target),
            "--decode-concurrency", width, "--prompt-concurrency", width, "--prompt-cache-size", "0",
            "--log-level", "WARNING"]  # fmt: skip


def measure(
    urls: dict[str, str], clients: list[int], n: int, repeats: int, temperature: float = 0.0
) -> dict[tuple[str, int], Cell]:
    arms = [arm for arm in urls if temperature == 0 or arm != MLX_LM]
    stage(f"warming up every arm (T = {temperature:g})")
    for arm in arms:  # load, compile and size the caches before timing anything
        wave(urls[arm], [request_body(p, WARMUP_TOKENS, arm, temperature) for p in waves_of(max(clients), 0)[0]])
    cells = {(arm, c): Cell() for arm in arms for c in clients}
    turn = 0
    waves = sum(len(waves_of(c, repeat)) for repeat in range(repeats) for c in clients) * len(arms)
    with progress(waves, f"waves at T = {temperature}") as bar:
        for repeat in range(repeats):
            for c in clients:
                for prompts in waves_of(c, repeat):
                    turn += 1
                    for arm in arms[turn % len(arms) :] + arms[: turn % len(arms)]:
                        before = Rounds.scrape(urls[arm]) if arm != MLX_LM else None
                        streams, seconds = wave(urls[arm], [request_body(p, n, arm, temperature) for p in prompts])
                        cells[arm, c].seconds += seconds
                        for stream in streams:
                            record(cells[arm, c], stream, n)
                        if before is not None:
                            Rounds.scrape(urls[arm]).since(before, cells[arm, c])
                        bar.update()
    return cells


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[max(0, math.ceil(q * len(ordered)) - 1)] if ordered else math.nan


def spread(seconds: list[float], spec: str) -> str:
    """p50 / p95 in milliseconds."""
    return f"{percentile(seconds, 0.5) * 1e3:{spec}} / {percentile(seconds, 0.95) * 1e3:{spec}}"


def ratio(a: Cell | None, b: Cell | None) -> str:
    return f"{a.tokens_per_second / b.tokens_per_second:.2f}x" if a and b and b.tokens_per_second else ""


def fixed_arms(profiles: list[str]) -> list[str]:
    """The fixed-width arm of every profile with a drafter."""
    return [profile + FIXED for profile in profiles if profile != TARGET_ONLY]


def fast_arms(profiles: list[str]) -> list[str]:
    """The fast-path arm of every profile."""
    return [profile + FAST for profile in profiles]


def exactness_price(cells: dict[tuple[str, int], Cell]) -> list[str]:
    """Issue 35: each profile's fast-path throughput over its exact one's, by clients."""
    lines = []
    for arm in dict.fromkeys(arm for arm, _ in cells):
        if (arm + FAST, 1) not in cells:
            continue
        prices = [
            (c, cells[arm + FAST, c].tokens_per_second / cells[arm, c].tokens_per_second)
            for c in sorted(c for a, c in cells if a == arm)
            if (arm + FAST, c) in cells and cells[arm, c].tokens_per_second
        ]
        met = all(price <= EXACTNESS_PRICE for _, price in prices)
        listed = ", ".join(f"{c}: {price:.2f}x" for c, price in prices)
        lines.append(f"- the price of exactness, `{arm}{FAST}` over `{arm}` by clients: {listed} "
                     f"(goal ≤ {EXACTNESS_PRICE}x: {'met' if met else 'missed'}).")  # fmt: skip
    return lines


def target_only_goals(cells: dict[tuple[str, int], Cell]) -> list[str]:
    """Issue 35's goals for target-only at the widest wave, where this run measured them."""
    widest = max((c for a, c in cells if a == TARGET_ONLY), default=0)
    ours, one, theirs = cells.get((TARGET_ONLY, widest)), cells.get((TARGET_ONLY, 1)), cells.get((MLX_LM, widest))
    if widest < 2 or not (ours and one):
        return []
    lines = [
        f"- `{TARGET_ONLY}` single stream: {one.tokens_per_second:.0f} tokens/s (goal ≥ 250 on the 1.2 B target); "
        f"{widest} clients against 1: {ratio(ours, one)} (goal ≥ 6x)."
    ]
    if theirs:
        ttft = percentile(ours.first_token_s, 0.95) / percentile(theirs.first_token_s, 0.95)
        lines.append(
            f"- `{TARGET_ONLY}` against `{MLX_LM}` at {widest} clients: {ratio(ours, theirs)} (goal ≥ 2x, "
            f"≥ 1.5x 4-bit); time to first token p95 {ttft:.2f}x theirs (goal ≤ 1x)."
        )
    return lines


def goodput_goals(cells: dict[tuple[str, int], Cell]) -> list[str]:
    """Issue 36: each profile against the better of target-only and its fixed-width arm at every
    client count, and at one client against target-only."""
    lines = []
    for arm in dict.fromkeys(arm for arm, _ in cells):
        if (arm + FIXED, 1) not in cells:
            continue
        ratios = []
        for c in sorted(c for a, c in cells if a == arm):
            rivals = [cells[k] for k in ((TARGET_ONLY, c), (arm + FIXED, c)) if k in cells]
            best = max(rivals, key=lambda cell: cell.tokens_per_second)
            ratios.append(
                (c, cells[arm, c].tokens_per_second / best.tokens_per_second if best.tokens_per_second else 0)
            )
        met = all(r >= GOODPUT_GOAL for _, r in ratios)
        listed = ", ".join(f"{c}: {r:.2f}x" for c, r in ratios)
        lines.append(f"- `{arm}` against the better of target-only and `{arm}{FIXED}` by clients: {listed} "
                     f"(goal ≥ {GOODPUT_GOAL}x at every count: {'met' if met else 'missed'}).")  # fmt: skip
        if (TARGET_ONLY, 1) in cells and (arm, 1) in cells:
            single = ratio(cells[arm, 1], cells[TARGET_ONLY, 1])
            lines.append(
                f"- `{arm}` at 1 client against target-only: {single} (goal on the H200 ≥ {SINGLE_STREAM_GOAL}x)."
            )
    return lines


def coupling_goals(cells: dict[tuple[str, int], Cell]) -> list[str]:
    """Issue 39, at 8 clients: each profile's coupled sampler-match against its stochastic variant."""
    lines = []
    for arm in dict.fromkeys(arm for arm, _ in cells):
        rival = cells.get((arm + STOCHASTIC, GOAL_CLIENTS))
        cell = cells.get((arm, GOAL_CLIENTS))
        if rival is None or cell is None or not (rival.tested and rival.tokens_per_second):
            continue
        acceptance = cell.per_position_acceptance / rival.per_position_acceptance
        speed = cell.tokens_per_second / rival.tokens_per_second
        lines.append(
            f"- `{arm}` against `{arm}{STOCHASTIC}` at {GOAL_CLIENTS} clients: per-position acceptance "
            f"{cell.per_position_acceptance:.3f} against {rival.per_position_acceptance:.3f}, {acceptance:.2f}x "
            f"(goal ≥ {ACCEPTANCE_GOAL}x: {'met' if acceptance >= ACCEPTANCE_GOAL else 'missed'}); aggregate "
            f"tokens/s {speed:.2f}x (goal ≥ {SPEED_GOAL}x: {'met' if speed >= SPEED_GOAL else 'missed'})."
        )
    return lines


def goals(cells: dict[tuple[str, int], Cell]) -> list[str]:
    """Issue 12's goals for the default profile at 8 clients, and issue 36's, where this run measured them."""
    one, eight, theirs = cells.get(("default", 1)), cells.get(("default", 8)), cells.get((MLX_LM, 8))
    if not (one and eight):
        return target_only_goals(cells) + exactness_price(cells) + goodput_goals(cells) + coupling_goals(cells)
    spread = percentile(eight.inter_token_s, 0.95) / percentile(one.inter_token_s, 0.95)
    lines = [
        f"- default profile, 8 clients against 1: {ratio(eight, one)} aggregate (goal ≥ 3x); "
        f"p95 inter-token latency {spread:.2f}x (goal ≤ 2x)."
    ]
    if theirs:
        lines.append(f"- default profile against `mlx_lm.server` at 8 clients: {ratio(eight, theirs)} (goal ≥ 1.5x).")
    return lines + target_only_goals(cells) + exactness_price(cells) + goodput_goals(cells) + coupling_goals(cells)


def cell_table(cells: dict[tuple[str, int], Cell]) -> str:
    arms = list(dict.fromkeys(arm for arm, _ in cells))
    clients = sorted({c for _, c in cells})
    rows = []
    for arm in arms:
        for c in clients:
            cell = cells[arm, c]
            rows.append([arm if arm == MLX_LM else f"`{arm}` profile", str(c), f"{cell.tokens_per_second:.1f}",
                         ratio(cell, cells.get((arm, 1))), ratio(cell, cells.get((MLX_LM, c))),
                         ratio(cell, cells.get((TARGET_ONLY, c))), cell.width_summary(),
                         spread(cell.inter_token_s, ".1f"), spread(cell.first_token_s, ".0f"),
                         f"{cell.per_position_acceptance:.3f}" if cell.tested else ""])  # fmt: skip
    header = ["arm", "clients", "aggregate tokens/s", "vs own 1 client", f"vs {MLX_LM}", "vs target-only",
              "mean width (plain steps)", "inter-token ms p50 / p95", "first token ms p50 / p95",
              "per-position acceptance"]  # fmt: skip
    return table(header, rows)


def render(
    cells: dict[tuple[str, int], Cell], n: int, repeats: int, note: str = "",
    sampled: dict[float, dict[tuple[str, int], Cell]] | None = None, target: str | None = None,
) -> str:  # fmt: skip
    """The section: the T = 0 table and goals, then each sampled temperature's (`sampled`); `target`
    names the target every arm served (`--target`; None: the profiles' own)."""
    served = f" Every arm on the target `{target}`, with its profile's drafter." if target else ""
    intro = (
        f"{machine()}.{served} Waves of concurrent streaming `/v1/completions` clients over the "
        f"{len(HELD_OUT_CODE)} held-out code prompts, {n} tokens each, EOS ignored, {repeats} repeats, "
        f"arms interleaved wave by wave. `{MLX_LM}` 0.32.2 runs the same target in the dtype our loader "
        "picks (float32 for small models on the CPU, the checkpoint's own on a GPU) on the same BLAS, "
        "batching up to the largest client count (`--decode-concurrency`, `--prompt-concurrency`), "
        "prompt cache off. Inter-token latency spreads each frame's gap over the tokens it carries; the "
        "mean width is over every step of the drafting rows (plain steps: width 0)."
    )
    title = "## Concurrent streaming clients (`ops/bench/concurrency.py`)"
    title += f", `--target {target}`" if target else ""
    parts = [title, "", intro, ""]
    parts += [note, ""] if note else []
    parts += ["T = 0:", "", cell_table(cells), "", *goals(cells)] if cells else []
    for temperature, hot in (sampled or {}).items():
        parts += ["", f"T = {temperature}, each request seeded (its prompt's seed in every arm):", "", cell_table(hot),
                  "", *goodput_goals(hot), *coupling_goals(hot)]  # fmt: skip
    return "\n".join(parts)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    def numbers(text: str) -> list[int]:
        return sorted({int(part) for part in text.split(",")})

    parser = arguments("concurrency", __doc__)
    parser.add_argument("--clients", type=numbers, default=[1, 2, 4, 8, 16], help="client counts, e.g. 1,2,4,8")
    parser.add_argument("--tokens", type=int, default=64, help="tokens per request")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument(
        "--temperatures",
        type=lambda text: sorted({float(t) for t in text.split(",")}),
        default=[0.0],
        help="e.g. 0,0.7: the waves once per temperature (above 0 seeded)",
    )
    parser.add_argument("--sampled-clients", type=numbers, default=[1, 8, 16],
                        help="client counts at temperatures above 0")  # fmt: skip
    parser.add_argument(
        "--profiles",
        type=lambda text: text.split(","),
        default=PROFILES,
        help=f"profiles, each with optional variants: PROFILE{VARIANT}VARIANT ({', '.join(VARIANTS)})",
    )
    parser.add_argument(
        "--target", help=f"a model directory, {RANDOM_1_2B} or {GROWN_1_2B} (built first); default: the embedded"
    )
    parser.add_argument("--no-fixed", action="store_true", help=f"leave the fixed-width arms (PROFILE{FIXED}) out")
    parser.add_argument("--no-fast", action="store_true", help=f"leave the fast-path arms (PROFILE{FAST}) out")
    parser.add_argument("--no-mlx-lm", action="store_true", help=f"leave {MLX_LM} out")
    parser.add_argument("--note", default="", help="a line for the section (e.g. the machine's state)")
    parser.add_argument("--write", action="store_true", help=WRITE_HELP)
    parser.add_argument("--json", type=Path, help="also write each cell's figures (for plot.py)")
    parser.add_argument("--logs", type=Path, help="keep each arm's events in DIR/ARM.jsonl at debug level (tick_timed)")
    return parser.parse_args(argv)


@dataclass(frozen=True)
class Target:
    """The target every arm serves (`path`; None: each profile's own), and the grown block drafters
    that read it, by the name of the embedded drafter each was grown from."""

    path: Path | None
    drafters: dict[str, Path] = field(default_factory=dict)

    @property
    def directory(self) -> Path:
        return self.path or EMBEDDED_TARGET

    def flags(self, profile: str) -> list[str]:
        """`-m` for another target, and `-md` for the grown copy of the profile's embedded block drafter."""
        if self.path is None:
            return []
        _, model = profile_drafter(profile)
        grown = self.drafters.get(model.name) if model is not None and model.parent == EMBEDDED.resolve() else None
        return ["-m", str(self.path), *([] if grown is None else ["-md", str(grown)])]


def target_of(name: str | None, scratch: Path) -> Target:
    """`--target`'s target, built into `scratch` where it is built."""
    if name is None:
        return Target(None)
    if name == RANDOM_1_2B:
        return Target(build_random_target(scratch / RANDOM_1_2B, **SIZE_1_2B))
    if name == GROWN_1_2B:
        grown = build_grown_1_2b(scratch / GROWN_1_2B)
        return Target(grown.target, grown.drafters)
    return Target(Path(name).resolve())


def started(servers: ExitStack, managers: dict[str, AbstractContextManager[tuple[str, object]]]) -> dict[str, str]:
    """Every server started at once (their loads and warm-ups overlap), each stopped with `servers`;
    their URLs by arm. One that fails (`spawned_server`: unhealthy, or not serving its drafter)
    stops the bench with its error once the others are up."""
    with ThreadPoolExecutor(len(managers)) as pool:
        entering = {arm: pool.submit(manager.__enter__) for arm, manager in managers.items()}
    urls, failures = {}, []
    for arm, future in entering.items():
        try:
            urls[arm] = future.result()[0]
        except Exception as exc:  # the first is raised below, once the others are up (and then stopped)
            failures.append(exc)
            continue
        servers.push(managers[arm].__exit__)
    if failures:
        raise failures[0]
    return urls


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    with ExitStack() as servers:
        target = target_of(args.target, Path(servers.enter_context(tempfile.TemporaryDirectory())))
        # as many rows as the widest wave, as mlx_lm.server batches up to it (server.max_rows is 8 by default)
        widest = max(args.clients + (args.sampled_clients if any(args.temperatures) else []))
        managers = {}
        arms = args.profiles + ([] if args.no_fixed else fixed_arms(args.profiles))
        if args.logs:
            args.logs.mkdir(parents=True, exist_ok=True)  # the server refuses a log file in no folder
        for arm in arms + ([] if args.no_fast else fast_arms(args.profiles)):
            profile, env = arm_settings(arm)
            log = "stderr"
            if args.logs:  # each arm's events, the tick's parts included (docs/log-events.md `tick_timed`)
                log = str(args.logs / f"{re.sub(r'[^A-Za-z0-9-]', '_', arm)}.jsonl")
                env = {**env, "MLXCEL_LOGGING__LEVEL": "debug"}
            flags = ["--parallel", str(widest), *target.flags(profile)]
            managers[arm] = spawned_server(profile, log, flags, env)
        if not args.no_mlx_lm:
            # mlx_lm.server initialises mx.distributed, which needs more of the environment than PATH
            managers[MLX_LM] = spawned(mlx_lm_command(widest, target.directory), dict(os.environ))
        stage(f"starting {len(managers)} servers together: {', '.join(managers)}")
        urls = started(servers, managers)
        runs = {}
        for t in args.temperatures:
            runs[t] = measure(urls, args.clients if t == 0 else args.sampled_clients, args.tokens, args.repeats, t)
            # each temperature's table as soon as it is measured: a run cut short keeps what it measured
            print(render(runs[0.0] if t == 0 else {}, args.tokens, args.repeats, sampled={t: runs[t]} if t else None),
                  file=sys.stderr, flush=True)  # fmt: skip
    cells = runs.pop(0.0, {})
    body = render(cells, args.tokens, args.repeats, args.note, sampled=runs, target=args.target)
    print(body)
    if args.json:
        args.json.write_text(json.dumps(figures({0.0: cells, **runs} if cells else runs), indent=1))
    if args.write:
        write_section(section_name("concurrency", args.target), body)


def figures(runs: dict[float, dict[tuple[str, int], Cell]]) -> dict:
    """What plot.py reads: per temperature, each arm's aggregate tokens/s and mean width by clients
    (`tokens_per_second` also at the top: the T = 0 run's, or the first)."""

    def by_arm(cells: dict[tuple[str, int], Cell], value) -> dict:  # noqa: ANN001
        return {arm: {c: value(cells[arm, c]) for a, c in cells if a == arm} for arm, _ in cells}

    per_temperature = {
        str(t): {"tokens_per_second": by_arm(cells, lambda cell: cell.tokens_per_second),
                 "mean_width": by_arm(cells, lambda cell: cell.width_summary())}
        for t, cells in runs.items()
    }  # fmt: skip
    first = next(iter(per_temperature.values()), {"tokens_per_second": {}})
    return {"machine": machine(), "tokens_per_second": first["tokens_per_second"], "runs": per_temperature}


if __name__ == "__main__":
    main()
