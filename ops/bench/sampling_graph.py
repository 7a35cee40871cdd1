"""What one tick's sampling graph costs the host: R plain sampled rows of one sampler kind, served
as the tick serves them (`Sample.serve`: the rows' logits concatenated, the chain, one stacked
draw of the keys the streams split together), against a greedy tick's argmax.

Each arm builds the graph (`build`: Python), hands it to MLX (`mx.async_eval`: on a GPU the host
encodes every kernel launch here; on the CPU part of the graph already runs) and waits for it
(`wait`), per tick, median over `--ticks` after 20. Arms:
- `greedy`: one argmax over the rows;
- `served`: the tick's path, the chain uncompiled (the CPU's default);
- `compiled`: the same compiled (`MLXCEL_COMPILED_SAMPLING=1`, CUDA's default: app/sampling/draws.py);
- `stacked`: compiled, and the rows' logits handed over already stacked: what the concatenation
  of the rows' logits costs, which the tick still pays.
The served arms' tokens are compared with `served`'s, tick by tick: they must be equal.

    python -m ops.bench.sampling_graph [--rows 16] [--vocab 4096] [--ticks 200] [--temperature 0.7]
"""

from __future__ import annotations

# isort: off
from ops.bench.common import machine  # first: sets up MLX's BLAS

# isort: on
import argparse
import os
import statistics
import time
from collections.abc import Callable

import mlx.core as mx

from app.sampling import RowRng, SamplerPipeline, SamplingParams
from app.sampling.draws import COMPILED_SAMPLING, Sample

WARM = 20  # ticks left out of the medians: traces and kernels are built on the first ones

Arm = Callable[[mx.array, list[RowRng]], mx.array]


def arms(sampler: SamplerPipeline) -> dict[str, Arm]:
    def served(compiled: str) -> Arm:
        def run(logits: mx.array, streams: list[RowRng]) -> mx.array:
            os.environ[COMPILED_SAMPLING] = compiled
            rows = [Sample(logits[r : r + 1], sampler, stream=stream) for r, stream in enumerate(streams)]
            return mx.concatenate([tokens for tokens, _ in Sample.serve(rows)])

        return run

    def stacked(logits: mx.array, streams: list[RowRng]) -> mx.array:
        os.environ[COMPILED_SAMPLING] = "1"
        return Sample(logits, sampler).drawn(logits, None, RowRng.next_keys(streams))[0]

    def greedy(logits: mx.array, streams: list[RowRng]) -> mx.array:
        return mx.argmax(logits, axis=-1)

    return {"greedy": greedy, "served": served("0"), "compiled": served("1"), "stacked": stacked}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        allow_abbrev=False, description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rows", type=int, default=16)
    parser.add_argument("--vocab", type=int, default=4096, help="the embedded pair's")
    parser.add_argument("--ticks", type=int, default=200)
    parser.add_argument("--temperature", type=float, default=0.7, help="the server's other sampling defaults")
    args = parser.parse_args(argv)
    sampler = SamplerPipeline(SamplingParams(temperature=args.temperature), args.vocab)
    mx.random.seed(0)
    outputs = [(mx.random.normal((args.rows, args.vocab)) * 4).astype(mx.bfloat16) for _ in range(8)]
    mx.eval(outputs)
    print(f"{machine()}\n{args.rows} rows, vocabulary {args.vocab}, T = {args.temperature:g}, ms per tick (median):")
    tokens: dict[str, list[list[int]]] = {}
    for name, arm in arms(sampler).items():
        streams = [RowRng(seed) for seed in range(args.rows)]
        parts: list[tuple[float, float, float]] = []
        tokens[name] = []
        for tick in range(args.ticks + WARM):
            logits = outputs[tick % len(outputs)] + 0  # a fresh array each tick, as a forward's output
            mx.eval(logits)
            started = time.perf_counter()
            drawn = arm(logits, streams)
            built = time.perf_counter()
            mx.async_eval(drawn)
            handed = time.perf_counter()
            mx.eval(drawn)
            parts.append((built - started, handed - built, time.perf_counter() - handed))
            tokens[name].append(drawn.tolist())
        build, encode, wait = (statistics.median(p[i] for p in parts[WARM:]) * 1e3 for i in range(3))
        same = tokens[name] == tokens.get("served", tokens[name])
        compared = "" if name == "greedy" else f"; tokens {'equal to' if same else 'DIFFER from'} served's"
        timed = f"build {build:.3f}, async_eval {encode:.3f}, wait {wait:.3f}, total {build + encode + wait:.3f}"
        print(f"  {name:9s} {timed}{compared}")
    os.environ.pop(COMPILED_SAMPLING, None)


if __name__ == "__main__":
    main()
