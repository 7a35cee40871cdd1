"""GPU kernels whose every row is computed the same way whatever the forward's width.

Speculative decoding verifies w tokens in one forward and is exact at T = 0 only if that forward
gives, bit for bit, the logits of w single-token steps; rows of many requests share a tick only
if each row's bits do not depend on the others. On MLX's CUDA backend neither holds: a one-row
matrix product runs a vector kernel and a wider one runs cuBLAS (different reduction order), and
attention with more than one query runs a fused kernel that reduces differently from the
one-query kernel and costs about twenty single steps whenever the key length changes. The
kernels here replace both inside the project's own forwards (`exact_forward()`, entered by the
ticks and the runners). Their CUDA sources are app/runtime/row_attention.cu and row_matmul.cu,
read once; each kernel object is made once, and its compile-time constants once per shape.

- attention: one thread block per (query, head) walks the query's visible keys in a fixed
  order (key j to warp j mod WARPS, an online softmax per warp, warps merged in index order), so a
  query's output depends only on its vector and the keys it may see: over one row's own keys
  (`row_attention`), or over the KV pool, every query of a tick in one call (`pool_attention`);
- matrix products: one warp per output column reads the weight row once and reduces every input
  row over K in the same lane order, so row m's output is the same for one row as for sixteen,
  and a 5-row product costs about what a 1-row product costs. A product of more rows is one
  launch whose thread blocks take MATMUL_ROWS rows each (each row reduced the same way in any
  block), up to the backend's `row_stable_rows`: what lets many rows' tokens share one tick.
  mlx-lm's affine 4- and 8-bit layers take the same walk, widening each weight from its group's
  scale and bias in registers.
- the same products on the tensor cores (app/runtime/row_mma.cu, issue 48), the default
  (MLXCEL_ROW_MMA=0, read once at import, keeps the row kernel: measured and held to every row's
  lone bits on an H100, docs/gpu.md): `mma.sync` m16n8k16
  tiles, K in chunks of 32 split over KSPLIT warps of a block in a fixed order and added in a fixed
  tree, so a row's bits depend on K alone, never on M or on the block tiling picked by M. It
  takes layers whose depth is a multiple of 32 (the others keep the row kernel),
  a choice made from the layer's shape alone. Its bits differ from the row kernel's (another sum
  order), never between row counts.

Anything else (float32 models, other quantizations, masks other than causal or a window) keeps
MLX's kernels; the block loops' exactness probe then reports what remains.
"""

from __future__ import annotations

import struct
import threading
import weakref
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from functools import cache
from pathlib import Path

import mlx.core as mx
import mlx.nn as nn

from app.execution.device import backend
from app.runtime.env import switch

WARPS = 16
ATTENTION_ROWS = 32  # queries per attention call of one row (wider ones keep MLX's kernel)
MATMUL_ROWS = 16  # rows per thread block (a product of more rows is one launch of several blocks' rows)
HEAD_DIMS = tuple(range(32, 257, 32))  # a lane takes HEAD_DIM / 32 values; a warp's sums fit shared memory
COLUMNS_PER_BLOCK = 8
HALF_TYPES = (mx.bfloat16, mx.float16)
QUANTIZED_BITS = (4, 8)  # packings whose chunks of 8 values are whole 32-bit words
ROW_MMA = switch("MLXCEL_ROW_MMA") is not False  # the tensor-core products (row_mma.cu), read once
KSPLIT = 8  # warps of an MMA block splitting K (part of a row's sum order: fixed for every M)
MMA_DEPTH_STEP = 32  # the MMA kernel walks K in chunks of 32
# (row tiles of 16, column tiles of 8 per warp, column warps) per MMA block: how much one block does,
# never a row's bits
MMA_NARROW_TILES = (1, 1, 1)  # up to 16 rows: the most blocks over the weights
# more rows: 4 column tiles a warp (each x fragment serves 32 columns); on an H100 this beat 64-row
# blocks (4, 2, 1) at 32 and 80 rows: the rows' reads from L2, not the weights', bound it there
MMA_WIDE_TILES = (1, 4, 1)
SOURCES = Path(__file__).resolve().parents[1] / "runtime"  # the .cu files, beside sgemm_rows.c


