"""Embeddings: the target's last hidden states (after its final norm, before the output layer),
pooled over a prompt's positions and normalised to unit Euclidean length, as llama-server's
default `embd_normalize = 2` does (or, pooling `none`, each position's state)."""

from __future__ import annotations

import mlx.core as mx

from app.execution.model import LoadedModel

# llama-server's names: every position's mean, the last one's, the first one's; none: each one's
POOLINGS = ("mean", "last", "cls", "none")


def embedding(target: LoadedModel, tokens: list[int], pooling: str) -> list[list[float]]:
    """One prompt's pooled, normalised vector (one row), or with pooling `none` every position's
    state as it is (one row per token, not normalised, as llama-server answers them). Runs a
    forward of the whole prompt without a KV cache (nothing is kept): call it on the thread that
    owns MLX (the engine's)."""
    backbone = target.model.model  # mlx-lm's decoder stack: the model without its output layer
    hidden = backbone(mx.array([tokens]))[0].astype(mx.float32)
    if pooling == "none":
        return hidden.tolist()
    if pooling == "mean":
        vector = hidden.mean(axis=0)
    elif pooling == "last":
        vector = hidden[-1]
    else:
        vector = hidden[0]
    norm = mx.linalg.norm(vector)
    vector = mx.where(norm > 0, vector / norm, vector)  # an all-zero state stays zero, as llama-server's
    return [vector.tolist()]
