"""The one place a model mlx-lm loaded is changed, and where what the project keeps of it lives.

`prepare(model, ...)` makes every change the project makes to a loaded model, and only it:

- kernel routing (CUDA, exact): mlx-lm's `Linear`, `Embedding`, `QuantizedLinear` and
  `QuantizedEmbedding` layers get the row-invariant classes of app/execution/row_invariant.py
  (the same parameters; their products take the row kernels inside the project's forwards);
- joined projections (CUDA, exact): each attention's q/k/v and each MLP's gate/up share one
  kernel call, each layer's weights becoming a view of its rows of the joined ones;
- the attention dispatcher: the architecture module's `scaled_dot_product_attention` (mlx-lm's
  models import it from `mlx_lm.models.base` into their own namespace) becomes
  app/execution/attention.py's dispatcher, once per module: the pool's attention for the pool's
  layers, mlx-lm's own function for every other cache (so an untouched copy of mlx-lm's model in
  the same process keeps its kernels);
- the target taps (`taps=True`, a block drafter's target): the decoder layers and the final norm
  wrapped in recording taps (app/execution/target_taps.py);
- lockstep (`lockstep=`, rank 0 of a tensor-parallel target): its runners send their forwards
  and rewinds to the followers (app/execution/lockstep.py).

Each change is made once: calling `prepare` again (a second load, a reload, a later call asking
for taps) makes only the changes not yet made, so nothing is wrapped twice. What the project
keeps per model (those choices, whether its rows share the KV pool and why not, the pool, the
compiled ticks) lives in a table keyed by the model, never as attributes on mlx-lm's objects
(the measured forward costs too, in app/execution/cost.py's); an entry goes when its model does.
"""

from __future__ import annotations

import sys
import weakref
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import mlx.core as mx
import mlx.nn as nn
from mlx_lm.models import rope_utils

from app.execution import row_invariant
from app.execution.attention import Attending, dispatcher
from app.execution.device import backend
from app.execution.lockstep import Lockstep
from app.execution.pool import KVPool, LayerShape
from app.execution.target_taps import Tap, TargetTaps

# mlx-lm architecture modules (`mlx_lm.models.<name>`; Mistral checkpoints load as llama) whose
# forwards touch the cache and the mask only through `cache.offset` given to RoPE,
# `create_attention_mask`/`cache.make_mask`, `cache.update_and_fetch` and the module's
# `scaled_dot_product_attention`, and mix tokens nowhere else: their rows share the KV pool.
POOLED_ARCHITECTURES = ("qwen3", "llama", "qwen2", "gemma3_text", "phi3")
# RoPE classes that hand their offset to `mx.fast.rope` untouched (it takes one per batch entry).
POSITIONWISE_ROPES = (nn.RoPE, rope_utils.SuScaledRoPE, rope_utils.Llama3RoPE, rope_utils.YarnRoPE)


@dataclass
class Prepared:
    """What the project decided for one model and keeps beside it."""

    model: weakref.ref[nn.Module]
    exact: bool = True  # execution.exact: the row-invariant kernels (False: MLX's own, the fast path)
    sharded: bool = False  # a tensor-parallel shard (every rank's forwards are one row's)
    lockstep: Lockstep | None = None
    taps: TargetTaps | None = None
    _verdict: tuple[str | None] | None = None  # why rows do not share the pool (None inside: they do)
    _shapes: list[LayerShape] | None = None
    _pool: KVPool | None = None
    ticks: dict[Any, Callable[..., Any]] = field(default_factory=dict)  # app/execution/tick.py's compiled steps

    @property
    def attending(self) -> Attending:
        if not self.exact:
            return Attending.STOCK
        return Attending.KERNEL if backend().row_invariant_kernels else Attending.ROWS

    def unpooled(self) -> str | None:
        """Why this model's rows keep a cache each and run one forward each (None: they share the
        pool and a tick), decided on first use: after the model was prepared and wrapped."""
        if self._verdict is None:
            self._verdict = (_why_unpooled(self),)
        return self._verdict[0]

    def shapes(self) -> list[LayerShape]:
        """Each layer's keys per position, from a one-token forward (done once)."""
        if self._shapes is None:
            model = self.model()
            assert model is not None
            self._shapes = _layer_shapes(model)
        return self._shapes

    def pool(self) -> KVPool:
        """The model's KV pool (made on the first pooled row)."""
        assert self.unpooled() is None
        if self._pool is None:
            self._pool = KVPool(self.shapes())
        return self._pool

    def drop_idle_pool(self) -> None:
        """Let the pool go if no row holds a slot (the next row makes one at the first size).

        A pool only grows: a server's is its memory budget. Many callers taking turns on one
        loaded model (the test suite's shared models) would otherwise each pay for the longest
        rows and most slots any earlier caller needed: a solo forward's scatter into a pool grown
        to 1.9 GB took 2.7 times as long, and a pool's size is what every copy of it costs."""
        if self._pool is not None and self._pool.held == 0:
            self._pool = None


_TABLE: dict[int, Prepared] = {}