@cache
def _source(name: str) -> str:
    """A kernel file's text, read once per process."""
    return (SOURCES / name).read_text()


# Each kernel is made once (`mx.fast.cuda_kernel` keeps its name, source and argument layout); a
# call hands it arrays and the compile-time constants, and the project's ticks are compiled
# (app/execution/tick.py), so on the GPU a tick replays these launches without building them.
@cache
def _row_attention_kernel() -> Callable[..., list[mx.array]]:
    return mx.fast.cuda_kernel(
        name="mlxcel_row_attention",
        input_names=["q", "k", "v"],
        output_names=["out"],
        header=_source("row_attention.cu"),
        source="mlxcel::row_attention<T, HEAD_DIM, WARPS, CAUSAL>(q, q_shape[1], q_shape[2], q_strides[0], "
        "q_strides[1], q_strides[2], k, k_shape[1], k_shape[2], k_strides[0], k_strides[1], k_strides[2], v, "
        "v_strides[0], v_strides[1], v_strides[2], __int_as_float(SCALE_BITS), out);",
        ensure_row_contiguous=False,
    )


@cache
def _pool_attention_kernel() -> Callable[..., list[mx.array]]:
    return mx.fast.cuda_kernel(
        name="mlxcel_pool_attention",
        input_names=["q", "k", "v", "slots", "first", "visible"],
        output_names=["out"],
        header=_source("row_attention.cu"),
        source="mlxcel::pool_attention<T, HEAD_DIM, WARPS>(q, q_shape[1], q_strides[0], q_strides[1], k, "
        "k_shape[1], k_strides[0], k_strides[1], k_strides[2], v, v_strides[0], v_strides[1], v_strides[2], "
        "slots, first, visible, __int_as_float(SCALE_BITS), out);",
        ensure_row_contiguous=False,
    )


def _outputs(outputs: int) -> str:
    """The three output pointers a product's entry call passes (unused ones repeat out0)."""
    return ", ".join(f"out{i}" if i < outputs else "out0" for i in range(3))


@cache
def _matmul_kernel(outputs: int = 1) -> Callable[..., list[mx.array]]:
    return mx.fast.cuda_kernel(
        name=f"mlxcel_row_matmul_{outputs}",
        input_names=["x", "w"],
        output_names=[f"out{i}" for i in range(outputs)],
        header=_source("row_matmul.cu"),
        source="mlxcel::row_matmul<T, BF16, MAX_ROWS, COLUMNS_PER_BLOCK, DEPTH>(x, x_shape[0], w, w_shape[0], "
        f"{_outputs(outputs)}, SPLIT1, SPLIT2);",
    )


@cache
def _quantized_matmul_kernel(outputs: int = 1) -> Callable[..., list[mx.array]]:
    return mx.fast.cuda_kernel(
        name=f"mlxcel_row_quantized_matmul_{outputs}",
        input_names=["x", "w", "scales", "biases"],
        output_names=[f"out{i}" for i in range(outputs)],
        header=_source("row_matmul.cu"),
        source="mlxcel::row_quantized_matmul<T, BF16, MAX_ROWS, COLUMNS_PER_BLOCK, DEPTH, BITS, GROUP_SIZE>(x, "
        f"x_shape[0], w, scales, biases, w_shape[0], {_outputs(outputs)}, SPLIT1, SPLIT2);",
    )


@cache
def _mma_kernel(outputs: int = 1) -> Callable[..., list[mx.array]]:
    return mx.fast.cuda_kernel(
        name=f"mlxcel_row_mma_{outputs}",
        input_names=["x", "w"],
        output_names=[f"out{i}" for i in range(outputs)],
        header=_source("row_mma.cu"),
        source="mlxcel_mma::row_mma<T, BF16, DEPTH, KSPLIT, ROW_TILES, COLUMN_TILES, COLUMN_WARPS>(x, x_shape[0], w, "
        f"w_shape[0], {_outputs(outputs)}, SPLIT1, SPLIT2);",
    )


