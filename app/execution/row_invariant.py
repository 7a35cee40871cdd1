"""GPU kernels whose every row is computed the same way whatever the forward's width.

Speculative decoding verifies w tokens in one forward and is exact at T = 0 only if that forward
gives, bit for bit, the logits of w single-token steps. On MLX's CUDA backend it does not: a
one-row matrix product runs a vector kernel and a wider one runs cuBLAS (different reduction
order), and attention with more than one query runs a fused kernel that reduces differently from
the one-query kernel and costs about twenty single steps whenever the key length changes, which
it does on every call while decoding. The two kernels here replace both inside the project's own
forwards (`exact_forward()`, entered by `ModelRunner`):

- attention: one thread block per (row, head, query) walks the query's visible keys in a fixed
  order (key j to warp j mod WARPS, an online softmax per warp, warps merged in index order), so a
  query's output depends only on its vector and the keys it may see;
- matrix products: one warp per output column reads the weight row once and reduces every input
  row over K in the same lane order, so row m's output is the same for one row as for sixteen,
  and a 5-row product costs about what a 1-row product costs. A product of more rows runs in
  slices of MATMUL_ROWS (each row reduced the same way in any slice), up to the backend's
  `row_stable_rows`: what lets many rows' tokens share one forward (app/execution/forward.py).
  mlx-lm's affine 4- and 8-bit layers take the same walk, widening each weight from its group's
  scale and bias in registers.

Anything else (prefill of long prompts, float32 models, other quantizations, masks other than
causal) keeps MLX's kernels; the block loops' exactness probe then reports what remains.
"""

from __future__ import annotations

import struct
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from functools import cache

import mlx.core as mx
import mlx.nn as nn

from app.execution.device import backend

WARPS = 16
ATTENTION_ROWS = 32  # queries per attention call
MATMUL_ROWS = 16  # rows per kernel call (a slice of a wider product): the widest verify forward
HEAD_DIMS = (64, 96, 128, 256)  # multiples of 32: a lane takes HEAD_DIM / 32 values

# What each thread of both attention kernels knows first: its lane and warp, the scale's bits.
_ATTENTION_LANES = """
    constexpr int PER_LANE = HEAD_DIM / 32;
    const float scale = __int_as_float(SCALE_BITS);
    const float minus_inf = __int_as_float(0xff800000);
    const int lane = threadIdx.x % 32;
    const int warp = threadIdx.x / 32;
"""
# One thread block per (query, head): the query's visible keys are walked in a fixed order (key j
# to warp j mod WARPS, an online softmax per warp, warps merged in index order). The walk is one
# text for both kernels below, so a query's output has the same bits whichever kernel ran it.
_ATTENTION_WALK = """    float qv[PER_LANE];
    float acc[PER_LANE];
    for (int e = 0; e < PER_LANE; ++e) {
        qv[e] = static_cast<float>(qp[e]) * scale;
        acc[e] = 0.0f;
    }
    float m = minus_inf;
    float l = 0.0f;
    for (int j = warp; j < visible; j += WARPS) {
        const T* kj = kp + j * k_step;
        const T* vj = vp + j * v_step;
        float s = 0.0f;
        for (int e = 0; e < PER_LANE; ++e) {
            s += qv[e] * static_cast<float>(kj[e]);
        }
        for (int offset = 16; offset > 0; offset /= 2) {
            s += __shfl_xor_sync(0xffffffff, s, offset);
        }
        const float m_new = fmaxf(m, s);
        const float carry = __expf(m - m_new);
        const float p = __expf(s - m_new);
        l = l * carry + p;
        for (int e = 0; e < PER_LANE; ++e) {
            acc[e] = acc[e] * carry + p * static_cast<float>(vj[e]);
        }
        m = m_new;
    }

    __shared__ float warp_max[WARPS];
    __shared__ float warp_sum[WARPS];
    __shared__ float warp_acc[WARPS][HEAD_DIM];
    if (lane == 0) {
        warp_max[warp] = m;
        warp_sum[warp] = l;
    }
    for (int e = 0; e < PER_LANE; ++e) {
        warp_acc[warp][lane * PER_LANE + e] = acc[e];
    }
    __syncthreads();
    const int d = threadIdx.x;
    if (d < HEAD_DIM) {
        float top = minus_inf;
        for (int w = 0; w < WARPS; ++w) {
            top = fmaxf(top, warp_max[w]);
        }
        float total = 0.0f;
        float value = 0.0f;
        for (int w = 0; w < WARPS; ++w) {
            const float weight = warp_max[w] == minus_inf ? 0.0f : __expf(warp_max[w] - top);
            total += warp_sum[w] * weight;
            value += warp_acc[w][d] * weight;
        }
        out[(size_t)blockIdx.x * HEAD_DIM + d] = static_cast<T>(value / total);
    }
"""
_ATTENTION_SOURCE = (
    _ATTENTION_LANES
    + """    const int queries = q_shape[2];
    const int heads = q_shape[1];
    const int kv_heads = k_shape[1];
    const int keys = k_shape[2];
    const int row = blockIdx.x;
    const int i = row % queries;
    const int h = (row / queries) % heads;
    const int b = row / (queries * heads);
    const int hk = h / (heads / kv_heads);
    const int visible = CAUSAL ? keys - queries + i + 1 : keys;
    const long long k_step = k_strides[2];
    const long long v_step = v_strides[2];

    const T* qp = q + b * q_strides[0] + h * q_strides[1] + i * q_strides[2] + lane * PER_LANE;
    const T* kp = k + b * k_strides[0] + hk * k_strides[1] + lane * PER_LANE;
    const T* vp = v + b * v_strides[0] + hk * v_strides[1] + lane * PER_LANE;
"""
    + _ATTENTION_WALK
)

