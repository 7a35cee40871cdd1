"""The entropy-shaped stages of llama-server's chain: top-n-sigma, locally typical, dynamic temperature.

Each is a function of one position's row alone (no history, no randomness), so the same row gives the
same stage output on the drafter, the verify and the target-only path. Rows are `[R, C]`.
"""

from __future__ import annotations

import mlx.core as mx


def top_n_sigma(logits: mx.array, n: float) -> mx.array:
    """Logits below `max - n * std` (std over the row's finite logits) become -inf; before top-k."""
    finite = mx.isfinite(logits)
    count = mx.maximum(mx.sum(finite, axis=-1, keepdims=True), 1)
    values = mx.where(finite, logits, 0.0)
    mean = mx.sum(values, axis=-1, keepdims=True) / count
    std = mx.sqrt(mx.sum(mx.where(finite, (logits - mean) ** 2, 0.0), axis=-1, keepdims=True) / count)
    top = mx.max(logits, axis=-1, keepdims=True)
    return mx.where(logits < top - n * std, -mx.inf, logits)


def _entropy(probs: mx.array) -> mx.array:
    """Nats per row `[R, 1]`; zero-probability entries contribute nothing."""
    safe = mx.where(probs > 0, probs, 1.0)
    return -mx.sum(probs * mx.log(safe), axis=-1, keepdims=True)


def typical(probs: mx.array, p: float) -> mx.array:
    """Locally typical sampling's keep-mask: the tokens whose surprise is closest to the row's entropy,
    fewest first, until their mass exceeds `p` (at least one). `probs` rows sum to 1."""
    safe = mx.where(probs > 0, probs, 1.0)
    shifted = mx.where(probs > 0, mx.abs(-mx.log(safe) - _entropy(probs)), mx.inf)
    order = mx.argsort(shifted, axis=-1)
    mass = mx.take_along_axis(probs, order, axis=-1)
    before = mx.cumsum(mass, axis=-1) - mass
    rank = mx.arange(probs.shape[-1])[None, :]
    keep_sorted = (before <= p) | (rank == 0)
    return mx.put_along_axis(mx.zeros(probs.shape, dtype=mx.bool_), order, keep_sorted, axis=-1)


def dynamic_temperature(
    probs: mx.array, keep: mx.array, temperature: float, spread: float, exponent: float
) -> mx.array:
    """The temperature per row `[R, 1]`: `temperature ± spread`, placed by the kept row's entropy
    relative to the most it could be (a uniform row over the kept tokens), raised to `exponent`."""
    kept = mx.where(keep, probs, 0.0)
    kept = kept / mx.sum(kept, axis=-1, keepdims=True)
    count = mx.sum(keep, axis=-1, keepdims=True)
    most = mx.log(mx.maximum(count, 2).astype(mx.float32))
    normalised = mx.where(count > 1, _entropy(kept) / most, 0.0)
    low, high = max(0.0, temperature - spread), temperature + spread
    return low + (high - low) * mx.power(normalised, exponent)
