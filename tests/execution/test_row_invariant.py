"""Row-invariant forwards: a width-w forward gives the bits of w single steps.

On the CPU the BLAS shim makes that hold; on CUDA the kernels of app/execution/row_invariant.py
do. The GPU tests run where MLX computes on a GPU (docs/gpu.md: `python3 -m pytest --noconftest
tests/execution/test_row_invariant.py` on the H200); on the CPU they skip, and the CPU tests check
what applies there: the bf16 probe, and that installing the kernels leaves CPU forwards alone.
"""

from __future__ import annotations

import mlx.core as mx
import mlx.nn as nn
import pytest

from app.decoding.builder import LoopBuilder, RowRequest
from app.decoding.exactness import probe_width
from app.decoding.plan import LoopPlan, plan_from_settings
from app.execution import row_invariant
from app.execution.device import backend
from app.execution.model import load_model
from app.execution.prepare import prepare
from app.execution.runner import ModelRunner
from app.loading import EMBEDDED_DRAFTER, EMBEDDED_TARGET
from app.loading.paths import REPO_ROOT
from app.profiles.schema import DrafterSettings, Settings
from app.sampling import SamplingParams

gpu_only = pytest.mark.skipif(
    not backend().row_invariant_kernels, reason="the row-invariant kernels run on an NVIDIA GPU only"
)
PROMPTS = ([11, 42, 7, 300, 19, 5, 88], [901, 17, 17, 4, 250, 6, 2047, 33, 512], list(range(100, 160)))


def test_the_probe_compares_bf16_logits_without_crashing() -> None:
    """numpy has no bfloat16: the probe used to raise on bf16 logits (any bf16 model too large for
    the CPU's float32 upcast). It compares them in float32, which holds every bf16 value exactly."""
    model = load_model(EMBEDDED_TARGET, dtype="bfloat16").model
    verdict = probe_width(model, 5)
    assert verdict.width == 5
    if not verdict.exact:  # a bf16 difference is reported as a number, not an exception
        assert verdict.max_difference > 0


def test_installing_the_kernels_leaves_cpu_forwards_unchanged() -> None:
    """On the CPU every kernel call falls back to MLX's own: same bits as an untouched model."""
    if backend().row_invariant_kernels:
        pytest.skip("the kernels apply on CUDA")
    plain = load_model(EMBEDDED_TARGET).model
    routed = load_model(EMBEDDED_TARGET).model
    for _, module in routed.named_modules():  # the routing prepare() gives a model on CUDA
        if type(module) in row_invariant.ROUTED:
            module.__class__ = row_invariant.ROUTED[type(module)]
    assert type(routed.model.layers[0].self_attn.q_proj) is row_invariant.RowInvariantLinear
    for prompt in PROMPTS:
        a, b = ModelRunner(plain), ModelRunner(routed)
        first = mx.array_equal(a.prefill(prompt[:-1]), b.prefill(prompt[:-1]))
        assert first.item()
        assert mx.array_equal(a.forward(prompt[-3:]), b.forward(prompt[-3:])).item()


@gpu_only
def test_row_matmul_rows_do_not_depend_on_the_row_count() -> None:
    mx.random.seed(0)
    for depth, columns in ((256, 1024), (256, 4096), (512, 256), (2048, 6144)):
        weight = mx.random.normal((columns, depth)).astype(mx.bfloat16)
        x = mx.random.normal((140, depth)).astype(mx.bfloat16)  # past one thread block's 16 rows: nine of them
        single = mx.concatenate([row_invariant.row_matmul(x[i : i + 1], weight) for i in range(x.shape[0])])
        for rows in (2, 3, 5, 8, row_invariant.MATMUL_ROWS, 17, 40, 70, 100, 140):
            assert mx.array_equal(row_invariant.row_matmul(x[:rows], weight), single[:rows]).item(), (depth, rows)
        # and it is a matrix product: within bf16 rounding of MLX's
        assert mx.allclose(single.astype(mx.float32), (x @ weight.T).astype(mx.float32), atol=0.5, rtol=0.02).item()


