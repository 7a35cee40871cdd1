"""Measure the embedded pair against the requirements recorded in models/README.md.

    python -m ops.models.measure_pair

Prints: committed weight bytes, drafter/target forward cost, target-only greedy decode rate,
and greedy per-position draft acceptance on the held-out code prompts (k = 4).
"""

from __future__ import annotations

# isort: off
import ops.bench.common  # noqa: F401 - first: sets up MLX's BLAS

# isort: on
import statistics
import time

import mlx.core as mx

from app.decoding.builder import LoopBuilder, RowRequest
from app.decoding.plan import LoopPlan
from app.execution.runner import ModelRunner
from app.loading import EMBEDDED_DRAFTER, EMBEDDED_TARGET
from app.execution.model import LoadedModel, load_model
from app.sampling import SamplingParams
from ops.bench.prompts import HELD_OUT_CODE

GREEDY = SamplingParams(temperature=0.0)


def forward_ms(model: LoadedModel, context: int = 128, repeats: int = 60) -> float:
    """Median wall time of one single-token forward after `context` cached tokens."""
    runner = ModelRunner(model.model)
    mx.eval(runner.prefill(list(range(10, 10 + context))))
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        mx.eval(runner.forward([42]))
        times.append(time.perf_counter() - start)
        runner.rewind(1)
    return statistics.median(times) * 1e3


def run(builder: LoopBuilder, prompt: list[int], n: int) -> tuple[int, float, object]:
    generation = builder.build(RowRequest(prompt, GREEDY, max_tokens=n, ignore_eos=True))
    start = time.perf_counter()
    generation.prefill()
    while not generation.finished:
        generation.step()
    return len(generation.emitted), time.perf_counter() - start, generation.loop.stats


def main() -> None:
    target, drafter = load_model(EMBEDDED_TARGET), load_model(EMBEDDED_DRAFTER, role="drafter")
    weights = sum(p.stat().st_size for d in (EMBEDDED_TARGET, EMBEDDED_DRAFTER) for p in d.glob("*.safetensors"))
    t_ms, d_ms = forward_ms(target), forward_ms(drafter)
    prompts = [target.tokenizer.encode(p) for p in HELD_OUT_CODE]
    plain = LoopBuilder(target, None, LoopPlan())
    classic = LoopBuilder(target, drafter, LoopPlan(drafter_kind="draft-model", num_draft_tokens=4))
    tokens = seconds = tested = accepted = 0
    for prompt in prompts:
        n, s, _ = run(plain, prompt, 128)
        tokens, seconds = tokens + n, seconds + s
        _, _, stats = run(classic, prompt, 128)
        tested, accepted = tested + stats.positions_tested, accepted + stats.accepted
    print(f"committed weights of the pair: {weights / 1e6:.2f} MB")
    print(f"forward, 1 token after 128: target {t_ms:.2f} ms, drafter {d_ms:.2f} ms, ratio {d_ms / t_ms:.3f}")
    print(f"target-only greedy decode: {tokens / seconds:.1f} tokens/s ({tokens} tokens, prefill included)")
    print(f"greedy per-position acceptance, k=4, held-out code: {accepted / tested:.3f} ({tested} positions)")


if __name__ == "__main__":
    main()