def prepare(
    model: nn.Module,
    *,
    exact: bool | None = None,
    taps: bool = False,
    lockstep: Lockstep | None = None,
    sharded: bool = False,
) -> Prepared:
    """Make the changes asked for that `model` does not have yet (see the module's docstring);
    the model's record. `exact` is decided by the first call that gives it (later calls may not
    change it: the kernels are chosen)."""
    record = _TABLE.get(id(model))
    if record is None or record.model() is not model:
        record = Prepared(weakref.ref(model), exact=True if exact is None else exact)
        _TABLE[id(model)] = record
        weakref.finalize(model, _TABLE.pop, id(model), None)
    elif exact is not None and exact != record.exact:
        raise ValueError(f"the model was prepared with exact={record.exact}; load it again for exact={exact}")
    if sharded and not record.sharded:
        record.sharded, record._verdict = True, None
    if record.exact and backend().row_invariant_kernels:
        _route(model)
    _dispatch_attention(model)
    if lockstep is not None and record.lockstep is None:
        record.lockstep, record._verdict = lockstep, None
    if taps and record.taps is None:
        record.taps = _tap(model)
        record._verdict = None
    return record


def prepared(model: nn.Module) -> Prepared:
    """The model's record (a model nobody prepared is prepared now, exact: a test's own module)."""
    record = _TABLE.get(id(model))
    if record is not None and record.model() is model:
        return record
    return prepare(model)


def _route(model: nn.Module) -> None:
    """The row-invariant classes for mlx-lm's layers, and q/k/v and gate/up joined (the layers not
    routed or joined yet: a layer quantized after a first call is routed by the next)."""
    for _, module in model.named_modules():
        if type(module) in row_invariant.ROUTED:
            module.__class__ = row_invariant.ROUTED[type(module)]
    for _, module in model.named_modules():
        for names in row_invariant.SIBLING_NAMES:
            layers = [getattr(module, name, None) for name in names]
            if row_invariant.joinable(layers):
                siblings = row_invariant.joined(layers)
                for layer, views in zip(layers, siblings.views(), strict=True):
                    layer.update(views)
                mx.eval([layer.parameters() for layer in layers])


_DISPATCHED: dict[str, Callable[..., mx.array]] = {}  # module name: mlx-lm's own attention function


def _dispatch_attention(model: nn.Module) -> None:
    """The architecture module's attention function becomes the dispatcher, once per module."""
    name = type(model).__module__
    architecture = sys.modules.get(name)
    original = getattr(architecture, "scaled_dot_product_attention", None)
    if original is None or name in _DISPATCHED:
        return
    _DISPATCHED[name] = original
    architecture.scaled_dot_product_attention = dispatcher(original)


def _tap(model: nn.Module) -> TargetTaps:
    """Wrap the decoder layers and the final norm in recording taps (the forward is unchanged)."""
    inner = model.model
    if not hasattr(inner, "layers") or not hasattr(inner, "norm"):
        raise ValueError(f"{type(model).__name__} has no model.layers and model.norm to read hidden states from")
    taps = TargetTaps(model)
    for i, layer in enumerate(inner.layers):
        inner.layers[i] = Tap(layer, i, taps)
    inner.norm = Tap(inner.norm, taps.FINAL, taps)
    return taps


def _unwrapped(module: nn.Module) -> nn.Module:
    """The module under a recording tap, which only records."""
    return module.inner if isinstance(module, Tap) else module


def _why_unpooled(record: Prepared) -> str | None:
    model = record.model()
    assert model is not None
    device = backend()
    if record.exact and device.row_stable_rows == 0:
        return "matrix products on this device are not row-stable"
    if record.lockstep is not None or record.sharded:
        return "a tensor-parallel target: each row's forward is one order to the followers"
    module = type(model).__module__
    name = module.rpartition(".")[2]
    if not module.startswith("mlx_lm.models.") or name not in POOLED_ARCHITECTURES:
        return f"{module}.{type(model).__name__} is not one of the architectures checked to batch"
    for layer in model.model.layers:
        block = _unwrapped(layer)
        if type(block).__module__ != module:
            return f"layer {type(block).__name__} is not {name}'s own"
        if not isinstance(block.self_attn.rope, POSITIONWISE_ROPES):
            return f"RoPE {type(block.self_attn.rope).__name__} computes with its offset"
    if record.attending is Attending.KERNEL:
        if (reason := row_invariant.uncovered(model)) is not None:
            return reason
        dims = sorted({s.head_dim for s in record.shapes()} - set(row_invariant.HEAD_DIMS))
        if dims:
            return f"head size {dims[0]}: the attention kernel takes multiples of 32 up to 256"
    return None


class _ShapeProbe:
    """A layer's cache for one throwaway token: it notes what the layer would keep."""

    offset = 0

    def __init__(self) -> None:
        self.shape: LayerShape | None = None

    def make_mask(self, n: int, window_size: int | None = None, return_array: bool = False) -> None:
        return None

    def update_and_fetch(self, keys: mx.array, values: mx.array) -> tuple[mx.array, mx.array]:
        self.shape = LayerShape(int(keys.shape[1]), int(keys.shape[3]), keys.dtype)
        return keys, values


def _layer_shapes(model: nn.Module) -> list[LayerShape]:
    probes = [_ShapeProbe() for _ in model.model.layers]
    mx.eval(model(mx.array([[0]]), cache=probes))
    shapes = [probe.shape for probe in probes]
    if any(shape is None for shape in shapes):
        raise ValueError(f"{type(model).__name__}: a layer keeps no keys and values")
    return shapes  # type: ignore[return-value]  # none is None
