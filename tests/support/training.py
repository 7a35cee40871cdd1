"""Training the tests' tiny models in MLX (seconds on the CPU): Adam on one loss, then the weights saved."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import mlx.core as mx
import mlx.nn as nn
import mlx.optimizers as optim
from mlx.utils import tree_flatten


def fit_and_save(model: nn.Module, loss: Callable[[nn.Module], mx.array], out: Path, steps: int, seed: int) -> Path:
    """`steps` of Adam (3e-2) on `loss`, seeded; the weights written to `out`/model.safetensors."""
    optimizer = optim.Adam(learning_rate=3e-2)
    step = nn.value_and_grad(model, loss)
    mx.random.seed(seed)
    for _ in range(steps):
        value, grads = step(model)
        optimizer.update(model, grads)
        mx.eval(model.parameters(), optimizer.state, value)
    weights = dict(tree_flatten(model.parameters()))
    mx.save_safetensors(str(out / "model.safetensors"), weights, metadata={"format": "mlx"})
    return out
