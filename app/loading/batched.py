"""Many rows' forwards through one model in one pass, each row on its own cache.

`forward_rows(runners, inputs)` must give, bit for bit, what `[r.forward(t) for r, t in
zip(runners, inputs)]` gives (a row's output never depends on its batch-mates), and leave each
runner's cache and `length` as those calls would. This first version is that reference loop;
the batched forward replaces its body.
"""

from __future__ import annotations

from collections.abc import Sequence

import mlx.core as mx

from app.loading.runner import ModelRunner


def forward_rows(runners: Sequence[ModelRunner], inputs: Sequence[Sequence[int] | mx.array]) -> list[mx.array]:
    """Logits `[len(inputs[i]), V]` for each row (lazy); all runners share one model."""
    return [runner.forward(tokens) for runner, tokens in zip(runners, inputs, strict=True)]
