"""A PNG of aggregate tokens/s against concurrent clients, per arm, one panel per run.

Reads the files `python -m ops.bench.concurrency --json FILE` writes (one per device, say) and
draws them side by side, clients on a log2 axis, so where speculation stops paying shows as arms
crossing:

    python -m ops.bench.plot --out docs/concurrency.png cpu.json gpu.json [--titles CPU,H200]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only: no display on a server or in CI
import matplotlib.pyplot as plt


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("runs", nargs="+", type=Path, help="files of ops.bench.concurrency --json")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--titles", type=lambda text: text.split(","), help="one per run (default: its machine)")
    args = parser.parse_args(argv)
    runs = [json.loads(path.read_text()) for path in args.runs]
    titles = args.titles or [run["machine"] for run in runs]
    figure, axes = plt.subplots(1, len(runs), figsize=(6 * len(runs), 4.5), squeeze=False)
    for axis, run, title in zip(axes[0], runs, titles, strict=True):
        for arm, by_clients in run["tokens_per_second"].items():
            clients = sorted(by_clients, key=int)
            axis.plot([int(c) for c in clients], [by_clients[c] for c in clients], marker="o", label=arm)
        axis.set_xscale("log", base=2)
        axis.set_xlabel("concurrent clients")
        axis.set_ylabel("aggregate tokens/s")
        axis.set_title(title, fontsize=9)
        axis.grid(True, alpha=0.3)
        axis.legend(fontsize=8)
    figure.tight_layout()
    figure.savefig(args.out, dpi=110)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