@cache
def _quantized_mma_kernel(outputs: int = 1) -> Callable[..., list[mx.array]]:
    return mx.fast.cuda_kernel(
        name=f"mlxcel_row_quantized_mma_{outputs}",
        input_names=["x", "w", "scales", "biases"],
        output_names=[f"out{i}" for i in range(outputs)],
        header=_source("row_mma.cu"),
        source="mlxcel_mma::row_quantized_mma<T, BF16, DEPTH, KSPLIT, ROW_TILES, COLUMN_TILES, COLUMN_WARPS, BITS, "
        "GROUP_SIZE>(x, "
        f"x_shape[0], w, scales, biases, w_shape[0], {_outputs(outputs)}, SPLIT1, SPLIT2);",
    )


@cache
def _attention_template(dtype: mx.Dtype, head_dim: int, scale: float, causal: bool | None) -> list[tuple[str, object]]:
    """A kernel's compile-time constants, made once per (dtype, head size, scale)."""
    template: list[tuple[str, object]] = [
        ("T", dtype),
        ("HEAD_DIM", head_dim),
        ("WARPS", WARPS),
        ("SCALE_BITS", _float_bits(scale)),
    ]
    return template if causal is None else [*template, ("CAUSAL", causal)]


def applies(queries: mx.array, keys: mx.array, mask: object, sinks: object) -> bool:
    """Whether the attention kernel can stand in for the fused one: causal (or single-query), no
    sinks, a head size it was built for, at most ATTENTION_ROWS queries, on an NVIDIA GPU."""
    return _applies(queries.shape, keys, mask, sinks)


def _applies(query_shape: tuple[int, ...], keys: mx.array, mask: object, sinks: object) -> bool:
    return (
        backend().row_invariant_kernels
        and sinks is None
        and (mask is None or (isinstance(mask, str) and mask == "causal"))
        and query_shape[2] <= ATTENTION_ROWS
        and query_shape[-1] in HEAD_DIMS
        and query_shape[-1] == keys.shape[-1]
        and query_shape[1] % keys.shape[1] == 0
    )


def takes(query_shape: tuple[int, ...], keys: mx.array, cache: object, mask: object, sinks: object) -> bool:
    """Whether an installed model's attention call of these queries runs `row_attention` (inside
    `exact_forward()`, a cache whose keys are not quantized, and `applies`)."""
    return _active() and not hasattr(cache, "bits") and _applies(query_shape, keys, mask, sinks)


THREADS = 32 * WARPS  # one attention block: a warp per key lane of the walk


def row_attention(queries: mx.array, keys: mx.array, values: mx.array, scale: float, causal: bool = True) -> mx.array:
    """`[B, H, L, D]` attention output over `keys` `[B, Hk, S, D]`: query l sees keys `[0, S - L + l]`
    when causal, all S otherwise."""
    batch, heads, width, head_dim = queries.shape
    (out,) = _row_attention_kernel()(
        inputs=[queries, keys, values],
        template=_attention_template(queries.dtype, head_dim, scale, causal),
        grid=(batch * heads * width * THREADS, 1, 1),
        threadgroup=(THREADS, 1, 1),
        output_shapes=[queries.shape],
        output_dtypes=[queries.dtype],
    )
    return out


def pool_attention(
    queries: mx.array,
    keys: mx.array,
    values: mx.array,
    slots: mx.array,
    first: mx.array,
    visible: mx.array,
    scale: float,
) -> mx.array:
    """A tick's queries `[N, H, 1, D]` over the KV pool `[slots, Hk, capacity, D]` in one call:
    token t sees keys `[first[t], visible[t])` of slot `slots[t]`, each query with the bits
    `row_attention` gives it over the same keys."""
    tokens, heads, _, head_dim = queries.shape
    (out,) = _pool_attention_kernel()(
        inputs=[queries, keys, values, slots, first, visible],
        template=_attention_template(queries.dtype, head_dim, scale, None),
        grid=(tokens * heads * THREADS, 1, 1),
        threadgroup=(THREADS, 1, 1),
        output_shapes=[queries.shape],
        output_dtypes=[queries.dtype],
    )
    return out


