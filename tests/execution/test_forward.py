"""`forward` gives every row, bit for bit, what its own forward gives, whatever its batch-mates.

Compared with `mx.array_equal` (bit for bit; numpy has no bfloat16, which models keep on the GPU),
so the same tests run on the H200 (`python3 -m pytest -o addopts="" tests/execution/`).
"""

from __future__ import annotations

import importlib
from pathlib import Path

import mlx.core as mx
import mlx.nn as nn
import numpy as np
import pytest

from app.execution.device import backend
from app.execution.forward import RowForward, batching, forward
from app.execution.model import load_model
from app.execution.prepare import prepare
from app.execution.runner import ModelRunner
from app.execution.target_taps import FINAL
from ops.models.tiny import build_tiny_model

ROWS = 16


def twin_pools(
    model: nn.Module, rng: np.random.Generator, rows: int = ROWS
) -> tuple[list[ModelRunner], list[ModelRunner]]:
    """Two identical sets of rows at different cache lengths (some rewound after their prompt)."""
    solo, batched = [ModelRunner(model) for _ in range(rows)], [ModelRunner(model) for _ in range(rows)]
    for a, b in zip(solo, batched, strict=True):
        prompt = rng.integers(4, 4000, size=int(rng.integers(2, 60))).tolist()
        mx.eval(a.prefill(prompt), b.prefill(prompt))
        back = int(rng.integers(0, len(prompt) // 2 + 1))
        a.rewind(back)
        b.rewind(back)
    return solo, batched


def rows_of(runners: list[ModelRunner], inputs: list) -> list[RowForward]:
    return [RowForward(r, t) for r, t in zip(runners, inputs, strict=True)]


def assert_same_rows(solo: list[ModelRunner], batched: list[ModelRunner], inputs: list) -> None:
    # each solo forward evaluated as it is made: a chain of lazy ticks on one pool keeps each
    # tick's buffers referenced by the next, so every scatter copies its whole layer buffer
    # (a cost that grows with the shared model's pool: 71 s of this file in the suite)
    expected = []
    for runner, tokens in zip(solo, inputs, strict=True):
        expected.append(runner.forward(tokens))
        mx.eval(expected[-1])
    got = forward(rows_of(batched, inputs))
    mx.eval(got)
    for row, (want, have) in enumerate(zip(expected, got, strict=True)):
        assert have.shape == want.shape and mx.array_equal(have, want).item(), f"row {row} of {len(inputs)}"
    assert [r.length for r in batched] == [r.length for r in solo]


def assert_same_caches(solo: list[ModelRunner], batched: list[ModelRunner]) -> None:
    for a, b in zip(solo, batched, strict=True):
        assert a.length == b.length == a.cache_offset == b.cache_offset
        for x, y in zip(a.rows(a.length), b.rows(b.length), strict=True):
            for p, q in zip(x, y, strict=True):
                assert mx.array_equal(p, q).item()


def test_rows_match_their_solo_forwards_over_rounds_with_rewinds(embedded_drafter) -> None:
    """B = 1..16 rows of widths 1..8 (some given as arrays), rewound between rounds; one round
    carries a row of 40 tokens among the others. On the embedded drafter: the target's architecture
    and shapes (qwen3, hidden 256, 4 heads over 2 KV heads of 64) at 2 layers, not 14; it ran on
    both until issue 44 (the target's case took 87-126 s of the suite). The target's own batched
    forwards are held to its solo ones by the seeded-identity and batched-rows tests."""
    model = embedded_drafter.model
    rng = np.random.default_rng(12)
    solo, batched = twin_pools(model, rng)
    assert batching(model) == "rows"
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
    """An architecture not checked to batch (mamba: its cache is a state, not rows) or a layer that
    is not the architecture's own runs one forward per row; llama batches."""
    dtype = "bfloat16" if backend().row_invariant_kernels else "auto"  # the kernel reads half precision
    model = load_model(build_tiny_model(tmp_path / "m", model_type=kind.split()[-1], layers=2), dtype=dtype).model
    if kind.startswith("nudged"):
        model.model.layers[1] = Nudged(model.model.layers[1])
    rng = np.random.default_rng(3)
    solo, batched = [ModelRunner(model) for _ in range(4)], [ModelRunner(model) for _ in range(4)]
    for a, b in zip(solo, batched, strict=True):
        prompt = rng.integers(4, 4000, size=int(rng.integers(2, 20))).tolist()
        mx.eval(a.prefill(prompt), b.prefill(prompt))
    assert (
        batching(model)
        == {
            "mamba": "per-row (mlx_lm.models.mamba.Model is not one of the architectures checked to batch)",
            "llama": "rows",
            "nudged qwen3": "per-row (layer Nudged is not qwen3's own)",
        }[kind]
    )
    for _ in range(2):
        inputs = [rng.integers(4, 4000, size=int(rng.integers(1, 6))).tolist() for _ in range(4)]
        assert_same_rows(solo, batched, inputs)


def test_taps_record_each_row_as_its_own_forward_would(embedded_target) -> None:
    """A capture open over a batched forward sees, per tapped module, each row's rows in row order."""
    model = embedded_target.model
    taps = prepare(model, taps=True).taps
    names = [1, 9, FINAL]
    inputs = [[7, 8, 9], [300], [11, 12, 13, 14, 15], [42, 43]]
    solo, batched = twin_pools(model, np.random.default_rng(5), rows=len(inputs))
    with taps.capture(names) as expected:
        mx.eval([r.forward(t) for r, t in zip(solo[:4], inputs, strict=True)])
    with taps.capture(names) as seen:
        mx.eval(forward(rows_of(batched[:4], inputs)))
    assert set(seen) == set(names)
    for name in names:
        assert [a.shape for a in seen[name]] == [(1, len(t), 256) for t in inputs]
        assert all(mx.array_equal(a, b).item() for a, b in zip(seen[name], expected[name], strict=True))


def tiny(architecture: str, bits: int | None = None, **config: object) -> nn.Module:
    """A random model of mlx-lm's own module for `architecture` (vocabulary of 512), its layers
    quantized to `bits` (affine, groups of 32) if given."""
    module = importlib.import_module(f"mlx_lm.models.{architecture}")
    shape = {
        "hidden_size": 64, "num_hidden_layers": 4, "intermediate_size": 128, "num_attention_heads": 4,
        "num_key_value_heads": 2, "rms_norm_eps": 1e-6, "vocab_size": 512, "head_dim": 32,
    }  # fmt: skip
    args = module.ModelArgs.from_dict({"model_type": architecture, **shape, **config})
    mx.random.seed(7)
    model = module.Model(args)
    if bits is not None:  # as an mlx-lm quantized checkpoint loads
        nn.quantize(model, group_size=32, bits=bits)
    if backend().row_invariant_kernels:  # as load_model leaves a model on an NVIDIA GPU
        model.set_dtype(mx.bfloat16)
    prepare(model)
    mx.eval(model.parameters())
    return model


LONGROPE = {"type": "longrope", "long_factor": [1.5] * 16, "short_factor": [1.1] * 16}  # SuScaledRoPE
QWEN3 = {"tie_word_embeddings": True, "rope_theta": 10000.0, "max_position_embeddings": 4096}
ARCHITECTURES = {
    "qwen3": ("qwen3", QWEN3),
    "llama": ("llama", {"tie_word_embeddings": False}),
    "mistral": ("llama", {"model_type": "mistral", "rope_theta": 1e6}),  # mlx-lm loads mistral as llama
    "llama with sliding layers": (
        "llama",
        {"layer_types": ["sliding_attention", "full_attention"] * 2, "sliding_window": 8},
    ),
    # qwen2's head size is hidden / heads (it has no head_dim): 32 at 128, the GPU kernel's least
    "qwen2": ("qwen2", {"tie_word_embeddings": True, "hidden_size": 128}),
    "gemma3_text": ("gemma3_text", {"sliding_window": 8, "sliding_window_pattern": 2}),
    "phi3": (
        "phi3",
        {"hidden_size": 128},
    ),  # its head size is hidden / heads: 32, as the others' (the GPU kernel's least)
    "phi3 longrope": (
        "phi3",
        {
            "hidden_size": 128,
            "max_position_embeddings": 8192,
            "original_max_position_embeddings": 1024,
            "rope_scaling": LONGROPE,
        },
    ),
    "qwen3 4-bit": ("qwen3", {**QWEN3, "bits": 4}),  # QuantizedLinear, QuantizedEmbedding
    "llama 8-bit": ("llama", {"tie_word_embeddings": False, "bits": 8}),
}


@pytest.mark.parametrize("name", list(ARCHITECTURES))
def test_each_architecture_batches_bit_for_bit(name) -> None:
    """Rows of widths 1, 5, 3, 1 (then others) at different cache lengths, after prefills of
    different lengths, through mlx-lm's own modules: each row's logits and cache are its solo
    forward's. Sliding-window layers (RotatingKVCache, wrapped past its window) included."""
    architecture, config = ARCHITECTURES[name]
    model = tiny(architecture, **config)
    assert batching(model) == "rows"
    rng = np.random.default_rng(11)
    solo, batched = [ModelRunner(model) for _ in range(4)], [ModelRunner(model) for _ in range(4)]
    for a, b, length in zip(solo, batched, [3, 17, 9, 40], strict=True):
        prompt = rng.integers(1, 512, size=length).tolist()
        mx.eval(a.prefill(prompt), b.prefill(prompt))
    for widths in [(1, 5, 3, 1), (2, 1, 4, 6), (1, 1, 1, 1)]:
        inputs = [rng.integers(1, 512, size=w).tolist() for w in widths]
        assert_same_rows(solo, batched, inputs)
        for a, b in zip(solo, batched, strict=True):
            if a.can_rewind:  # a sliding window past its size keeps no rows to give back
                a.rewind(1)
                b.rewind(1)
    assert_same_caches(solo, batched)
