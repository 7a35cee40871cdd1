"""Helpers shared by the benchmarks: timing arms side by side, and writing docs/benchmarks.md."""

from __future__ import annotations

# isort: off
import app  # first: it routes MLX's matrix products to OpenBLAS before mlx.core loads

# isort: on
import argparse
import platform
import re
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

import mlx.core as mx
from tqdm import tqdm

REPO_ROOT = Path(__file__).resolve().parents[2]

BENCHMARKS_MD = REPO_ROOT / "docs" / "benchmarks.md"
WRITE_HELP = "also write this benchmark's section of docs/benchmarks.md (default: print it only)"


@dataclass
class Arm:
    """One configuration, timed over a prompt set: total tokens and seconds, plus its counters."""

    name: str
    tokens: int = 0
    seconds: float = 0.0
    rounds: int = 0
    accepted: int = 0
    tested: int = 0
    outputs: list[list[int]] = field(default_factory=list)

    @property
    def tokens_per_second(self) -> float:
        return self.tokens / self.seconds if self.seconds else 0.0

    @property
    def mean_accepted_len(self) -> float:
        return self.accepted / self.rounds if self.rounds else 0.0

    @property
    def per_position_acceptance(self) -> float:
        return self.accepted / self.tested if self.tested else 0.0


def timed(arm: Arm, run: Callable[[], tuple[list[int], object | None]]) -> None:
    """Run once, adding wall time (prefill included), tokens and acceptance counters to `arm`."""
    start = time.perf_counter()
    tokens, stats = run()
    arm.seconds += time.perf_counter() - start
    arm.tokens += len(tokens)
    arm.outputs.append(tokens)
    if stats is not None:
        arm.rounds += stats.rounds
        arm.accepted += stats.accepted
        arm.tested += stats.positions_tested


def machine() -> str:
    cpu = "unknown CPU"
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.exists():
        names = re.findall(r"model name\s*:\s*(.+)", cpuinfo.read_text())
        cpu = f"{names[0]} x{len(names)}" if names else cpu
    return (
        f"{datetime.now(UTC):%Y-%m-%d}, {platform.system()} {platform.machine()}, {cpu}, "
        f"MLX {mx.__version__} ({mx.default_device()}), BLAS: {app.BLAS}"
    )


def arguments(suite: str, description: str | None) -> argparse.ArgumentParser:
    """A suite's options, named as `mlxcel bench SUITE` runs it (its --help and usage errors)."""
    formatter = argparse.RawDescriptionHelpFormatter
    return argparse.ArgumentParser(
        allow_abbrev=False, prog=f"mlxcel bench {suite}", description=description, formatter_class=formatter
    )


def progress(total: int, what: str) -> tqdm:
    """A progress bar on stderr, drawn only when stderr is a terminal (tqdm's disable=None), so
    piped or logged runs print the tables alone."""
    return tqdm(total=total, desc=what, unit="run", file=sys.stderr, disable=None, leave=False)


def stage(what: str) -> None:
    """A line on stderr before a step that shows no bar (starting a server, loading and warming
    models, tens of seconds each), only when stderr is a terminal, as the bars."""
    if sys.stderr.isatty():
        tqdm.write(f"mlxcel bench: {what}", file=sys.stderr)


def write_section(name: str, body: str) -> None:
    """Replace (or append) the section between this benchmark's markers in docs/benchmarks.md."""
    start, end = f"<!-- bench:{name}:start -->", f"<!-- bench:{name}:end -->"
    text = BENCHMARKS_MD.read_text() if BENCHMARKS_MD.exists() else "# Benchmarks\n"
    block = f"{start}\n{body.rstrip()}\n{end}"
    if start in text:
        text = re.sub(re.escape(start) + ".*?" + re.escape(end), lambda _: block, text, flags=re.S)
    else:
        text = text.rstrip() + "\n\n" + block + "\n"
    BENCHMARKS_MD.write_text(text)


BUILT_TARGETS = ("random-1.2b", "grown-1.2b")  # `--target` names of targets a bench builds first


def section_name(base: str, target: str | None = None) -> str:
    """A section's marker name in docs/benchmarks.md: `base` for the embedded pair (or a model
    directory); on a built target its name and the device follow (`concurrency-grown-1.2b-gpu`),
    so a run on one never replaces the embedded pair's section."""
    if target not in BUILT_TARGETS:
        return base
    return f"{base}-{target}" + ("-gpu" if mx.default_device().type == mx.DeviceType.gpu else "")


def table(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines)