def attention(queries: mx.array, keys: mx.array, values: mx.array, scale: float, causal: bool) -> mx.array:
    """Unmasked or causal attention for the project's own modules (the block drafters): the row
    kernel on the GPU, where MLX's fused kernel costs about twenty single steps per wide call."""
    mask = "causal" if causal else None
    if applies(queries, keys, mask, None) and (causal or queries.shape[2] > 1):
        return row_attention(queries, keys, values, scale, causal)
    return mx.fast.scaled_dot_product_attention(queries, keys, values, scale=scale, mask=mask)


def _float_bits(value: float) -> int:
    """The float32 bit pattern of `value` as a signed int (a compile-time constant of the kernel)."""
    return struct.unpack("<i", struct.pack("<f", value))[0]


_local = threading.local()


@contextmanager
def exact_forward() -> Iterator[None]:
    """Within this block, installed models take this kernel wherever it applies. Only the
    project's own forwards enter it, so an anchor run through stock mlx-lm in the same process
    (the benchmarks') keeps MLX's own attention."""
    previous = getattr(_local, "active", False)
    _local.active = True
    try:
        yield
    finally:
        _local.active = previous


def matmul_applies(x: mx.array, weight: mx.array) -> bool:
    """Whether the matrix-product kernel can stand in for `x @ weight.T`: half-precision rows of
    a depth in 16-byte steps, at most the backend's row-invariant rows of them."""
    depth = x.shape[-1]
    device = backend()
    return (
        device.row_invariant_kernels
        and x.dtype in HALF_TYPES
        and weight.dtype == x.dtype
        and weight.ndim == 2
        and weight.shape[1] == depth
        and depth % 8 == 0
        and x.size // depth <= device.row_stable_rows
    )


def quantized_matmul_applies(x: mx.array, layer: nn.QuantizedLinear | nn.QuantizedEmbedding) -> bool:
    """Whether the quantized kernel can stand in for `layer`'s product: affine 4- or 8-bit weights
    in groups of whole chunks, half-precision rows, at most the backend's row-invariant rows."""
    depth = x.shape[-1]
    device = backend()
    return (
        device.row_invariant_kernels
        and layer.mode == "affine"
        and layer.bits in QUANTIZED_BITS
        and layer.group_size % 8 == 0
        and x.dtype in HALF_TYPES
        and layer["scales"].dtype in HALF_TYPES
        and depth == layer["weight"].shape[1] * 32 // layer.bits
        and depth % layer.group_size == 0
        and x.size // depth <= device.row_stable_rows
    )


def row_matmul(x: mx.array, weight: mx.array, mma: bool | None = None) -> mx.array:
    """`x @ weight.T` for `x` `[..., K]` and `weight` `[N, K]`, each row reduced the same way
    (`mma`: the tensor-core kernel where the layer's depth allows it; None: as MLXCEL_ROW_MMA says)."""
    return _row_products(x, _matmul_kernel, [weight], [weight.shape[0]], mma=mma)[0]


def row_quantized_matmul(
    x: mx.array, layer: nn.QuantizedLinear | nn.QuantizedEmbedding, mma: bool | None = None
) -> mx.array:
    """`layer`'s `x @ dequantize(weight).T`, each row reduced the same way."""
    weights = [layer["weight"], layer["scales"], layer["biases"]]
    return _row_products(x, _quantized_matmul_kernel, weights, [weights[0].shape[0]], _packing(layer), mma=mma)[0]


def mma_takes(depth: int) -> bool:
    """Whether the tensor-core kernel can take a layer of this depth (its shape alone decides,
    so a layer's rows have one kernel's bits at every row count)."""
    return depth % MMA_DEPTH_STEP == 0


