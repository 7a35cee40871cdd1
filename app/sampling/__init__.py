"""The sampler pipeline and what it needs: parameters, a rewindable history, per-row randomness."""

from app.sampling.distribution import Distribution
from app.sampling.history import TokenHistory
from app.sampling.params import SamplingParams
from app.sampling.pipeline import SamplerPipeline
from app.sampling.rng import RowRng

__all__ = ["Distribution", "RowRng", "SamplerPipeline", "SamplingParams", "TokenHistory"]
