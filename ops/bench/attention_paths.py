"""Wide forwards on the GPU: what a width-w forward costs against a width-1 step, and whether it
gives the bits of w single steps, for each attention path and forward-width policy.

    python -m ops.bench.attention_paths [--big] [--write] [--json OUT]

Three parts, one JSON line per measurement (the tables in docs/gpu.md come from these):
1. `matmul`: is row i of an M-row product `x @ W.T` bit-equal to the one-row product, per M?
2. `attention`: one attention call of L queries against a key length that grows every call (as
   while decoding), per path: MLX's fused kernel, plain ops (matmul + mask + softmax), the fused
   kernel over keys bucketed to 256 with an explicit mask (so the shape repeats), plain ops under
   `mx.compile`, and the project's row kernel (`app/execution/row_invariant.py`).
3. `runner`: `ModelRunner` forwards of width w plus a rewind of w - 1 rows, with MLX's kernels and
   with the row-invariant ones, and the exactness probe's verdict for widths 5, 8 and 16.
`--big` adds a random-weight bf16 Qwen3 of hidden 2048 x 24 layers beside the embedded target.
Off CUDA (CPU, Metal) the row kernels do not exist; those rows are skipped.
"""

from __future__ import annotations

# isort: off
from ops.bench.common import machine, table, write_section  # first: sets up MLX's BLAS

# isort: on
import argparse
import json
import time
from collections.abc import Callable
from pathlib import Path

import mlx.core as mx
import mlx.nn as nn

from app.decoding import exactness
from app.execution import row_invariant
from app.execution.device import backend
from app.execution.model import load_model
from app.execution.prepare import prepare
from app.execution.runner import ModelRunner
from app.loading import EMBEDDED_TARGET

WIDTHS = (1, 2, 5, 8, 16)
STEPS = 40


def emit(sink: list[dict], **record: object) -> None:
    line = json.dumps(record)
    sink.append(json.loads(line))  # what was printed (integer keys become strings), for report()
    print(line, flush=True)


def big_model(exact: bool = True) -> nn.Module:
    from mlx_lm.models import qwen3

    config = json.loads((EMBEDDED_TARGET / "config.json").read_text())
    config.update(
        hidden_size=2048,
        intermediate_size=6144,
        num_hidden_layers=24,
        num_attention_heads=16,
        num_key_value_heads=4,
        head_dim=128,
        layer_types=["full_attention"] * 24,
    )
    model = qwen3.Model(qwen3.ModelArgs.from_dict(config))
    model.set_dtype(mx.bfloat16)
    mx.eval(model.parameters())
    prepare(model, exact=exact)  # the row-invariant kernels on CUDA where exact, as load_model does
    return model


def matmul_rows(sink: list[dict], label: str, shapes: list[tuple[int, int]], dtype: mx.Dtype) -> None:
    mx.random.seed(0)
    for k, n in shapes:
        weight = mx.random.normal((n, k)).astype(dtype)
        x = mx.random.normal((16, k)).astype(dtype)
        single = mx.concatenate([x[i : i + 1] @ weight.T for i in range(16)])
        verdict = {}
        for m in (1, 2, 3, 4, 5, 8, 16):
            wide = x[:m] @ weight.T
            verdict[m] = mx.abs(wide.astype(mx.float32) - single[:m].astype(mx.float32)).max().item()
        emit(sink, part="matmul", model=label, k=k, n=n, max_diff_vs_one_row_by_m=verdict)
        if backend().row_invariant_kernels and row_invariant.matmul_applies(x, weight):
            row_kernel_rows(sink, label, x, weight, single)


def row_kernel_rows(sink: list[dict], label: str, x: mx.array, weight: mx.array, single: mx.array) -> None:
    """The row kernel: equal rows whatever M, its distance from MLX's one-row product, and cost."""
    ours = mx.concatenate([row_invariant.row_matmul(x[i : i + 1], weight) for i in range(16)])
    same = {m: mx.array_equal(row_invariant.row_matmul(x[:m], weight), ours[:m]).item() for m in (1, 2, 5, 8, 16)}
    wide = mx.random.normal((16, x.shape[1])).astype(x.dtype)
    costs = {}
    for name, product in (
        ("mlx", lambda a: a @ weight.T),
        ("row_kernel", lambda a: row_invariant.row_matmul(a, weight)),
    ):
        costs[name] = {m: cost(lambda m=m, f=product: f(wide[:m])) for m in (1, 2, 5, 8, 16)}
    to_mlx = mx.abs(ours.astype(mx.float32) - single.astype(mx.float32)).max().item()
    emit(
        sink,
        part="matmul",
        model=label,
        k=x.shape[1],
        n=weight.shape[0],
        row_kernel_equal_by_m=same,
        row_kernel_vs_one_row_mlx=to_mlx,
        ms_by_m=costs,
    )


