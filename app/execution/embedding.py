"""Embeddings: the target's last hidden states (after its final norm, before the output layer),
pooled over a prompt's positions and normalised to unit Euclidean length, as llama-server's
default `embd_normalize = 2` does (or, pooling `none`, each position's state).

The engine runs an embedding one forward per step, between ticks, so decoding rows go on between
the forwards and an embedding whose client left stops at the next: a whole 4000-token prompt in
one forward held every row for tens of seconds. A forward takes at most CHUNK positions:

- an input longer than CHUNK goes through in chunks of CHUNK over a KV cache made for it (and
  dropped after), one chunk per step;
- consecutive inputs of at most CHUNK tokens share a forward, `[rows, longest]` right-padded,
  while rows × longest stays within CHUNK: a forward of one position costs about as much as one
  of CHUNK (17 ms against 30 ms on the CPU), so 2,048 one-token inputs, a forward each, held the
  engine's embedding lane 47 s; packed, they take 64 forwards. Attention is causal, so the padding
  after a row's last token changes none of its real positions' states, and each row is pooled
  over its own positions only: its vector is the one it gets alone (bit for bit on the CPU, whose
  matrix products are row-stable: docs/exactness.md; within float rounding where they are not).
  A packed forward is the whole of its prompts, so it runs without a KV cache.

`plan` groups the inputs; a request is weighed by what its plan costs, CHUNK positions per
forward (app/server/embeddings/requests.py, within `server.max_embedding_tokens`), and the engine
runs that same plan.
"""

from __future__ import annotations

from collections.abc import Generator, Iterable
from dataclasses import dataclass, field

import mlx.core as mx
from mlx_lm.models.cache import make_prompt_cache

from app.execution.model import LoadedModel
from app.runtime.memory import release_free_memory

# llama-server's names: every position's mean, the last one's, the first one's; none: each one's
POOLINGS = ("mean", "last", "cls", "none")
CHUNK = 32  # positions per step: about one decode tick's time or a few on the CPU
PAD = 0  # the token after a short row's end in a packed forward: causal attention never reads it


@dataclass
class Plan:
    """Which inputs share a forward: `groups` holds each step's input indices, in input order (a
    group of several, or of one short input, is one packed forward; a single input longer than
    CHUNK is a forward per chunk). Built an input at a time (`add`), so a request over its budget
    is refused at the input that passed it."""

    groups: list[list[int]] = field(default_factory=list)
    forwards: int = 0
    inputs: int = 0
    _longest: int = field(default=0, repr=False)  # the open group's longest input; 0: no group is open to short inputs

    def add(self, tokens: int) -> None:
        """The next input, of `tokens` tokens (at least one)."""
        index, self.inputs = self.inputs, self.inputs + 1
        if tokens > CHUNK:  # chunked alone; the inputs after it start a new group
            self.groups.append([index])
            self.forwards += -(-tokens // CHUNK)
            self._longest = 0
            return
        longest = max(self._longest, tokens)
        if self._longest and (len(self.groups[-1]) + 1) * longest <= CHUNK:
            self.groups[-1].append(index)
            self._longest = longest
            return
        self.groups.append([index])
        self.forwards += 1
        self._longest = tokens

    @property
    def positions(self) -> int:
        """What the plan costs: CHUNK positions a forward, however few of them are real tokens."""
        return self.forwards * CHUNK


def plan(lengths: Iterable[int]) -> Plan:
    """The plan of inputs of these many tokens each."""
    found = Plan()
    for tokens in lengths:
        found.add(tokens)
    return found


def embeddings(
    target: LoadedModel, prompts: list[list[int]], pooling: str
) -> Generator[None, None, list[list[list[float]]]]:
    """Each prompt's rows, in the prompts' order: its pooled, normalised vector (one row), or with
    pooling `none` every position's state as it is (one row per token, not normalised, as
    llama-server answers them); one forward per step (a `yield` after each), as `plan` groups
    them. Run it on the thread that owns MLX (the engine's)."""
    found: list[list[list[float]]] = []
    try:
        for group in plan(map(len, prompts)).groups:
            if len(prompts[group[0]]) > CHUNK:  # a long prompt, alone: a step per chunk
                found.append(_rows((yield from _chunked(target, prompts[group[0]], pooling)), pooling))
                continue
            states = _packed(target, [prompts[index] for index in group], pooling)
            found.extend(_rows(state, pooling) for state in states)
            yield
        return found
    finally:  # done, failed or stopped: the forwards' caches and states are freed by now
        release_free_memory()


def _rows(states: mx.array, pooling: str) -> list[list[float]]:
    """A prompt's answer from its pooled state `[H]` (normalised) or, pooling `none`, its `[T, H]`."""
    if pooling == "none":
        return states.tolist()
    norm = mx.linalg.norm(states)
    return [mx.where(norm > 0, states / norm, states).tolist()]  # an all-zero state stays zero, as llama-server's


def _pooled(hidden: mx.array, pooling: str) -> mx.array:
    """One prompt's real positions' states `[T, H]` pooled (`[H]`), or all of them with `none`."""
    if pooling == "none":
        return hidden
    if pooling == "mean":
        return hidden.sum(axis=0) / hidden.shape[0]
    return hidden[-1] if pooling == "last" else hidden[0]


def _packed(target: LoadedModel, prompts: list[list[int]], pooling: str) -> list[mx.array]:
    """Short prompts' states in one forward, each row right-padded to the longest and pooled over
    its own positions."""
    longest = max(map(len, prompts))
    batch = mx.array([tokens + [PAD] * (longest - len(tokens)) for tokens in prompts])
    # no KV cache: nothing runs after this forward, and mlx-lm's caches hold 256 positions a row
    # (the embedded target's, 32 rows: 112 MiB for 32 real positions; a 7B model's of 8 KV heads, 1 GiB)
    hidden = target.model.model(batch).astype(mx.float32)  # the model without its output layer, causal
    states = [_pooled(hidden[row, : len(tokens)], pooling) for row, tokens in enumerate(prompts)]
    mx.eval(states)
    return states


def _chunked(target: LoadedModel, tokens: list[int], pooling: str) -> Generator[None, None, mx.array]:
    """A long prompt's pooled state `[H]`, or with pooling `none` every position's `[T, H]`, a
    chunk's forward per step over the prompt's own KV cache."""
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
