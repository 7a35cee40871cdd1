"""A PNG of aggregate tokens/s against concurrent clients, per arm, one panel per run and temperature.

Reads the files `python -m ops.bench.concurrency --json FILE` writes (one per device, say) and
draws them side by side, a row of panels per file (one panel per temperature it measured),
clients on a log2 axis, so where speculation stops paying shows as arms crossing:

    python -m ops.bench.plot --out docs/concurrency-widths.png cpu.json gpu.json [--titles CPU,H200]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only: no display on a server or in CI
import matplotlib.pyplot as plt


def panels(run: dict) -> list[tuple[str, dict]]:
    """(temperature label, arm -> clients -> tokens/s) of each temperature a file holds."""
    if "runs" not in run:  # a file written before the sampled runs
        return [("", run["tokens_per_second"])]
    return [(f"T = {t}", figures["tokens_per_second"]) for t, figures in run["runs"].items()]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        allow_abbrev=False, description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("runs", nargs="+", type=Path, help="files of ops.bench.concurrency --json")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--titles", type=lambda text: text.split(","), help="one per run (default: its machine)")
    args = parser.parse_args(argv)
    runs = [json.loads(path.read_text()) for path in args.runs]
    titles = args.titles or [run["machine"] for run in runs]
    columns = max(len(panels(run)) for run in runs)
    figure, axes = plt.subplots(len(runs), columns, figsize=(6 * columns, 4.5 * len(runs)), squeeze=False)
    for row, run, title in zip(axes, runs, titles, strict=True):
        for axis, (temperature, by_arm) in zip(row, panels(run), strict=False):
            for arm, by_clients in by_arm.items():
                clients = sorted(by_clients, key=int)
                style = "--" if arm.endswith("@fixed") else "-"
                axis.plot([int(c) for c in clients], [by_clients[c] for c in clients], style, marker="o", label=arm)
            axis.set_xscale("log", base=2)
            axis.set_xlabel("concurrent clients")
            axis.set_ylabel("aggregate tokens/s")
            axis.set_title(f"{title} {temperature}".strip(), fontsize=9)
            axis.grid(True, alpha=0.3)
            axis.legend(fontsize=8)
        for axis in row[len(panels(run)) :]:
            axis.set_visible(False)
    figure.tight_layout()
    figure.savefig(args.out, dpi=110)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