# Many rows' queries in one call: queries `[N, H, 1, D]` of a flattened batch, row r's keys and
# values its own cache's `k{r}`, `v{r}` `[1, Hk, S_r, D]`; token t belongs to row `token_rows[t]`
# and has `token_tails[t]` later tokens of its row in the batch, so it sees keys `[0, S_r - tail)`,
# as its row's causal call would. `{cases}` picks row r's arrays (the kernel is made per row count).
_ROWS_ATTENTION_SOURCE = (
    _ATTENTION_LANES
    + """    const int heads = q_shape[1];
    const int t = blockIdx.x / heads;
    const int h = blockIdx.x % heads;
    const T* kp = nullptr;
    const T* vp = nullptr;
    int keys = 0;
    long long k_step = 0;
    long long v_step = 0;
    switch (token_rows[t]) {
{cases}
    }
    const int visible = keys - token_tails[t];
    const T* qp = q + t * q_strides[0] + h * q_strides[1] + lane * PER_LANE;
    kp += lane * PER_LANE;
    vp += lane * PER_LANE;
"""
)
_ROWS_ATTENTION_CASE = """        case {r}: {{
            const int hk = h / (heads / k{r}_shape[1]);
            kp = k{r} + hk * k{r}_strides[1];
            vp = v{r} + hk * v{r}_strides[1];
            keys = k{r}_shape[2];
            k_step = k{r}_strides[2];
            v_step = v{r}_strides[2];
            break;
        }}"""
ROWS_PER_ATTENTION = 16  # rows (each its own keys) one call takes; calls are made for 2, 4, 8, 16