@gpu_only
@pytest.mark.parametrize("bits", row_invariant.QUANTIZED_BITS)
def test_quantized_row_matmul_rows_do_not_depend_on_the_row_count(bits: int) -> None:
    mx.random.seed(2)
    for depth, columns in ((256, 1024), (2048, 6144), (6144, 2048)):
        layer = nn.QuantizedLinear(depth, columns, bias=False, group_size=64, bits=bits)
        layer.update({"scales": layer.scales.astype(mx.bfloat16), "biases": layer.biases.astype(mx.bfloat16)})
        layer.__class__ = row_invariant.RowInvariantQuantizedLinear
        x = mx.random.normal((140, depth)).astype(mx.bfloat16)
        with row_invariant.exact_forward():
            single = mx.concatenate([layer(x[i : i + 1]) for i in range(x.shape[0])])
            for rows in (2, 3, 5, 8, row_invariant.MATMUL_ROWS, 17, 40, 70, 100, 140):
                assert mx.array_equal(layer(x[:rows]), single[:rows]).item(), (bits, depth, rows)
        # and it is the layer's product: within bf16 rounding of MLX's quantized matmul
        reference = nn.QuantizedLinear.__call__(layer, x).astype(mx.float32)
        assert mx.allclose(single.astype(mx.float32), reference, atol=0.5, rtol=0.02).item(), (bits, depth)


@gpu_only
@pytest.mark.parametrize("dtype", row_invariant.HALF_TYPES)
def test_tensor_core_products_rows_do_not_depend_on_the_row_count(dtype: mx.Dtype) -> None:
    """The tensor-core kernel (MLXCEL_ROW_MMA, app/runtime/row_mma.cu): one block tiling up to 16
    rows and another past them, the same bits for every row; affine 4- and 8-bit too."""
    mx.random.seed(4)
    for depth, columns in ((256, 1024), (2048, 6144), (6144, 2048)):
        weight = (mx.random.normal((columns, depth)) * depth**-0.5).astype(dtype)
        x = mx.random.normal((140, depth)).astype(dtype)
        layers: list[nn.QuantizedLinear | None] = [None]
        if dtype == mx.bfloat16:
            for bits in row_invariant.QUANTIZED_BITS:
                layer = nn.QuantizedLinear(depth, columns, bias=False, group_size=64, bits=bits)
                q, scales, biases = mx.quantize(weight, group_size=64, bits=bits)
                layer.update({"weight": q, "scales": scales.astype(dtype), "biases": biases.astype(dtype)})
                layers.append(layer)
        for layer in layers:

            def product(a: mx.array, layer: nn.QuantizedLinear | None = layer, weight: mx.array = weight) -> mx.array:
                if layer is None:
                    return row_invariant.row_matmul(a, weight, mma=True)
                return row_invariant.row_quantized_matmul(a, layer, mma=True)

            single = mx.concatenate([product(x[i : i + 1]) for i in range(x.shape[0])])
            for rows in (2, 3, 5, 8, 16, 17, 40, 65, 100, 140):
                assert mx.array_equal(product(x[:rows]), single[:rows]).item(), (depth, rows, layer is None)
            reference = x @ weight.T if layer is None else nn.QuantizedLinear.__call__(layer, x)
            close = mx.allclose(single.astype(mx.float32), reference.astype(mx.float32), atol=0.05, rtol=0.02)
            assert close.item(), (depth, layer is None)


@gpu_only
@pytest.mark.parametrize("quantized", [False, True])
def test_joined_sibling_products_are_each_layers_own(quantized: bool) -> None:
    """q/k/v and gate/up run as one call (row_invariant.Siblings); each layer's part has the bits
    of its own product, and the layers keep their own weights' values."""
    loaded = load_model(EMBEDDED_TARGET, dtype="bfloat16")
    model = loaded.model
    if quantized:
        nn.quantize(model, group_size=64, bits=4)
        model.set_dtype(mx.bfloat16)
        prepare(model)  # routes and joins the quantized layers
    layer = model.model.layers[0]
    groups = [
        [layer.self_attn.q_proj, layer.self_attn.k_proj, layer.self_attn.v_proj],
        [layer.mlp.gate_proj, layer.mlp.up_proj],
    ]
    x = mx.random.normal((5, layer.self_attn.q_proj["weight"].shape[1] * (8 if quantized else 1))).astype(mx.bfloat16)
    for group in groups:
        joint = row_invariant.siblings_of(group[0])
        assert joint is not None and all(row_invariant.siblings_of(sibling) is joint for sibling in group)
        with row_invariant.exact_forward():
            joined = [sibling(x) for sibling in group]
        alone = [
            row_invariant.row_quantized_matmul(x, sibling) if quantized else row_invariant.row_matmul(x, sibling.weight)
            for sibling in group
        ]
        for a, b in zip(joined, alone, strict=True):
            assert mx.array_equal(a, b).item()


