"""The KV pool: a row's bits never depend on its slot, its neighbours, the pool's size, rewinds,
a restored prefix or the padding of a compiled tick; and a model is prepared once.

Compared with `mx.array_equal` (bit for bit), so the same tests run on the H200
(`python3 -m pytest -o addopts="" tests/execution/test_pool.py`).
"""

from __future__ import annotations

import sys

import mlx.core as mx
import numpy as np
import pytest

from app.execution import attention, row_invariant, tick
from app.execution.device import backend
from app.execution.forward import RowForward, forward
from app.execution.model import load_model
from app.execution.pool import SCRATCH
from app.execution.prepare import prepare, prepared
from app.execution.prompt_cache import PromptCache
from app.execution.runner import ModelRunner
from app.execution.target_taps import Tap
from app.loading import EMBEDDED_TARGET
from tests.execution.test_forward import QWEN3, Nudged, tiny

PROMPT = [(i * 37) % 500 + 3 for i in range(150)]


def same(a: mx.array, b: mx.array) -> bool:
    return a.shape == b.shape and mx.array_equal(a, b).item()


def same_rows(a: ModelRunner, b: ModelRunner) -> bool:
    assert a.length == b.length
    pairs = zip(a.rows(a.length), b.rows(b.length), strict=True)
    return all(same(x, y) for la, lb in pairs for x, y in zip(la, lb, strict=True))


def steps(runner: ModelRunner, rounds: list[list[int]]) -> list[mx.array]:
    outputs = [runner.forward(tokens) for tokens in rounds]
    mx.eval(outputs)
    return outputs


ROUNDS = [[7], [8, 9, 10, 11, 12], [13], [14, 15, 16]]


def test_a_rows_bits_do_not_depend_on_its_slot_neighbours_or_the_pools_size() -> None:
    """The same prompt and steps in a fresh pool's first slot, and in a pool grown to 32 slots and
    32 times the capacity, in its highest slot, between neighbours at other lengths stepping
    in the same ticks: the same logits, the same keys and values. The grown pool's slots are past
    `WHOLE_SLOT_RATIO` times the keys read, so its attention gathers slices where the fresh pool's
    copies whole slots: both give the same bits."""
    model = tiny("qwen3", **QWEN3)
    alone = ModelRunner(model)
    mx.eval(alone.prefill(PROMPT))
    expected = steps(alone, ROUNDS)

    crowded = tiny("qwen3", **QWEN3)  # its own pool: grown before the row is placed
    neighbours = [ModelRunner(crowded) for _ in range(30)]
    prepared(crowded).pool().reserve(32 * prepared(crowded).pool().capacity)
    assert prepared(crowded).pool().capacity > attention.WHOLE_SLOT_RATIO * (len(PROMPT) + 10)
    row = ModelRunner(crowded)
    assert row.slot == prepared(crowded).pool().slots - 1 != alone.slot
    rng = np.random.default_rng(4)
    for neighbour in neighbours[::3]:
        mx.eval(neighbour.prefill(rng.integers(1, 512, size=int(rng.integers(1, 300))).tolist()))
    mx.eval(row.prefill(PROMPT))
    busy = neighbours[::3]
    for tokens, want in zip(ROUNDS, expected, strict=True):
        others = [RowForward(n, rng.integers(1, 512, size=int(rng.integers(1, 6))).tolist()) for n in busy]
        got = forward([*others[:4], RowForward(row, tokens), *others[4:]])
        assert same(got[4], want)
    assert same_rows(alone, row)


def test_rewound_positions_are_written_over_as_if_never_computed() -> None:
    """Forward five tokens, rewind three, forward three others: the bits of forwarding the two
    kept and then the three, for the logits and for every position's keys and values."""
    model = tiny("llama", tie_word_embeddings=False)
    a, b = ModelRunner(model), ModelRunner(model)
    mx.eval(a.prefill(PROMPT), b.prefill(PROMPT))
    mx.eval(a.forward([5, 6, 7, 8, 9]))
    a.rewind(3)
    assert a.length == b.length + 2
    mx.eval(b.forward([5, 6]))
    assert same(a.forward([20, 21, 22]), b.forward([20, 21, 22]))
    assert same_rows(a, b)
    with pytest.raises(RuntimeError, match="cannot rewind"):
        a.rewind(a.length + 1)


def test_a_restored_prefix_in_a_busy_pool_gives_the_full_prefills_bits(embedded_target) -> None:
    """A prompt-cache entry restored into a slot of a pool other rows use (and that grew since
    the entry was stored) gives the keys and the next logits a full prefill gives."""
    model = embedded_target.model
    prompt = PROMPT * 2  # two whole chunks and a bit
    cache = PromptCache(budget_bytes=1 << 30, max_entries=4)
    first = ModelRunner(model)
    mx.eval(first.prefill(prompt))
    cache.store({"target": first}, prompt, tenant="t")
    others = [ModelRunner(model) for _ in range(prepared(model).pool().slots)]  # the pool doubles its slots
    mx.eval(others[0].prefill(list(range(10, 700))))  # and its capacity
    restored = ModelRunner(model)
    assert cache.restore({"target": restored}, prompt, tenant="t") == (len(prompt) - 1) // cache.grain * cache.grain
    fresh = ModelRunner(model)
    assert same(restored.prefill(prompt), fresh.prefill(prompt))
    assert same_rows(restored, fresh)


