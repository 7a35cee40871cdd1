"""The sampler pipeline and what it needs: parameters, a rewindable history, per-row randomness.

The names below load on first use, so that `app.sampling.chain` (pure Python: the stage names a
profile's `sampling.samplers` and the `--samplers` flag are read with) loads no MLX for the
settings layer (`import app.profiles` stays MLX-free: tests/project/test_layering.py).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from app.sampling.distribution import Distribution
    from app.sampling.history import TokenHistory
    from app.sampling.params import SamplingParams
    from app.sampling.pipeline import SamplerPipeline
    from app.sampling.rng import RowRng

MODULES = {
    "Distribution": "distribution",
    "RowRng": "rng",
    "SamplerPipeline": "pipeline",
    "SamplingParams": "params",
    "TokenHistory": "history",
}
__all__ = ["Distribution", "RowRng", "SamplerPipeline", "SamplingParams", "TokenHistory"]


def __getattr__(name: str) -> Any:
    if name in MODULES:
        return getattr(importlib.import_module(f"app.sampling.{MODULES[name]}"), name)
    raise AttributeError(f"module 'app.sampling' has no attribute {name!r}")