def mma_tiles(rows: int) -> tuple[int, int, int]:
    """(row tiles, column tiles, column warps) of an MMA block for a product of `rows` rows: the work one block
    does, which changes no output bit (a row's sum order is K's chunks over KSPLIT warps)."""
    return MMA_NARROW_TILES if rows <= 16 else MMA_WIDE_TILES


def _packing(layer: nn.QuantizedLinear | nn.QuantizedEmbedding) -> list[tuple[str, int]]:
    return [("BITS", layer.bits), ("GROUP_SIZE", layer.group_size)]


def _row_products(
    x: mx.array,
    kernel_of: Callable[[int], Callable[..., list[mx.array]]],
    weights: list[mx.array],
    widths: list[int],
    extra: list[tuple[str, int]] | None = None,
    mma: bool | None = None,
    tiles: tuple[int, int, int] | None = None,
) -> list[mx.array]:
    """The product of `x` `[..., K]` by `weights` (whose rows are the output columns, in parts of
    `widths` columns, one output each): one launch, MATMUL_ROWS rows of `x` to a thread block, or
    the tensor-core kernel's (`mma`, where the depth allows; `tiles` overrides its block's tiles)."""
    flat = x.reshape(-1, x.shape[-1])
    rows, columns = flat.shape[0], sum(widths)
    if (ROW_MMA if mma is None else mma) and mma_takes(flat.shape[1]):
        tiles = tiles or mma_tiles(rows)
        row_tiles, column_tiles, column_warps = tiles
        threads = 32 * KSPLIT * column_warps
        mma_of = _quantized_mma_kernel if kernel_of is _quantized_matmul_kernel else _mma_kernel
        template = _mma_template(flat.dtype, flat.shape[1], tuple(widths), tuple(extra or []), tiles)
        parts = mma_of(len(widths))(
            inputs=[flat, *weights],
            template=template,
            grid=(-(-columns // (8 * column_tiles * column_warps)) * threads, -(-rows // (16 * row_tiles)), 1),
            threadgroup=(threads, 1, 1),
            output_shapes=[(rows, width) for width in widths],
            output_dtypes=[flat.dtype] * len(widths),
        )
        return [part.reshape(*x.shape[:-1], width) for part, width in zip(parts, widths, strict=True)]
    parts = kernel_of(len(widths))(
        inputs=[flat, *weights],
        template=_matmul_template(flat.dtype, flat.shape[1], tuple(widths), tuple(extra or [])),
        grid=(-(-columns // COLUMNS_PER_BLOCK) * MATMUL_THREADS, -(-rows // MATMUL_ROWS), 1),
        threadgroup=(MATMUL_THREADS, 1, 1),
        output_shapes=[(rows, width) for width in widths],
        output_dtypes=[flat.dtype] * len(widths),
    )
    return [part.reshape(*x.shape[:-1], width) for part, width in zip(parts, widths, strict=True)]


MATMUL_THREADS = 32 * COLUMNS_PER_BLOCK  # a warp per output column


def _splits(widths: tuple[int, ...]) -> list[int]:
    """Where each output's columns start (SPLIT1, SPLIT2; the width where there are fewer outputs)."""
    columns = sum(widths)
    starts = [sum(widths[:i]) for i in range(1, len(widths))]
    return [*starts, columns, columns][:2]


@cache
def _mma_template(
    dtype: mx.Dtype,
    depth: int,
    widths: tuple[int, ...],
    extra: tuple[tuple[str, int], ...],
    tiles: tuple[int, int, int],
) -> list[tuple[str, object]]:
    """The MMA product's compile-time constants, made once per (dtype, depth, widths, packing, tiles)."""
    splits = _splits(widths)
    return [
        ("T", dtype),
        ("BF16", dtype == mx.bfloat16),
        ("DEPTH", depth),
        ("KSPLIT", KSPLIT),
        ("ROW_TILES", tiles[0]),
        ("COLUMN_TILES", tiles[1]),
        ("COLUMN_WARPS", tiles[2]),
        *extra,
        ("SPLIT1", splits[0]),
        ("SPLIT2", splits[1]),
    ]


@cache
def _matmul_template(
    dtype: mx.Dtype, depth: int, widths: tuple[int, ...], extra: tuple[tuple[str, int], ...]
) -> list[tuple[str, object]]:
    """A product's compile-time constants, made once per (dtype, depth, layer widths, packing):
    K as DEPTH (a fixed stride between rows: fewer registers), and where each output's columns
    start (SPLIT1, SPLIT2; the product's width where it has fewer outputs)."""
    splits = _splits(widths)
    return [
        ("T", dtype),
        ("BF16", dtype == mx.bfloat16),
        ("MAX_ROWS", MATMUL_ROWS),
        ("COLUMNS_PER_BLOCK", COLUMNS_PER_BLOCK),
        ("DEPTH", depth),
        *extra,
        ("SPLIT1", splits[0]),
        ("SPLIT2", splits[1]),
    ]


class Siblings:
    """Layers that take the same input (q/k/v, gate/up) in one kernel call: a column's bits depend
    only on its weight row and the input row, so each layer's part has the bits of its own call,
    at a third (or half) of the calls. `joined` holds the layers' weights side by side; once the
    model is prepared (app/execution/prepare.py) each layer's own weights are views of its rows of
    them (no second copy). The first layer called with an input computes every part, the others
    take theirs."""

    def __init__(self, layers: list[nn.Module]) -> None:
        # the layers' ids, not the layers: the module table `_joined` holds this, and a reference to
        # a layer here would keep the layer, and so its entry and these weights, for good
        self._ids = [id(layer) for layer in layers]
        self.widths = [layer["weight"].shape[0] for layer in layers]
        quantized = isinstance(layers[0], nn.QuantizedLinear)
        self.names = ["weight", "scales", "biases"] if quantized else ["weight"]
        self.kernel_of = _quantized_matmul_kernel if quantized else _matmul_kernel
        self.extra = _packing(layers[0]) if quantized else []
        self.weights = [mx.concatenate([layer[name] for layer in layers]) for name in self.names]
        mx.eval(self.weights)
        self._input: mx.array | None = None
        self._parts: dict[int, mx.array] = {}

    def views(self) -> list[dict[str, mx.array]]:
        """Each layer's rows of the joined weights, by parameter name."""
        starts = [sum(self.widths[:i]) for i in range(len(self.widths))]
        return [
            {name: joined[start : start + width] for name, joined in zip(self.names, self.weights, strict=True)}
            for start, width in zip(starts, self.widths, strict=True)
        ]

    def product(self, layer: nn.Module, x: mx.array) -> mx.array:
        if x is not self._input or id(layer) not in self._parts:
            parts = _row_products(x, self.kernel_of, self.weights, self.widths, self.extra)
            self._input, self._parts = x, dict(zip(self._ids, parts, strict=True))
        part = self._parts.pop(id(layer))
        if not self._parts:
            self._input = None  # every sibling served: hold no activation
        return part


SIBLING_NAMES = (("q_proj", "k_proj", "v_proj"), ("gate_proj", "up_proj"))
_joined: dict[int, Siblings] = {}  # id(layer): the product it shares (an entry goes with its layer)


def joined(layers: list[nn.Module]) -> Siblings:
    """The layers' joint product, remembered for each of them (app/execution/prepare.py makes it)."""
    siblings = Siblings(layers)
    for layer in layers:
        _joined[id(layer)] = siblings
        weakref.finalize(layer, _joined.pop, id(layer), None)
    return siblings


def siblings_of(layer: nn.Module) -> Siblings | None:
    return _joined.get(id(layer))


def joinable(layers: list[object]) -> bool:
    """Layers of one kind, depth and dtype that a row kernel reads (half-precision, or affine
    4- and 8-bit of one packing), not joined yet."""
    first = layers[0]
    if any(isinstance(layer, nn.Module) and siblings_of(layer) is not None for layer in layers):
        return False
    if isinstance(first, RowInvariantQuantizedLinear):
        kind_ok = first.mode == "affine" and first.bits in QUANTIZED_BITS
        same = all(
            type(layer) is type(first) and layer.mode == first.mode and _packing(layer) == _packing(first)
            for layer in layers
        )
    elif isinstance(first, RowInvariantLinear):
        kind_ok = first.weight.dtype in HALF_TYPES
        same = all(type(layer) is type(first) for layer in layers)
    else:
        return False
    return (
        kind_ok
        and same
        and len({layer["weight"].shape[1] for layer in layers}) == 1
        and len({layer["weight"].dtype for layer in layers}) == 1
        and len({layer["scales"].dtype for layer in layers} if "scales" in first else set()) <= 1
    )


def _active() -> bool:
    return getattr(_local, "active", False)


class RowInvariantLinear(nn.Linear):
    """nn.Linear whose product goes through `row_matmul` inside `exact_forward()`."""

    def __call__(self, x: mx.array) -> mx.array:
        if not (_active() and matmul_applies(x, self.weight)):
            return super().__call__(x)
        siblings = siblings_of(self)
        y = siblings.product(self, x) if siblings is not None else row_matmul(x, self.weight)
        return y + self.bias if "bias" in self else y


class RowInvariantEmbedding(nn.Embedding):
    """nn.Embedding whose tied output projection (`as_linear`) goes through `row_matmul`."""

    def as_linear(self, x: mx.array) -> mx.array:
        if not (_active() and matmul_applies(x, self.weight)):
            return super().as_linear(x)
        return row_matmul(x, self.weight)


class RowInvariantQuantizedLinear(nn.QuantizedLinear):
    """nn.QuantizedLinear whose product goes through `row_quantized_matmul` inside `exact_forward()`."""

    def __call__(self, x: mx.array) -> mx.array:
        if not (_active() and quantized_matmul_applies(x, self)):
            return super().__call__(x)
        siblings = siblings_of(self)
        y = siblings.product(self, x) if siblings is not None else row_quantized_matmul(x, self)
        return y + self["bias"] if "bias" in self else y


class RowInvariantQuantizedEmbedding(nn.QuantizedEmbedding):
    """nn.QuantizedEmbedding whose tied output projection goes through `row_quantized_matmul`."""

    def as_linear(self, x: mx.array) -> mx.array:
        if not (_active() and quantized_matmul_applies(x, self)):
            return super().as_linear(x)
        return row_quantized_matmul(x, self)


# mlx-lm's layer classes and the ones whose products take the kernels (app/execution/prepare.py
# gives a model's layers these classes: the same parameters, another __call__)
ROUTED = {
    nn.Linear: RowInvariantLinear,
    nn.Embedding: RowInvariantEmbedding,
    nn.QuantizedLinear: RowInvariantQuantizedLinear,
    nn.QuantizedEmbedding: RowInvariantQuantizedEmbedding,
}


def uncovered(model: nn.Module) -> str | None:
    """Why some product of `model` would not take the row-invariant kernel (None: every one does):
    a layer the routing did not reach, or weights the kernels do not read."""
    for name, module in model.named_modules():
        if type(module) in ROUTED:
            return f"{name} is MLX's own {type(module).__name__}, not the row-invariant one"
        if isinstance(module, RowInvariantQuantizedLinear | RowInvariantQuantizedEmbedding):
            if module.mode != "affine" or module.bits not in QUANTIZED_BITS:
                return f"{name} is {module.mode} {module.bits}-bit: the kernel reads affine 4- and 8-bit weights"
        elif isinstance(module, RowInvariantLinear | RowInvariantEmbedding) and module.weight.dtype not in HALF_TYPES:
            return f"{name} computes in {module.weight.dtype}: the kernel reads half-precision weights"
    return None
