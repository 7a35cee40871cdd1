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
    sigma: float = -1.0,
    typical_p: float = 1.0,
    dynatemp: tuple[float, float] | None = None,  # (range, exponent)
) -> np.ndarray:
    """top-n-sigma, then filters on the untempered distribution (each stage renormalised), XTC,
    temperature (dynamic, with `dynatemp`) last."""
    if sigma > 0:
        logits = top_n_sigma(logits, sigma)
    order = np.argsort(-logits, kind="stable")
    kept = order[np.isfinite(logits[order])].tolist()  # vectorised: a whole vocabulary per emitted token
    if 0 < top_k < len(kept):
        kept = kept[:top_k]
    if typical_p < 1.0:
        keep = typical_keep(softmax(logits[kept]), typical_p)
        kept = [t for t, k in zip(kept, keep, strict=True) if k]
    if top_p < 1.0:
        kept = top_p_cut(kept, softmax(logits[kept]), top_p)
    if min_p > 0.0:
        probs = softmax(logits[kept])
        kept = [t for t, p in zip(kept, probs, strict=True) if p >= min_p * probs.max()]
    if xtc is not None:
        probs = softmax(logits[kept])
        above = int(np.sum(probs >= xtc[1]))
        if above >= 2:
            kept = kept[above - 1 :]
    if dynatemp is not None:
        temperature = dynamic_temperature(softmax(logits[kept]), temperature, *dynatemp)
    out = np.zeros(len(logits))
    out[kept] = softmax(logits[kept] / temperature)
    return out


def top_p_cut(kept: list[int], probs: np.ndarray, top_p: float) -> list[int]:
    """The shortest prefix of `kept` (most likely first) whose mass reaches top_p."""
    mass, cut = 0.0, []
    for token, p in zip(kept, probs, strict=True):
        if mass >= top_p:
            break
        cut.append(token)
        mass += p
    return cut


def top_n_sigma(logits: np.ndarray, n: float) -> np.ndarray:
    finite = logits[np.isfinite(logits)]
    out = logits.astype(np.float64).copy()
    out[out < finite.max() - n * finite.std()] = -np.inf
    return out


def typical_keep(probs: np.ndarray, p: float) -> np.ndarray:
    """Tokens closest in surprise to the entropy, until their mass exceeds p (at least one)."""
    nonzero = probs > 0
    entropy = -np.sum(probs[nonzero] * np.log(probs[nonzero]))
    with np.errstate(divide="ignore"):
        shifted = np.where(nonzero, np.abs(-np.log(probs) - entropy), np.inf)
    keep = np.zeros(len(probs), dtype=bool)
    mass = 0.0
    for token in np.argsort(shifted, kind="stable"):
        keep[token] = True
        mass += probs[token]
        if mass > p:
            break
    return keep


def dynamic_temperature(probs: np.ndarray, temperature: float, spread: float, exponent: float) -> float:
    kept = probs[probs > 0]
    if len(kept) <= 1:
        return temperature
    entropy = -np.sum(kept * np.log(kept)) / np.log(len(kept))
    low, high = max(0.0, temperature - spread), temperature + spread
    return low + (high - low) * entropy**exponent


def dry(logits: np.ndarray, history: list[int], multiplier: float, base: float, allowed: int, breakers: set[int]):
    """DRY by brute force, single-token breakers only: for each earlier end of the history's suffix,
    the longest match (never reaching past the latest breaker) penalises the token that followed."""
    out = logits.astype(np.float64).copy()
    size = len(history)
    if size <= allowed:
        return out
    limit = next((i for i in range(size) if history[size - 1 - i] in breakers), size)
    longest: dict[int, int] = {}
    for k in range(1, size):
        n = 0
        while n + k < size and n < limit and history[size - 1 - n] == history[size - 1 - n - k]:
            n += 1
        if n >= allowed:
            follower = history[size - k]
            longest[follower] = max(longest.get(follower, 0), n)
    for token, n in longest.items():
        if token not in breakers:
            out[token] -= multiplier * base ** (n - allowed)
    return out


def mirostat(logits: np.ndarray, mu: float, version: int, temperature: float, vocab: int) -> np.ndarray:
    """Mirostat's final row at mu, from bias-adjusted logits."""
    probs = softmax(logits / temperature)
    order = np.argsort(-probs, kind="stable")
    ranked = probs[order]
    if version == 2:
        kept = max(1, int(np.sum(-np.log2(np.where(ranked > 0, ranked, 1e-300)) <= mu)))
    else:
        head = ranked[:100]
        t, b = [], []
        for i in range(len(head) - 1):
            if head[i + 1] > 0:
                t.append(np.log((i + 2) / (i + 1)))
                b.append(np.log(head[i] / head[i + 1]))
        s_hat = np.dot(t, b) / np.dot(t, t)
        eps = s_hat - 1
        k = ((eps * 2**mu) / (1 - vocab ** (-eps))) ** (1 / s_hat)
        kept = int(np.clip(k, 1, len(probs))) if np.isfinite(k) else 1
    out = np.zeros(len(probs))
    out[order[:kept]] = ranked[:kept] / ranked[:kept].sum()
    return out


def chained(
    logits: np.ndarray,
    chain: list[str],
    *,
    temperature: float = 1.0,
    top_k: int = 0,
    top_p: float = 1.0,
    min_p: float = 0.0,
    typical_p: float = 1.0,
    sigma: float = -1.0,
    xtc_threshold: float | None = None,  # XTC applies (its coin came up) with this threshold
) -> np.ndarray:
    """The stages `chain` names, in its order, each on the survivors the stages before it left
    (renormalised; after the temperature, tempered), as llama-server's chain runs them."""
    logits = logits.astype(np.float64).copy()
    kept = [int(t) for t in np.argsort(-logits, kind="stable") if np.isfinite(logits[t])]
    for stage in chain:
        probs = softmax(logits[kept])
        if stage == "temperature":
            logits = logits / temperature
        elif stage == "top_k" and 0 < top_k < len(kept):
            kept = kept[:top_k]
        elif stage == "top_p" and top_p < 1.0:
            kept = top_p_cut(kept, probs, top_p)
        elif stage == "min_p" and min_p > 0.0:
            kept = [t for t, p in zip(kept, probs, strict=True) if p >= min_p * probs.max()]
        elif stage == "typ_p" and typical_p < 1.0:
            kept = [t for t, k in zip(kept, typical_keep(probs, typical_p), strict=True) if k]
        elif stage == "xtc" and xtc_threshold is not None:
            above = int(np.sum(probs >= xtc_threshold))
            if above >= 2:
                kept = kept[above - 1 :]
        elif stage == "top_n_sigma" and sigma > 0:
            survivors = np.full(len(logits), -np.inf)
            survivors[kept] = logits[kept]
            kept = [t for t in kept if np.isfinite(top_n_sigma(survivors, sigma)[t])]
    out = np.zeros(len(logits))
    out[kept] = softmax(logits[kept])
    return out