# One warp per output column n: lane l takes the 16-byte chunks l, l + 32, ... of the weight row
# (8 values each), every input row m accumulates its own float sum over them in that fixed order,
# then the warp reduces by butterfly. Half-precision values are widened by bit operations, in
# registers.
_MATMUL_HEADER = """
template <bool BF16>
__device__ __forceinline__ void mlxcel_widen(const uint4& pack, float (&out)[8]) {
    const unsigned int words[4] = {pack.x, pack.y, pack.z, pack.w};
    #pragma unroll
    for (int i = 0; i < 4; ++i) {
        if (BF16) {
            out[2 * i] = __uint_as_float(words[i] << 16);
            out[2 * i + 1] = __uint_as_float(words[i] & 0xffff0000u);
        } else {
            out[2 * i] = __half2float(__ushort_as_half((unsigned short)(words[i] & 0xffffu)));
            out[2 * i + 1] = __half2float(__ushort_as_half((unsigned short)(words[i] >> 16)));
        }
    }
}
"""
# Both products' second half: every input row m accumulates the chunk's 8 widened weights `wf`
# against its own 8 values in a fixed order, then the warp reduces each row by butterfly.
_ROWS_TIMES_WEIGHTS = """        #pragma unroll
        for (int m = 0; m < MAX_ROWS; ++m) {
            if (m < rows) {
                float xf[8];
                mlxcel_widen<BF16>(xs[(size_t)m * chunks + c], xf);
                float sum = acc[m];
                #pragma unroll
                for (int e = 0; e < 8; ++e) {
                    sum = fmaf(wf[e], xf[e], sum);
                }
                acc[m] = sum;
            }
        }
    }
    #pragma unroll
    for (int m = 0; m < MAX_ROWS; ++m) {
        if (m < rows) {
            float sum = acc[m];
            for (int offset = 16; offset > 0; offset /= 2) {
                sum += __shfl_xor_sync(0xffffffff, sum, offset);
            }
            if (lane == 0) {
{store}
            }
        }
    }
"""
_MATMUL_SOURCE = (
    """
    const int rows = x_shape[0];
    const int chunks = x_shape[1] / 8;
    const int columns = w_shape[0];
    const int lane = threadIdx.x % 32;
    const int n = blockIdx.x * COLUMNS_PER_BLOCK + threadIdx.x / 32;
    if (n >= columns) {
        return;
    }
    const uint4* wn = reinterpret_cast<const uint4*>(w) + (size_t)n * chunks;
    const uint4* xs = reinterpret_cast<const uint4*>(x);
    float acc[MAX_ROWS];
    #pragma unroll
    for (int m = 0; m < MAX_ROWS; ++m) {
        acc[m] = 0.0f;
    }
    #pragma unroll 4
    for (int c = lane; c < chunks; c += 32) {
        float wf[8];
        mlxcel_widen<BF16>(wn[c], wf);
"""
    + _ROWS_TIMES_WEIGHTS
)
# The same walk over mlx-lm's affine-quantized weights (`QuantizedLinear`, 4 or 8 bits): a chunk of
# 8 values is one 32-bit word at 4 bits and two at 8, widened as `scale * q + bias` of its group,
# then reduced exactly as above, so a quantized model's rows are as row-invariant as a bf16 one's.
_QUANTIZED_MATMUL_SOURCE = (
    """
    constexpr int WORDS = BITS / 4;  // 32-bit words per chunk of 8 values
    constexpr unsigned int MASK = (1u << BITS) - 1u;
    const int rows = x_shape[0];
    const int chunks = x_shape[1] / 8;
    const int columns = w_shape[0];
    const int groups = scales_shape[1];
    const int lane = threadIdx.x % 32;
    const int n = blockIdx.x * COLUMNS_PER_BLOCK + threadIdx.x / 32;
    if (n >= columns) {
        return;
    }
    const uint32_t* wn = w + (size_t)n * chunks * WORDS;
    const auto* sn = scales + (size_t)n * groups;
    const auto* bn = biases + (size_t)n * groups;
    const uint4* xs = reinterpret_cast<const uint4*>(x);
    float acc[MAX_ROWS];
    #pragma unroll
    for (int m = 0; m < MAX_ROWS; ++m) {
        acc[m] = 0.0f;
    }
    #pragma unroll 4
    for (int c = lane; c < chunks; c += 32) {
        const int g = (c * 8) / GROUP_SIZE;
        const float scale = static_cast<float>(sn[g]);
        const float bias = static_cast<float>(bn[g]);
        float wf[8];
        #pragma unroll
        for (int word = 0; word < WORDS; ++word) {
            const uint32_t packed = wn[(size_t)c * WORDS + word];
            #pragma unroll
            for (int e = 0; e < 8 / WORDS; ++e) {
                const float q = static_cast<float>((packed >> (BITS * e)) & MASK);
                wf[word * (8 / WORDS) + e] = fmaf(q, scale, bias);
            }
        }
"""
    + _ROWS_TIMES_WEIGHTS
)
COLUMNS_PER_BLOCK = 8
HALF_TYPES = (mx.bfloat16, mx.float16)
QUANTIZED_BITS = (4, 8)  # packings whose chunks of 8 values are whole 32-bit words


@cache
def _attention_kernel() -> object:
    return mx.fast.cuda_kernel(
        name="mlxcel_row_attention",
        input_names=["q", "k", "v"],
        output_names=["out"],
        source=_ATTENTION_SOURCE,
        ensure_row_contiguous=False,
    )


