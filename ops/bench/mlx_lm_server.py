"""`mlx_lm.server` set up as `mlxcel serve` sets MLX up, so a benchmark compares the engines.

Importing `app` first routes MLX's matrix products to the same OpenBLAS shim (one thread); each
loaded model gets the dtype our loader picks (float32 for small models on the CPU), and an empty
EOS set, so every request runs to its token count as `ignore_eos` makes ours do.

    python -m ops.bench.mlx_lm_server --model models/target --port 8090 [mlx_lm.server options]
"""

from __future__ import annotations

# isort: off
import app  # noqa: F401  first: it routes MLX's matrix products to OpenBLAS before mlx.core loads

# isort: on
from typing import Any

import mlx.core as mx
import mlx_lm.server

from app.execution.device import compute_dtype

MLX_LM_LOAD = mlx_lm.server.load


def load_like_mlxcel(*args: Any, **kwargs: Any) -> tuple[Any, Any, dict]:
    """The model provider's `load` (it asks for the config; no draft model is given here),
    then our dtype rule and no EOS."""
    model, tokenizer, config = MLX_LM_LOAD(*args, **kwargs)
    dtype = compute_dtype(model, config, "auto")
    if dtype is not None:
        model.set_dtype(dtype)
        mx.eval(model.parameters())
    tokenizer.eos_token_ids = []
    return model, tokenizer, config


if __name__ == "__main__":
    mlx_lm.server.load = load_like_mlxcel
    mlx_lm.server.main()