def test_the_padding_of_a_compiled_tick_reaches_no_real_row(monkeypatch) -> None:
    """Ticks compiled and padded to their bucket, as on CUDA (here on the CPU): every row's bits
    are those of the unpadded, uncompiled ticks; padding writes only the scratch slot."""
    model, padded_model = tiny("qwen3", **QWEN3), tiny("qwen3", **QWEN3)
    plain = [ModelRunner(model) for _ in range(3)]
    padded = [ModelRunner(padded_model) for _ in range(3)]
    for a, b, n in zip(plain, padded, [5, 40, 17], strict=True):
        mx.eval(a.prefill(PROMPT[:n]), b.prefill(PROMPT[:n]))
    expected = forward([RowForward(r, t) for r, t in zip(plain, [[3], [4, 5, 6], [7, 8]], strict=True)])
    mx.eval(expected)
    monkeypatch.setattr(tick, "compiled", lambda: True)
    assert tick.bucket(6) == 8
    got = forward([RowForward(r, t) for r, t in zip(padded, [[3], [4, 5, 6], [7, 8]], strict=True)])
    mx.eval(got)
    assert all(same(g, e) for g, e in zip(got, expected, strict=True))
    assert all(same_rows(a, b) for a, b in zip(plain, padded, strict=True))
    assert SCRATCH not in {r.slot for r in padded}


def test_preparing_twice_changes_nothing_more(embedded_target) -> None:
    """Loading again, or preparing a prepared model again (a reload, a block drafter asking for
    taps twice), wraps nothing twice, and keeps nothing on mlx-lm's objects."""
    model = load_model(EMBEDDED_TARGET).model
    record = prepare(model, taps=True)
    layers = list(model.model.layers)
    attention = sys.modules[type(model).__module__].scaled_dot_product_attention
    assert prepare(model, taps=True) is record is prepared(model)
    assert prepare(model) is record
    assert list(model.model.layers) == layers and all(isinstance(layer, Tap) for layer in layers)
    assert not isinstance(layers[0].inner, Tap) and not isinstance(model.model.norm.inner, Tap)
    assert sys.modules[type(model).__module__].scaled_dot_product_attention is attention
    load_model(EMBEDDED_TARGET)  # a second load prepares another model: the module keeps one dispatcher
    assert sys.modules[type(model).__module__].scaled_dot_product_attention is attention
    own = {name for name in vars(model) if name.startswith("_mlxcel")}
    assert own == set()
    with pytest.raises(ValueError, match="exact"):
        prepare(model, exact=False)
    if backend().row_invariant_kernels:
        q_proj = model.model.layers[0].inner.self_attn.q_proj
        joint = row_invariant.siblings_of(q_proj)
        prepare(model)
        assert type(q_proj) is row_invariant.RowInvariantLinear and row_invariant.siblings_of(q_proj) is joint


def test_a_wrapped_layer_keeps_its_rows_off_the_pool() -> None:
    """A layer the pool's checks do not know runs its rows with caches of their own."""
    model = tiny("qwen3", **QWEN3)
    model.model.layers[0] = Nudged(model.model.layers[0])
    runner = ModelRunner(model)
    assert not runner.pooled and prepared(model).unpooled() == "layer Nudged is not qwen3's own"


def attended(queries: mx.array, keys: mx.array, values: mx.array, rows: attention.RowGroup) -> mx.array:
    """The CPU's exact attention of one row group's places, as a tick's layer runs it."""
    layout = attention.RowLayout((rows,), mx.arange(rows.gather.shape[0]))
    placement = attention.Placement(mx.array([0]), mx.array([0]), attention.Attending.ROWS, layout)
    seen = placement.seen(0, None, queries.shape[1] // keys.shape[1])
    return attention._rows_exact(queries.reshape(queries.shape[0], queries.shape[1], -1)[rows.gather], keys, values,
                                 rows, seen, 0.125)  # fmt: skip


@pytest.mark.skipif(backend().gpu, reason="the CPU's attention (its products are the BLAS shim's)")
def test_the_cpus_attention_ignores_the_keys_and_places_past_a_query() -> None:
    """The CPU's exact attention (app/execution/attention.py, ROWS) of a row of any length 1..90,
    widths 1..5, alone and beside a row 40 keys longer and wider: the same bits (every position's
    key and SIMD lane placement moves between the two layouts)."""
    mx.random.seed(9)
    keys = mx.random.normal((4, 2, 256, 64))
    values = mx.random.normal((4, 2, 256, 64))
    for length in range(1, 91):
        width = min(1 + length % 5, length)
        queries = mx.random.normal((width + 7, 4, 1, 64))
        alone = attention.RowGroup(
            mx.array([1]), mx.arange(width), mx.arange(length - width, length), mx.arange(length)
        )
        wide = 7  # the neighbour: 7 queries at the end of 40 more keys
        both = attention.RowGroup(
            mx.array([1, 2]),
            mx.array([*range(width), *[0] * (wide - width), *range(width, width + wide)]),
            mx.array([*range(length - width, length), *[0] * (wide - width), *range(length + 33, length + 40)]),
            mx.arange(length + 40),
        )
        one = attended(queries[:width], keys, values, alone)
        two = attended(queries, keys, values, both)
        assert same(one, two[:width]), length
