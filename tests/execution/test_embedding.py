"""Packed embeddings (app/execution/embedding.py): consecutive short inputs share a forward, each
row right-padded to the longest, and each input's vector is still the one it gets alone; the plan
that groups them is what a request is weighed by."""

from __future__ import annotations

import mlx.core as mx
import pytest

from app.execution.embedding import CHUNK, POOLINGS, embeddings, plan
from app.execution.model import LoadedModel

TEXTS = [
    "a",
    "def area(radius):",
    "import os",
    "def area(radius):\n    return 3.14159 * radius ** 2\n" * 4,  # longer than a chunk: chunked alone
    "x",
    "the quick brown fox jumps over the lazy dog",
    "class Stack:\n    def push(self, item):",
    "",  # the embedded tokenizer adds no BOS: filled in below with one token
]


def run(target: LoadedModel, prompts: list[list[int]], pooling: str) -> tuple[list[list[list[float]]], int]:
    """Every prompt's rows and the steps (forwards) they took, run back to back."""
    steps, work = 0, embeddings(target, prompts, pooling)
    while True:
        try:
            next(work)
        except StopIteration as done:
            return done.value, steps
        steps += 1


@pytest.fixture(scope="module")
def prompts(embedded_target: LoadedModel) -> list[list[int]]:
    found = [list(embedded_target.tokenizer.encode(text)) or [5] for text in TEXTS]
    lengths = [len(tokens) for tokens in found]
    assert max(lengths) > CHUNK and min(lengths) == 1
    return found


def test_the_plan_packs_consecutive_short_inputs_within_a_chunk() -> None:
    ones = plan([1] * 2048)
    assert ones.forwards == 64 and ones.positions == 2048 and ones.groups[0] == list(range(32))
    assert plan([16, 16, 17, 1, 8, 8, 8, 8]).groups == [[0, 1], [2], [3, 4, 5, 6], [7]]  # 2 x 17, 5 x 8 pass 32
    assert plan([1, 40, 1, 1]).groups == [[0], [1], [2, 3]]  # a long input is chunked alone: 2 forwards
    assert plan([1, 40, 1, 1]).forwards == 4
    assert plan([32] * 3).forwards == 3 and plan([33]).positions == 2 * CHUNK
    assert plan([4096] * 73).positions == 73 * 4096  # a long input costs its chunks, as before


@pytest.mark.parametrize("pooling", POOLINGS)
def test_packed_inputs_embed_as_each_alone(embedded_target: LoadedModel, prompts, pooling: str) -> None:
    together, steps = run(embedded_target, prompts, pooling)
    packing = plan(map(len, prompts))
    assert steps == packing.forwards < sum(-(-len(tokens) // CHUNK) for tokens in prompts)  # some shared one
    assert len(together) == len(prompts)
    for index, tokens in enumerate(prompts):
        (alone,), _ = run(embedded_target, [tokens], pooling)
        got = together[index]
        assert len(got) == len(alone) == (len(tokens) if pooling == "none" else 1), index
        difference = mx.abs(mx.array(got) - mx.array(alone)).max().item()
        assert difference < 1e-4, (pooling, index, difference)