@cache
def _rows_attention_kernel(rows: int) -> object:
    cases = "\n".join(_ROWS_ATTENTION_CASE.format(r=r) for r in range(rows))
    return mx.fast.cuda_kernel(
        name=f"mlxcel_rows_attention_{rows}",
        input_names=["q", "token_rows", "token_tails", *(f"{x}{r}" for r in range(rows) for x in "kv")],
        output_names=["out"],
        source=_ROWS_ATTENTION_SOURCE.replace("{cases}", cases) + _ATTENTION_WALK,
        ensure_row_contiguous=False,
    )


def _store(outputs: int) -> str:
    """Where column n of row m goes: one output, or (a fused product) the output whose columns
    hold n, split at the template's SPLIT1, SPLIT2, ..."""
    if outputs == 1:
        return "                out0[(size_t)m * columns + n] = static_cast<T>(sum);"
    bounds = ["0", *(f"SPLIT{i}" for i in range(1, outputs)), "columns"]
    cases = [
        f"if (n < {bounds[i + 1]}) {{ out{i}[(size_t)m * ({bounds[i + 1]} - {bounds[i]}) + n - {bounds[i]}] = "
        "static_cast<T>(sum); }"
        for i in range(outputs)
    ]
    return "                " + " else ".join(cases)


@cache
def _matmul_kernel(outputs: int = 1) -> object:
    return mx.fast.cuda_kernel(
        name=f"mlxcel_row_matmul_{outputs}",
        input_names=["x", "w"],
        output_names=[f"out{i}" for i in range(outputs)],
        source=_MATMUL_SOURCE.replace("{store}", _store(outputs)),
        header=_MATMUL_HEADER,
    )


@cache
def _quantized_matmul_kernel(outputs: int = 1) -> object:
    return mx.fast.cuda_kernel(
        name=f"mlxcel_row_quantized_matmul_{outputs}",
        input_names=["x", "w", "scales", "biases"],
        output_names=[f"out{i}" for i in range(outputs)],
        source=_QUANTIZED_MATMUL_SOURCE.replace("{store}", _store(outputs)),
        header=_MATMUL_HEADER,
    )


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


def row_attention(queries: mx.array, keys: mx.array, values: mx.array, scale: float, causal: bool = True) -> mx.array:
    """`[B, H, L, D]` attention output over `keys` `[B, Hk, S, D]`: query l sees keys `[0, S - L + l]`
    when causal, all S otherwise."""
    batch, heads, width, head_dim = queries.shape
    rows = batch * heads * width
    threads = 32 * WARPS
    (out,) = _attention_kernel()(
        inputs=[queries, keys, values],
        template=[
            ("T", queries.dtype),
            ("HEAD_DIM", head_dim),
            ("WARPS", WARPS),
            ("SCALE_BITS", _float_bits(scale)),
            ("CAUSAL", causal),
        ],
        grid=(rows * threads, 1, 1),
        threadgroup=(threads, 1, 1),
        output_shapes=[queries.shape],
        output_dtypes=[queries.dtype],
    )
    return out


