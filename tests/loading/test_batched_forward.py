"""`forward_rows` gives every row, bit for bit, what its own forward gives, whatever its batch-mates."""

from __future__ import annotations

from pathlib import Path

import mlx.core as mx
import mlx.nn as nn
import numpy as np
import pytest

from app.drafters.target_taps import FINAL, taps_for
from app.loading import load_model
from app.loading.batched import flattens, forward_rows
from app.loading.runner import ModelRunner
from ops.models.tiny import build_tiny_model

ROWS = 16


def twin_pools(model: nn.Module, rng: np.random.Generator) -> tuple[list[ModelRunner], list[ModelRunner]]:
    """Two identical sets of rows at different cache lengths (some rewound after their prompt)."""
    solo, batched = [ModelRunner(model) for _ in range(ROWS)], [ModelRunner(model) for _ in range(ROWS)]
    for a, b in zip(solo, batched, strict=True):
        prompt = rng.integers(4, 4000, size=int(rng.integers(2, 60))).tolist()
        mx.eval(a.prefill(prompt), b.prefill(prompt))
        back = int(rng.integers(0, len(prompt) // 2 + 1))
        a.rewind(back)
        b.rewind(back)
    return solo, batched


def assert_same_rows(solo: list[ModelRunner], batched: list[ModelRunner], inputs: list) -> None:
    expected = [np.array(r.forward(t)) for r, t in zip(solo, inputs, strict=True)]
    got = forward_rows(batched, inputs)
    mx.eval(got)
    for row, (want, have) in enumerate(zip(expected, got, strict=True)):
        assert have.shape == want.shape and np.array_equal(np.array(have), want), f"row {row} of {len(inputs)}"
    assert [r.length for r in batched] == [r.length for r in solo]


def assert_same_caches(solo: list[ModelRunner], batched: list[ModelRunner]) -> None:
    for a, b in zip(solo, batched, strict=True):
        for x, y in zip(a.cache, b.cache, strict=True):
            assert x.offset == y.offset
            for p, q in zip(x.keys_and_values(), y.keys_and_values(), strict=True):
                assert np.array_equal(np.array(p), np.array(q))


@pytest.mark.parametrize("role", ["target", "drafter"])
def test_rows_match_their_solo_forwards_over_rounds_with_rewinds(role, embedded_target, embedded_drafter) -> None:
    """B = 1..16 rows of widths 1..8 (some given as arrays), rewound between rounds; one round
    carries a row wider than a flattened group may hold."""
    model = (embedded_target if role == "target" else embedded_drafter).model
    rng = np.random.default_rng(12)
    solo, batched = twin_pools(model, rng)
    assert flattens(batched)
    for size in [*range(1, ROWS + 1), ROWS]:
        chosen = sorted(rng.choice(ROWS, size=size, replace=False).tolist())
        inputs = [rng.integers(4, 4000, size=int(rng.integers(1, 9))).tolist() for _ in chosen]
        inputs[::3] = [mx.array(t, dtype=mx.uint32) for t in inputs[::3]]  # sampled tokens arrive as arrays
        if size == ROWS:
            inputs[5] = rng.integers(4, 4000, size=40).tolist()
        assert_same_rows([solo[i] for i in chosen], [batched[i] for i in chosen], inputs)
        for i in chosen:
            back = int(rng.integers(0, 4))
            solo[i].rewind(back)
            batched[i].rewind(back)
    assert_same_caches(solo, batched)


class Nudged(nn.Module):
    """A layer wrapper that changes its layer's output: batching must not look through it."""

    def __init__(self, inner: nn.Module) -> None:
        super().__init__()
        self.inner = inner

    def __call__(self, x: mx.array, mask: object, cache: object) -> mx.array:
        return self.inner(x, mask, cache) + 1e-3


@pytest.mark.parametrize("kind", ["mamba", "llama", "nudged qwen3"])
def test_other_models_give_their_solo_forwards(kind, tmp_path: Path) -> None:
    """An architecture the flattened forward does not mirror takes the reference loop; llama is mirrored."""
    model = load_model(build_tiny_model(tmp_path / "m", model_type=kind.split()[-1], layers=2)).model
    if kind.startswith("nudged"):
        model.model.layers[1] = Nudged(model.model.layers[1])
    rng = np.random.default_rng(3)
    solo, batched = [ModelRunner(model) for _ in range(4)], [ModelRunner(model) for _ in range(4)]
    for a, b in zip(solo, batched, strict=True):
        prompt = rng.integers(4, 4000, size=int(rng.integers(2, 20))).tolist()
        mx.eval(a.prefill(prompt), b.prefill(prompt))
    assert flattens(batched) == (kind == "llama")
    for _ in range(2):
        inputs = [rng.integers(4, 4000, size=int(rng.integers(1, 6))).tolist() for _ in range(4)]
        assert_same_rows(solo, batched, inputs)


def test_taps_record_each_row_as_its_own_forward_would(embedded_target) -> None:
    """A capture open over a batched forward sees, per tapped module, each row's rows in row order."""
    model = embedded_target.model
    taps = taps_for(model)
    names = [1, 9, FINAL]
    solo, batched = twin_pools(model, np.random.default_rng(5))
    inputs = [[7, 8, 9], [300], [11, 12, 13, 14, 15], [42, 43]]
    with taps.capture(names) as expected:
        mx.eval([r.forward(t) for r, t in zip(solo[:4], inputs, strict=True)])
    with taps.capture(names) as seen:
        mx.eval(forward_rows(batched[:4], inputs))
    assert set(seen) == set(names)
    for name in names:
        assert [a.shape for a in seen[name]] == [(1, len(t), 256) for t in inputs]
        assert all(np.array_equal(np.array(a), np.array(b)) for a, b in zip(seen[name], expected[name], strict=True))
