"""The exactness probe the block loops need before they serve a verify width.

A block loop verifies [bonus, d0 ...] in one forward and accepts the longest prefix where the
target's argmax equals the draft (argmax-against-argmax at every temperature). That is exact
greedy decoding at T = 0 only if a width-w forward gives the same logits, bit for bit, as w
single-token steps; the probe checks it once per (model, width).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import mlx.core as mx
import numpy as np

from app.execution.runner import ModelRunner

PROBE_PROMPTS = ([11, 42, 7, 300, 19, 5, 88, 1024, 3, 64], [901, 17, 17, 4, 250, 6, 2047, 33, 512, 9, 12, 70])


@dataclass(frozen=True)
class ProbeVerdict:
    width: int
    exact: bool
    position: int | None = None  # first row (of the width-w forward) whose logits differ
    max_difference: float = 0.0


def probe_width(model: object, width: int) -> ProbeVerdict:
    """Logits of one width-w forward against w single-token steps from the same state, bit for bit."""
    for prompt in PROBE_PROMPTS:
        block, steps = ModelRunner(model), ModelRunner(model)
        mx.eval(block.prefill(prompt[:-1]), steps.prefill(prompt[:-1]))
        tokens = [prompt[-1], *((prompt[i % len(prompt)] + 1) for i in range(width - 1))]
        # float32 holds every bf16/fp16 value exactly (numpy has no bfloat16), so equal float32
        # arrays mean equal bits.
        wide = np.array(block.forward(tokens).astype(mx.float32))
        single = np.concatenate([np.array(steps.forward([t]).astype(mx.float32)) for t in tokens])
        if not np.array_equal(wide, single):
            differing = np.flatnonzero((wide != single).any(axis=-1))
            return ProbeVerdict(width, False, int(differing[0]), float(np.abs(wide - single).max()))
    return ProbeVerdict(width, True)


@dataclass
class ProbeCache:
    """Verdicts per (model, width), kept for the life of the process."""

    verdicts: dict[tuple[int, int], ProbeVerdict] = field(default_factory=dict)

    def check(self, model: object, width: int) -> ProbeVerdict:
        key = (id(model), width)
        if key not in self.verdicts:
            self.verdicts[key] = probe_width(model, width)
        return self.verdicts[key]