def cost(call: Callable[[], mx.array], repeats: int = 50) -> float:
    """Milliseconds per call, evaluated one at a time (as forwards are)."""
    for _ in range(3):
        mx.eval(call())
    mx.synchronize()
    start = time.perf_counter()
    for _ in range(repeats):
        mx.eval(call())
    mx.synchronize()
    return round((time.perf_counter() - start) / repeats * 1000, 4)


def plain(q: mx.array, k: mx.array, v: mx.array, scale: float, mask: mx.array) -> mx.array:
    b, h, width, d = q.shape
    groups = h // k.shape[1]
    scores = ((q * scale).reshape(b, k.shape[1], groups * width, d) @ k.swapaxes(-1, -2)).astype(mx.float32)
    scores = mx.where(mask, scores.reshape(b, k.shape[1], groups, width, -1), -mx.inf)
    weights = mx.softmax(scores, axis=-1).astype(v.dtype).reshape(b, k.shape[1], groups * width, -1)
    return (weights @ v).reshape(b, h, width, d)


def causal(width: int, keys: int, visible: int) -> mx.array:
    rows = mx.arange(visible - width, visible)[:, None]
    return mx.arange(keys)[None, :] <= rows


def attention_paths(k_buf: mx.array, v_buf: mx.array, scale: float) -> dict[str, Callable]:
    """Each path maps (queries `[1, H, w, D]`, visible key count s) to the attention output."""
    # Shapeless compilation cannot hold the grouped-query reshapes, so each new key length retraces.
    compiled = mx.compile(plain)

    def fused(q: mx.array, s: int) -> mx.array:
        mask = None if q.shape[2] == 1 else "causal"
        return mx.fast.scaled_dot_product_attention(q, k_buf[:, :, :s], v_buf[:, :, :s], scale=scale, mask=mask)

    def bucketed(q: mx.array, s: int) -> mx.array:
        span = -(-s // 256) * 256
        mask = causal(q.shape[2], span, s)
        return mx.fast.scaled_dot_product_attention(q, k_buf[:, :, :span], v_buf[:, :, :span], scale=scale, mask=mask)

    paths = {
        "fused": fused,
        "plain": lambda q, s: plain(q, k_buf[:, :, :s], v_buf[:, :, :s], scale, causal(q.shape[2], s, s)),
        "fused_bucketed_mask": bucketed,
        "plain_compiled": lambda q, s: compiled(q, k_buf[:, :, :s], v_buf[:, :, :s], scale, causal(q.shape[2], s, s)),
    }
    if backend().row_invariant_kernels:
        paths["row_kernel"] = lambda q, s: row_invariant.row_attention(q, k_buf[:, :, :s], v_buf[:, :, :s], scale)
    return paths


def attention(sink: list[dict], label: str, heads: int, kv_heads: int, head_dim: int) -> None:
    mx.random.seed(1)
    q = mx.random.normal((1, heads, 32, head_dim)).astype(mx.bfloat16)
    k_buf = mx.random.normal((1, kv_heads, 4096, head_dim)).astype(mx.bfloat16)
    v_buf = mx.random.normal((1, kv_heads, 4096, head_dim)).astype(mx.bfloat16)
    for name, path in attention_paths(k_buf, v_buf, head_dim**-0.5).items():
        try:
            costs = {}
            for width in WIDTHS:
                s = 300
                for _ in range(3):
                    mx.eval(path(q[:, :, :width], s))
                mx.synchronize()
                start = time.perf_counter()
                for _ in range(STEPS):
                    s += width
                    mx.eval(path(q[:, :, :width], s))
                mx.synchronize()
                costs[width] = round((time.perf_counter() - start) / STEPS * 1000, 3)
            # Query i of a width-5 call against a width-1 call at query i's own key count.
            wide = path(q[:, :, :5], 905).astype(mx.float32)
            single = mx.concatenate([path(q[:, :, i : i + 1], 901 + i) for i in range(5)], axis=2).astype(mx.float32)
            difference = mx.abs(wide - single).max().item()
            emit(sink, part="attention", model=label, path=name, ms_by_width=costs, w5_vs_5x1_max_diff=difference)
        except Exception as exc:  # one path failing (a kernel that does not build) must not end the run
            emit(sink, part="attention", model=label, path=name, error=f"{type(exc).__name__}: {exc}")


def runner_policies(sink: list[dict], label: str, models: dict[str, nn.Module]) -> None:
    """`ModelRunner` forwards through each policy's model: MLX's kernels (prepared with
    `exact=False`) and, on CUDA, the row-invariant ones."""
    for name, model in models.items():
        costs = {}
        for width in WIDTHS:
            runner = ModelRunner(model)
            mx.eval(runner.prefill(list(range(10, 74))))
            tokens = list(range(5, 5 + width))

            def step(runner: ModelRunner = runner, tokens: list[int] = tokens) -> mx.array:
                logits = runner.forward(tokens)
                runner.rewind(len(tokens) - 1)
                return logits

            costs[width] = cost(step, STEPS)
        verdicts = {}
        for width in (5, 8, 16):
            verdict = exactness.probe_width(model, width)
            verdicts[width] = "exact" if verdict.exact else f"row {verdict.position}: {verdict.max_difference:.4g}"
        emit(sink, part="runner", model=label, policy=name, ms_by_width=costs, probe=verdicts)


def report(sink: list[dict], header_line: str) -> str:
    """The records as the markdown section of docs/benchmarks.md."""
    widths = [str(w) for w in WIDTHS]
    attention_rows, runner_rows, matmul_rows_ = [], [], []
    for r in sink:
        if r["part"] == "attention" and "ms_by_width" in r:
            exact = "yes" if r["w5_vs_5x1_max_diff"] == 0 else f"no ({r['w5_vs_5x1_max_diff']:.2g})"
            attention_rows.append([r["model"], r["path"], *(f"{r['ms_by_width'][w]:.3g}" for w in widths), exact])
        elif r["part"] == "runner":
            probe = ", ".join(f"{w}: {v}" for w, v in r["probe"].items())
            runner_rows.append([r["model"], r["policy"], *(f"{r['ms_by_width'][w]:.3g}" for w in widths), probe])
        elif r["part"] == "matmul" and "ms_by_m" in r:
            same = "yes" if all(r["row_kernel_equal_by_m"].values()) else "NO"
            mlx, ours = r["ms_by_m"]["mlx"], r["ms_by_m"]["row_kernel"]
            matmul_rows_.append(
                [
                    r["model"],
                    f"{r['k']} → {r['n']}",
                    f"{mlx['1']:.3g} / {mlx['5']:.3g}",
                    f"{ours['1']:.3g} / {ours['5']:.3g}",
                    same,
                ]
            )
    return "\n\n".join(
        [
            "## Wide forwards on the GPU (`ops/bench/attention_paths.py`)",
            f"{header_line}. ms per call, one call evaluated at a time (host overhead included); "
            "the key length grows by the width every call, as while decoding. *Exact*: query i of a "
            "width-5 call has the bits of a width-1 call at query i's key count; the probe compares a "
            "width-w forward with w single steps, bit for bit.",
            "### Attention, one layer's call",
            table(["model", "path", *(f"w={w}" for w in widths), "exact"], attention_rows),
            "### Matrix products (M = 1 / M = 5)",
            table(["model", "K → N", "MLX ms", "row kernel ms", "rows equal for M = 1…16"], matmul_rows_),
            "### Whole forwards (`ModelRunner`, forward + rewind)",
            table(["model", "kernels", *(f"w={w}" for w in widths), "probe"], runner_rows),
        ]
    )


def main() -> None:
    parser = argparse.ArgumentParser(allow_abbrev=False, description=__doc__.splitlines()[0])
    parser.add_argument("--json", help="also write the records to this file")
    parser.add_argument("--write", action="store_true", help="write the section of docs/benchmarks.md")
    parser.add_argument("--big", action="store_true", help="add a random-weight bf16 Qwen3, hidden 2048 x 24 layers")
    args = parser.parse_args()
    header_line = machine()
    print(header_line, flush=True)
    sink: list[dict] = []

    def policies(load: Callable[[bool], nn.Module]) -> dict[str, nn.Module]:
        exact = {"row-invariant kernels": load(True)} if backend().row_invariant_kernels else {}
        return {"MLX kernels": load(False), **exact}

    models = [
        ("embedded target", policies(lambda exact: load_model(EMBEDDED_TARGET, exact=exact).model), (4, 2, 64),
         [(256, 1024), (256, 4096), (512, 256)]),
    ]  # fmt: skip
    if args.big:
        models.append(
            ("qwen3 2048x24 bf16", policies(big_model), (16, 4, 128), [(2048, 6144), (2048, 4096), (6144, 2048)])
        )
    for label, by_policy, (heads, kv_heads, head_dim), shapes in models:
        model = next(iter(by_policy.values()))
        dtype = next(iter(v.dtype for _, v in nn.utils.tree_flatten(model.parameters())))
        matmul_rows(sink, label, shapes, dtype)
        attention(sink, label, heads, kv_heads, head_dim)
        runner_policies(sink, label, by_policy)
    if args.json:
        Path(args.json).write_text(json.dumps(sink, indent=1))
    body = report(sink, header_line)
    print(body)
    if args.write:
        write_section("attention-gpu" if backend().gpu else "attention-cpu", body)


if __name__ == "__main__":
    main()
