"""Running the forwards a server will run, once, before it says it is ready.

On CUDA every kernel (MLX's and the row-invariant ones) is compiled the first time a shape or a
template needs it, and every tick is compiled per shape bucket (app/execution/tick.py): the first
requests after a cold start paid tens of seconds each on a 4-bit target while `/health` already
answered 200. The warm-up runs rows of the server's own loop through every batch size the
scheduler can form, by power-of-two bucket up to `server.max_rows`, greedy and sampled, at every
draft width up to the plan's, each batch prefilling its prompts (all longer than a prefill chunk)
together as the engine's ticks do. What later requests run differs from these only in sizes the
kernels take as arguments (row counts, key lengths), not in what is compiled. The rows skip the
prompt cache and report nowhere.
"""

from __future__ import annotations

from dataclasses import dataclass

from app.decoding.builder import LoopBuilder, RowRequest
from app.decoding.generation import Generation
from app.decoding.plan import LoopPlan
from app.drafters.kinds import DrafterKind
from app.execution.device import backend
from app.execution.runner import PREFILL_CHUNK
from app.execution.steps import run_together
from app.sampling import SamplingParams

WARM_TOKENS = 6  # per row: a prefill, then a few rounds at its width
SHORT_PROMPT = 9
SAMPLED = SamplingParams(temperature=0.7)
GREEDY = SamplingParams(temperature=0.0)


@dataclass(frozen=True)
class WarmShapes:
    batch_sizes: tuple[int, ...]
    widths: tuple[int, ...]  # speculative.n_max of the rows, in turn (0: a target-only step)


def warms(setting: str) -> bool:
    """Whether `server.warmup` runs the warm-up on this device."""
    return setting == "on" or (setting == "auto" and backend().gpu)


def warm_shapes(plan: LoopPlan, max_rows: int) -> WarmShapes:
    """Batch sizes 1, 2, 4, ... and `max_rows`; widths from the widest the plan drafts down to 0."""
    buckets, size = [], 1
    while size < max_rows:
        buckets.append(size)
        size *= 2
    widest = 0 if plan.drafter_kind is DrafterKind.NONE else plan.n_max
    return WarmShapes((*buckets, max_rows), tuple(range(widest, -1, -1)))


def warm(builder: LoopBuilder, shapes: WarmShapes) -> int:
    """Run the shapes; how many rows ran."""
    vocab = builder.target.vocab_size
    rows = 0
    for size in shapes.batch_sizes:
        batch = [_row(builder, shapes, rows + i, vocab) for i in range(size)]
        while live := [generation for generation in batch if not generation.finished]:
            for outcome in run_together([generation.ticking() for generation in live]).outcomes:
                if isinstance(outcome, Exception):
                    raise outcome
        rows += size
    return rows


def _row(builder: LoopBuilder, shapes: WarmShapes, index: int, vocab: int) -> Generation:
    length = PREFILL_CHUNK + SHORT_PROMPT + index % 5  # a whole chunk, then a short one: both tick shapes
    prompt = [(index * 7919 + j * 104729) % vocab for j in range(length)]  # any tokens: only shapes matter
    request = RowRequest(
        prompt,
        SAMPLED if index % 2 else GREEDY,
        WARM_TOKENS,
        seed=index,
        ignore_eos=True,
        n_max=shapes.widths[index % len(shapes.widths)],
        cache_prompt=False,
    )
    return builder.build(request)