@gpu_only
def test_pool_attention_gives_each_query_its_rows_own_bits() -> None:
    """One call over ragged rows in a pool (widths 1 to 5, keys 3 to 700, slots scattered over a
    pool larger than they need, some queries in a window) gives every query what its row's own
    call over the same keys gives it."""
    mx.random.seed(3)
    widths = [1, 5, 3, 1, 2, 1, 4, 1, 1, 5, 1, 1, 2, 3, 1, 1, 1, 2, 5]
    lengths = [3 + (97 * r) % 700 for r in range(len(widths))]
    slots = [1 + (7 * r) % 37 for r in range(len(widths))]  # distinct slots of a pool of 40
    keys = mx.random.normal((40, 2, 1024, 128)).astype(mx.bfloat16)
    values = mx.random.normal((40, 2, 1024, 128)).astype(mx.bfloat16)
    queries = mx.random.normal((sum(widths), 4, 1, 128)).astype(mx.bfloat16)
    token_slots, first, visible, expected = [], [], [], []
    start = 0
    for r, (w, n, slot) in enumerate(zip(widths, lengths, slots, strict=True)):
        window = 50 if r % 4 == 3 else None
        for i in range(w):
            seen = n + i + 1
            lo = 0 if window is None else max(0, seen - window)
            token_slots.append(slot), first.append(lo), visible.append(seen)
            one = row_invariant.row_attention(
                queries[start + i : start + i + 1].transpose(2, 1, 0, 3),
                keys[slot : slot + 1, :, lo:seen], values[slot : slot + 1, :, lo:seen], 0.088,
            )  # fmt: skip
            expected.append(one.transpose(2, 1, 0, 3))
        start += w
    got = row_invariant.pool_attention(
        queries, keys, values, *(mx.array(a, dtype=mx.int32) for a in (token_slots, first, visible)), 0.088
    )
    assert mx.array_equal(got, mx.concatenate(expected)).item()


@gpu_only
def test_row_attention_of_a_query_depends_only_on_the_keys_it_sees() -> None:
    mx.random.seed(1)
    q = mx.random.normal((1, 4, 16, 64)).astype(mx.bfloat16)
    k = mx.random.normal((1, 2, 700, 64)).astype(mx.bfloat16)
    v = mx.random.normal((1, 2, 700, 64)).astype(mx.bfloat16)
    wide = row_invariant.row_attention(q, k[:, :, :600], v[:, :, :600], 0.125)
    for i in range(16):
        visible = 600 - 16 + i + 1
        one = row_invariant.row_attention(q[:, :, i : i + 1], k[:, :, :visible], v[:, :, :visible], 0.125)
        assert mx.array_equal(wide[:, :, i : i + 1], one).item(), i
    reference = mx.fast.scaled_dot_product_attention(q, k[:, :, :600], v[:, :, :600], scale=0.125, mask="causal")
    assert mx.allclose(wide.astype(mx.float32), reference.astype(mx.float32), atol=2e-2).item()


@gpu_only
def test_every_verify_width_is_exact_on_the_gpu() -> None:
    """The block loops' probe: a width-w forward against w single steps, bit for bit."""
    model = load_model(EMBEDDED_TARGET).model
    for width in range(2, 17):
        assert probe_width(model, width).exact, width


@gpu_only
def test_greedy_speculation_is_byte_identical_to_target_only_on_the_gpu() -> None:
    target = load_model(EMBEDDED_TARGET)
    drafter = load_model(EMBEDDED_DRAFTER, role="drafter")
    builders = {
        "target-only": LoopBuilder(target, None, LoopPlan()),
        "classic k=4": LoopBuilder(target, drafter, LoopPlan(drafter_kind="draft-model", num_draft_tokens=4)),
        "prompt lookup": LoopBuilder(target, None, LoopPlan(drafter_kind="prompt-lookup", num_draft_tokens=7)),
    }
    for kind in ("mtp", "dflash"):
        settings = Settings(drafter=DrafterSettings(kind=kind, model=str(REPO_ROOT / "models" / kind)))
        builders[kind] = LoopBuilder(target, None, plan_from_settings(settings))
    for prompt in PROMPTS:
        outputs = {}
        for name, builder in builders.items():
            request = RowRequest(prompt, SamplingParams(temperature=0.0), max_tokens=64, seed=0, ignore_eos=True)
            generation = builder.build(request)
            generation.prefill()
            while not generation.finished:
                generation.step()
            outputs[name] = generation.emitted
            if name in ("mtp", "dflash"):  # the probe let the block loop speculate
                assert generation.stats.ran, name
        assert all(tokens == outputs["target-only"] for tokens in outputs.values()), outputs
