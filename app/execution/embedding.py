"""Embeddings: the target's last hidden states (after its final norm, before the output layer),
pooled over a prompt's positions and normalised to unit Euclidean length, as llama-server's
default `embd_normalize = 2` does (or, pooling `none`, each position's state).

A prompt goes through in chunks of CHUNK positions over a KV cache made for it (and dropped
after), one chunk per step, so the engine can run decoding rows between the chunks and stop an
embedding whose client left: a whole 4000-token prompt in one forward held every row for tens of
seconds. A chunk's forward costs about as much for one position as for CHUNK (here 17 ms against
30 ms on the CPU), so a request is weighed by `positions`, its inputs in whole chunks: 2,048
one-token inputs weighed as 2,048 tokens held the engine's embedding lane for minutes.
"""

from __future__ import annotations

from collections.abc import Generator

import mlx.core as mx
from mlx_lm.models.cache import make_prompt_cache

from app.execution.model import LoadedModel
from app.runtime.memory import release_free_memory

# llama-server's names: every position's mean, the last one's, the first one's; none: each one's
POOLINGS = ("mean", "last", "cls", "none")
CHUNK = 32  # positions per step: about one decode tick's time or a few on the CPU


def positions(tokens: int) -> int:
    """What embedding an input of `tokens` costs: its tokens rounded up to whole chunks (one
    forward each)."""
    return -(-tokens // CHUNK) * CHUNK


def embeddings(
    target: LoadedModel, prompts: list[list[int]], pooling: str
) -> Generator[None, None, list[list[list[float]]]]:
    """Each prompt's rows: its pooled, normalised vector (one row), or with pooling `none` every
    position's state as it is (one row per token, not normalised, as llama-server answers them);
    one chunk's forward per step (a `yield` after each). Run it on the thread that owns MLX (the
    engine's)."""
    found = []
    try:
        for tokens in prompts:
            states = yield from _states(target, tokens, pooling)
            if pooling == "none":
                found.append(states.tolist())
                continue
            norm = mx.linalg.norm(states)
            vector = mx.where(norm > 0, states / norm, states)  # an all-zero state stays zero, as llama-server's
            found.append([vector.tolist()])
        return found
    finally:  # done, failed or stopped: the chunks' caches and states are freed by now
        release_free_memory()


def _states(target: LoadedModel, tokens: list[int], pooling: str) -> Generator[None, None, mx.array]:
    """The prompt's pooled state `[H]`, or with pooling `none` every position's `[T, H]`."""
    backbone = target.model.model  # mlx-lm's decoder stack: the model without its output layer
    cache = make_prompt_cache(target.model)
    pooled: mx.array | None = None
    positions: list[mx.array] = []
    for start in range(0, len(tokens), CHUNK):
        hidden = backbone(mx.array([tokens[start : start + CHUNK]]), cache=cache)[0].astype(mx.float32)
        if pooling == "none":
            positions.append(hidden)
            pooled = hidden
        elif pooling == "mean":
            total = hidden.sum(axis=0)
            pooled = total if pooled is None else pooled + total
        elif pooling == "last":
            pooled = hidden[-1]
        elif pooled is None:  # cls: the first position's
            pooled = hidden[0]
        mx.eval(pooled, [c.state for c in cache])
        yield
    assert pooled is not None  # an embedding's input has a token at least
    if pooling == "none":
        return mx.concatenate(positions, axis=0)
    return pooled / len(tokens) if pooling == "mean" else pooled
