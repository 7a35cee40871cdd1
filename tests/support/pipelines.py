"""Sampler pipelines over random logit rows, for the sampling tests."""

from __future__ import annotations

import numpy as np

from app.sampling import SamplerPipeline, SamplingParams

VOCAB = 64


def rows(seed: int, n: int = 4, scale: float = 3.0) -> np.ndarray:
    return np.random.default_rng(seed).normal(0.0, scale, size=(n, VOCAB)).astype(np.float32)


def pipeline(**kw: object) -> SamplerPipeline:
    """Every stage neutral unless `kw` sets it."""
    base = {"top_k": 0, "top_p": 1.0, "min_p": 0.0, "temperature": 1.0}
    return SamplerPipeline(SamplingParams(**{**base, **kw}), VOCAB)
