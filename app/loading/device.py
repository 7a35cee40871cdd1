"""What the device MLX computes on decides, in one place: whether this is the GPU."""

from __future__ import annotations

import mlx.core as mx


def on_gpu() -> bool:
    """MLX computes on a GPU (CUDA or Metal): half precision stays, the row-invariant kernels apply."""
    return mx.default_device().type == mx.DeviceType.gpu
