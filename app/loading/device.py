"""What the device MLX computes on decides, in one place."""

from __future__ import annotations

import mlx.core as mx


def on_gpu() -> bool:
    """MLX computes on a GPU (CUDA or Metal): checkpoints keep their half precision."""
    return mx.default_device().type == mx.DeviceType.gpu


def on_cuda() -> bool:
    """MLX computes on an NVIDIA GPU, where the row-invariant kernels (`mx.fast.cuda_kernel`) run.
    On Metal they do not exist: forwards keep MLX's kernels and the probe decides per width."""
    return on_gpu() and not mx.metal.is_available()  # MLX's GPU backends are Metal and CUDA
