"""The embedded pair as bf16, 8-bit and 4-bit: decode speed alone and with its drafter, and whether
speculation changes the output (docs/bring-your-own-model.md, "What quantized models cost").

Both models are converted with mlx-lm (affine, group size 64, as `mlx_lm convert -q --q-bits N`)
into a scratch directory, then loaded as the server loads them (app/execution/model.py: the
device decides the compute dtype). Every arm runs the same held-out code prompts, interleaved
prompt by prompt, for the same number of tokens at T = 0 with EOS ignored, timed wall-clock
including prefill.
"""

from __future__ import annotations

# isort: off
from ops.bench.common import WRITE_HELP, Arm, arguments, machine, progress, stage, table, timed, write_section

# isort: on
import contextlib
import io
import tempfile
from pathlib import Path

from mlx_lm import convert

from app.decoding.builder import LoopBuilder
from app.decoding.plan import LoopPlan
from app.execution.device import backend
from app.execution.model import load_model
from app.loading import EMBEDDED_DRAFTER, EMBEDDED_TARGET
from ops.bench.prompts import HELD_OUT_CODE
from ops.bench.speculative import GREEDY, ours

PRECISIONS = ("bf16", "8-bit", "4-bit")


def pair(precision: str, scratch: Path) -> tuple[Path, Path]:
    """The embedded target and drafter at `precision` (converted into `scratch` unless bf16)."""
    if precision == "bf16":
        return EMBEDDED_TARGET, EMBEDDED_DRAFTER
    bits = int(precision.split("-")[0])
    paths = []
    for source in (EMBEDDED_TARGET, EMBEDDED_DRAFTER):
        path = scratch / f"{source.name}-{bits}bit"
        with contextlib.redirect_stdout(io.StringIO()):  # mlx-lm prints its steps; stdout is the table's
            convert(hf_path=str(source), mlx_path=str(path), quantize=True, q_bits=bits, q_group_size=64)
        paths.append(path)
    return paths[0], paths[1]


def megabytes(path: Path) -> float:
    return sum(f.stat().st_size for f in path.glob("*.safetensors")) / 1e6


def main(argv: list[str] | None = None) -> None:
    parser = arguments("quantized", __doc__)
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--k", type=int, default=4, help="the draft model's width")
    parser.add_argument("--precisions", nargs="+", choices=PRECISIONS, default=list(PRECISIONS))
    parser.add_argument("--note", default="", help="a line for the section (e.g. the machine's state)")
    parser.add_argument("--write", action="store_true", help=WRITE_HELP)
    args = parser.parse_args(argv)
    rows = []
    with tempfile.TemporaryDirectory() as scratch:
        for precision in args.precisions:
            stage(f"converting and loading the embedded pair as {precision}")
            target_dir, drafter_dir = pair(precision, Path(scratch))
            target, drafter = load_model(target_dir), load_model(drafter_dir, role="drafter")
            prompts = [target.tokenizer.encode(p) for p in HELD_OUT_CODE]
            builders = {
                "target alone": LoopBuilder(target, None, LoopPlan()),
                "with its drafter": LoopBuilder(
                    target, drafter, LoopPlan(drafter_kind="draft-model", num_draft_tokens=args.k)
                ),
            }
            arms = {name: Arm(name) for name in builders}
            stage(f"warming up {precision}")
            for builder in builders.values():  # untimed: kernels compile on first use on a GPU
                ours(builder, prompts[0][:8], GREEDY, 4, 0)()
            with progress(args.repeats * len(prompts) * len(arms), f"{precision} runs") as bar:
                for repeat in range(args.repeats):
                    for i, prompt in enumerate(prompts):
                        names = list(arms) if (i + repeat) % 2 == 0 else list(arms)[::-1]
                        for name in names:
                            timed(arms[name], ours(builders[name], prompt, GREEDY, args.tokens, 1000 * repeat + i))
                            bar.update()
            alone, drafted = arms["target alone"], arms["with its drafter"]
            rows.append(
                [
                    precision,
                    f"{megabytes(target_dir):.1f} MB",
                    f"{alone.tokens_per_second:.1f}",
                    f"{drafted.tokens_per_second:.1f}",
                    f"{drafted.tokens_per_second / alone.tokens_per_second:.2f}x",
                    f"{drafted.mean_accepted_len:.2f}",
                    "byte-identical" if drafted.outputs == alone.outputs else "DIFFERS",
                ]
            )
    header = ["embedded pair as", "target weights", "target alone tokens/s", "with its drafter tokens/s",
              "speed-up", "mean accepted len", "speculative output at T=0"]  # fmt: skip
    body = "\n".join(
        [
            "## Quantized models (`ops/bench/quantized.py`)",
            "",
            f"{machine()}. The embedded pair converted by mlx-lm (affine, group size 64), loaded as the "
            f"server loads it; {len(HELD_OUT_CODE)} held-out code prompts, {args.tokens} tokens each at T=0, "
            f"EOS ignored, draft model k={args.k}, {args.repeats} interleaved repeats; wall time includes prefill.",
            *(["", args.note] if args.note else []),
            "",
            table(header, rows),
        ]
    )
    print(body)
    if args.write:
        write_section("quantized-gpu" if backend().gpu else "quantized", body)


if __name__ == "__main__":
    main()