def rows_attention(
    queries: mx.array,
    fetched: list[tuple[mx.array, mx.array]],
    token_rows: mx.array,
    token_tails: mx.array,
    scale: float,
) -> mx.array:
    """Causal attention of a flattened batch's queries `[N, H, 1, D]` over each row's own keys and
    values (`fetched[r]`, `[1, Hk, S_r, D]`), in one kernel call: each query's output has the bits
    `row_attention` gives it in its row's own call. At most ROWS_PER_ATTENTION rows; the kernel is
    made for the next power of two (padded with the last row's arrays, which no token reads), so
    a few shapes cover every batch."""
    padded = 2
    while padded < len(fetched):
        padded *= 2
    arrays = [a for pair in fetched + [fetched[-1]] * (padded - len(fetched)) for a in pair]
    tokens, heads, _, head_dim = queries.shape
    threads = 32 * WARPS
    (out,) = _rows_attention_kernel(padded)(
        inputs=[queries, token_rows, token_tails, *arrays],
        template=[("T", queries.dtype), ("HEAD_DIM", head_dim), ("WARPS", WARPS), ("SCALE_BITS", _float_bits(scale))],
        grid=(tokens * heads * threads, 1, 1),
        threadgroup=(threads, 1, 1),
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


def row_matmul(x: mx.array, weight: mx.array) -> mx.array:
    """`x @ weight.T` for `x` `[..., K]` and `weight` `[N, K]`, each row reduced the same way."""
    return _row_products(x, _matmul_kernel, [weight], [weight.shape[0]])[0]


def row_quantized_matmul(x: mx.array, layer: nn.QuantizedLinear | nn.QuantizedEmbedding) -> mx.array:
    """`layer`'s `x @ dequantize(weight).T`, each row reduced the same way."""
    weights = [layer["weight"], layer["scales"], layer["biases"]]
    return _row_products(x, _quantized_matmul_kernel, weights, [weights[0].shape[0]], _packing(layer))[0]


def _packing(layer: nn.QuantizedLinear | nn.QuantizedEmbedding) -> list[tuple[str, int]]:
    return [("BITS", layer.bits), ("GROUP_SIZE", layer.group_size)]


def _row_products(
    x: mx.array,
    kernel_of: Callable[[int], Callable[..., list[mx.array]]],
    weights: list[mx.array],
    widths: list[int],
    extra: list[tuple[str, int]] | None = None,
) -> list[mx.array]:
    """The product of `x` `[..., K]` by `weights` (whose rows are the output columns, in parts of
    `widths` columns, one output each), MATMUL_ROWS rows of `x` per kernel call."""
    kernel = kernel_of(len(widths))
    flat = x.reshape(-1, x.shape[-1])
    calls = [
        _matmul_call(kernel, [flat[i : i + MATMUL_ROWS], *weights], widths, extra or [])
        for i in range(0, flat.shape[0], MATMUL_ROWS)
    ]
    parts = calls[0] if len(calls) == 1 else [mx.concatenate(part) for part in zip(*calls, strict=True)]
    return [part.reshape(*x.shape[:-1], width) for part, width in zip(parts, widths, strict=True)]


def _matmul_call(
    kernel: Callable[..., list[mx.array]], inputs: list[mx.array], widths: list[int], extra: list[tuple[str, int]]
) -> list[mx.array]:
    """One kernel call: rows `inputs[0]` `[M <= MATMUL_ROWS, K]` times the weights that follow."""
    rows = inputs[0]
    columns = sum(widths)
    splits = [(f"SPLIT{i}", sum(widths[:i])) for i in range(1, len(widths))]
    threads = 32 * COLUMNS_PER_BLOCK
    return kernel(
        inputs=inputs,
        template=[
            ("T", rows.dtype),
            ("BF16", rows.dtype == mx.bfloat16),
            ("MAX_ROWS", MATMUL_ROWS),
            ("COLUMNS_PER_BLOCK", COLUMNS_PER_BLOCK),
            *extra,
            *splits,
        ],
        grid=(-(-columns // COLUMNS_PER_BLOCK) * threads, 1, 1),
        threadgroup=(threads, 1, 1),
        output_shapes=[(rows.shape[0], width) for width in widths],
        output_dtypes=[rows.dtype] * len(widths),
    )


class Siblings:
    """Layers that take the same input (q/k/v, gate/up) in one kernel call: a column's bits depend
    only on its weight row and the input row, so each layer's part has the bits of its own call,
    at a third (or half) of the calls. Each layer keeps a view of its rows of the joined weights
    (no second copy); the first layer called with an input computes every part, the others take
    theirs."""

    def __init__(self, layers: list[nn.Module]) -> None:
        self.layers = layers
        self.widths = [layer["weight"].shape[0] for layer in layers]
        quantized = isinstance(layers[0], nn.QuantizedLinear)
        names = ["weight", "scales", "biases"] if quantized else ["weight"]
        self.kernel_of = _quantized_matmul_kernel if quantized else _matmul_kernel
        self.extra = _packing(layers[0]) if quantized else []
        self.weights = [mx.concatenate([layer[name] for layer in layers]) for name in names]
        mx.eval(self.weights)
        start = 0
        for layer, width in zip(layers, self.widths, strict=True):
            layer.update(
                {name: joined[start : start + width] for name, joined in zip(names, self.weights, strict=True)}
            )
            layer.siblings = self
            start += width
        mx.eval([layer.parameters() for layer in layers])
        self._input: mx.array | None = None
        self._parts: dict[int, mx.array] = {}

    def product(self, layer: nn.Module, x: mx.array) -> mx.array:
        if x is not self._input or id(layer) not in self._parts:
            parts = _row_products(x, self.kernel_of, self.weights, self.widths, self.extra)
            self._input, self._parts = x, {id(sibling): part for sibling, part in zip(self.layers, parts, strict=True)}
        part = self._parts.pop(id(layer))
        if not self._parts:
            self._input = None  # every sibling served: hold no activation
        return part


SIBLING_NAMES = (("q_proj", "k_proj", "v_proj"), ("gate_proj", "up_proj"))


def _join_siblings(model: nn.Module) -> None:
    """Join each attention's q/k/v and each MLP's gate/up layers that the kernels take alike."""
    for _, module in model.named_modules():
        for names in SIBLING_NAMES:
            layers = [getattr(module, name, None) for name in names]
            if _joinable(layers):
                Siblings(layers)


def _joinable(layers: list[object]) -> bool:
    """Layers of one kind, depth and dtype that a row kernel reads (half-precision, or affine
    4- and 8-bit of one packing)."""
    first = layers[0]
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

    siblings: Siblings | None = None

    def __call__(self, x: mx.array) -> mx.array:
        if not (_active() and matmul_applies(x, self.weight)):
            return super().__call__(x)
        y = self.siblings.product(self, x) if self.siblings is not None else row_matmul(x, self.weight)
        return y + self.bias if "bias" in self else y


class RowInvariantEmbedding(nn.Embedding):
    """nn.Embedding whose tied output projection (`as_linear`) goes through `row_matmul`."""

    def as_linear(self, x: mx.array) -> mx.array:
        if not (_active() and matmul_applies(x, self.weight)):
            return super().as_linear(x)
        return row_matmul(x, self.weight)


class RowInvariantQuantizedLinear(nn.QuantizedLinear):
    """nn.QuantizedLinear whose product goes through `row_quantized_matmul` inside `exact_forward()`."""

    siblings: Siblings | None = None

    def __call__(self, x: mx.array) -> mx.array:
        if not (_active() and quantized_matmul_applies(x, self)):
            return super().__call__(x)
        y = self.siblings.product(self, x) if self.siblings is not None else row_quantized_matmul(x, self)
        return y + self["bias"] if "bias" in self else y


class RowInvariantQuantizedEmbedding(nn.QuantizedEmbedding):
    """nn.QuantizedEmbedding whose tied output projection goes through `row_quantized_matmul`."""

    def as_linear(self, x: mx.array) -> mx.array:
        if not (_active() and quantized_matmul_applies(x, self)):
            return super().as_linear(x)
        return row_quantized_matmul(x, self)


ROUTED = {
    nn.Linear: RowInvariantLinear,
    nn.Embedding: RowInvariantEmbedding,
    nn.QuantizedLinear: RowInvariantQuantizedLinear,
    nn.QuantizedEmbedding: RowInvariantQuantizedEmbedding,
}


def uncovered(model: nn.Module) -> str | None:
    """Why some product of `model` would not take the row-invariant kernel (None: every one does):
    a layer `install` did not reach, or weights the kernels do not read."""
    for name, module in model.named_modules():
        if type(module) in ROUTED:
            return f"{name} is MLX's own {type(module).__name__}, not the row-invariant one"
        if isinstance(module, RowInvariantQuantizedLinear | RowInvariantQuantizedEmbedding):
            if module.mode != "affine" or module.bits not in QUANTIZED_BITS:
                return f"{name} is {module.mode} {module.bits}-bit: the kernel reads affine 4- and 8-bit weights"
        elif isinstance(module, RowInvariantLinear | RowInvariantEmbedding) and module.weight.dtype not in HALF_TYPES:
            return f"{name} computes in {module.weight.dtype}: the kernel reads half-precision weights"
    return None


def install(model: nn.Module) -> bool:
    """Route `model`'s projections and its architecture's attention through these kernels inside
    `exact_forward()`. False where the architecture module has no attention function of mlx-lm's
    shape (the projections are routed all the same)."""
    for _, module in model.named_modules():
        if type(module) in ROUTED:
            module.__class__ = ROUTED[type(module)]
    _join_siblings(model)
    architecture = sys.modules.get(type(model).__module__)
    fused = getattr(architecture, "scaled_dot_product_attention", None)
    if architecture is None or fused is None:
        return False
    if getattr(fused, "row_invariant", False):
        return True

    def attention(queries, keys, values, cache, scale, mask, sinks=None):  # noqa: ANN001, ANN202
        if takes(queries.shape, keys, cache, mask, sinks):
            return row_attention(queries, keys, values, scale)
        return fused(queries, keys, values, cache=cache, scale=scale, mask=mask, sinks=sinks)

    attention.row_invariant = True  # type: ignore[attr-defined]
    architecture.scaled_dot_product_attention = attention
    return True
