"""A plain NumPy statement of the sampler pipeline, to hold the MLX one to."""

from __future__ import annotations

import numpy as np


def softmax(x: np.ndarray) -> np.ndarray:
    x = x - np.max(x[np.isfinite(x)]) if np.isfinite(x).any() else x
    e = np.exp(x)
    return e / e.sum()


def penalise(logits: np.ndarray, context: list[int], repeat: float, freq: float, presence: float) -> np.ndarray:
    out = logits.astype(np.float64).copy()
    counts = np.bincount(np.array(context, dtype=np.int64), minlength=len(out)) if context else np.zeros(len(out))
    for t in np.nonzero(counts)[0]:
        out[t] = out[t] * repeat if out[t] <= 0 else out[t] / repeat
        out[t] -= counts[t] * freq + presence
    return out


def final_distribution(
    logits: np.ndarray,
    *,
    temperature: float,
    top_k: int = 0,
    top_p: float = 1.0,
    min_p: float = 0.0,
    xtc: tuple[float, float] | None = None,  # (coin, threshold): applied when coin <= probability
) -> np.ndarray:
    """Filter on the untempered distribution (each stage renormalised), XTC, temperature last."""
    order = np.argsort(-logits, kind="stable")
    kept = list(order)
    if 0 < top_k < len(kept):
        kept = kept[:top_k]
    if top_p < 1.0:
        probs = softmax(logits[kept])
        mass, cut = 0.0, []
        for token, p in zip(kept, probs, strict=True):
            if mass >= top_p:
                break
            cut.append(token)
            mass += p
        kept = cut
    if min_p > 0.0:
        probs = softmax(logits[kept])
        kept = [t for t, p in zip(kept, probs, strict=True) if p >= min_p * probs.max()]
    if xtc is not None:
        probs = softmax(logits[kept])
        above = int(np.sum(probs >= xtc[1]))
        if above >= 2:
            kept = kept[above - 1 :]
    out = np.zeros(len(logits))
    out[kept] = softmax(logits[kept] / temperature)
    return out
