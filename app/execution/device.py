"""What the device decides, in one place: `backend()` (where forwards compute and which kernels
keep them exact) and `compute_dtype()` (what a checkpoint computes in).

- CPU: the BLAS shim's matrix kernel gives every output row the same bits up to
  `row_stable_rows()` rows (app/runtime/sgemm_rows.c), which is what lets many rows' tokens share
  one forward (app/execution/forward.py); small checkpoints are upcast to float32, which the CPU
  computes faster than half precision, and so are a quantized checkpoint's scales and biases
  (its packed weights stay as they are).
- CUDA: the row-invariant kernels (`mx.fast.cuda_kernel`, app/execution/row_invariant.py) keep a
  width-w forward equal to w single steps, and their product takes any row count up to
  CUDA_ROW_INVARIANT_ROWS (in slices of the kernel's own rows), so many rows share one forward
  there too; checkpoints keep their half precision.
- Metal: neither; forwards keep MLX's kernels and the block loops' exactness probe decides per width.

Whether MLX's CUDA wheel is installed at all is decided before MLX is imported
(`app.runtime.blas.cuda_build`, which chooses the BLAS); this module asks the imported MLX.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

import mlx.core as mx
import mlx.nn as nn
from mlx.utils import tree_flatten

from app.runtime.blas import row_stable_rows
from app.runtime.memory import release_free_memory

# On the CPU backend half-precision products are slower than float32; small models are upcast.
UPCAST_LIMIT_PARAMS = 1_000_000_000
# Rows the CUDA row-invariant product takes: the default server.max_batch_tokens, as the CPU shim.
CUDA_ROW_INVARIANT_ROWS = 1024
# MLX's CPU buffer cache: 32 MiB by default. A tick's attention copies each of its rows' slots of
# the KV pool (app/execution/attention.py, a few MiB per layer); past the cache those buffers are
# unmapped when freed and faulted in again on the next allocation: 1 ms per copy measured on the
# embedded target at 16 rows, 0.1 ms with the buffers kept. A tick copies at most its pools, so
# the cache grows with them, up to a ceiling: a flat 1 GiB for every process made a few idle
# servers of a 30 MB model hold gigabytes between them.
CPU_BUFFER_CACHE_FLOOR = 32 << 20
CPU_BUFFER_CACHE_CEILING = 1 << 30


@dataclass(frozen=True)
class Backend:
    name: Literal["cpu", "cuda", "metal"]
    row_stable_rows: int  # up to how many rows products give each row the same bits (0: not at all)

    @property
    def gpu(self) -> bool:
        return self.name != "cpu"

    @property
    def row_invariant_kernels(self) -> bool:
        """The project's CUDA kernels exist (`mx.fast.cuda_kernel` runs on NVIDIA GPUs only)."""
        return self.name == "cuda"

    @property
    def module_dtype(self) -> mx.Dtype:
        """What the project's own modules (the block drafters) compute in."""
        return mx.bfloat16 if self.gpu else mx.float32


def backend() -> Backend:
    """The device MLX computes on now, and what follows from it."""
    if mx.default_device().type == mx.DeviceType.gpu:  # MLX's GPU backends: Metal or CUDA
        return Backend("metal", 0) if mx.metal.is_available() else Backend("cuda", CUDA_ROW_INVARIANT_ROWS)
    return Backend("cpu", row_stable_rows())


def release_buffers() -> None:
    """Hand what MLX's buffer cache and malloc's arenas keep back to the system: after a reload's
    old engine is freed, its weights and KV pool would otherwise stay in the cache for good."""
    mx.clear_cache()
    release_free_memory()


def keep_buffers(pool_bytes: int) -> None:
    """Let MLX's CPU buffer cache keep what a tick copies out of `pool_bytes` of KV pool (never
    lowering what a larger pool of the process asked for; the GPU's default is its memory)."""
    if not backend().gpu:
        wanted = min(CPU_BUFFER_CACHE_CEILING, CPU_BUFFER_CACHE_FLOOR + pool_bytes)
        previous = mx.set_cache_limit(wanted)
        if previous > wanted:
            mx.set_cache_limit(previous)


def compute_dtype(model: nn.Module, config: dict[str, Any], requested: str) -> mx.Dtype | None:
    """The dtype a loaded checkpoint computes in; None keeps its own."""
    if requested != "auto":
        return getattr(mx, requested)
    if backend().gpu:
        return None
    if "quantization" in config:  # only the scales, biases and norms widen; the packed weights stay
        return mx.float32  # MLX's CPU quantized product is ~14x slower on bf16 rows than on float32
    n_params = sum(v.size for _, v in tree_flatten(model.parameters()))
    return mx.float32 if n_params <= UPCAST_LIMIT_PARAMS else None
