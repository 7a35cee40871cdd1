"""What the device decides, asked in one place."""

from __future__ import annotations

import mlx.core as mx

import app
from app.execution.device import backend, compute_dtype
from app.runtime.blas import row_stable_rows


def test_the_cpu_backend_batches_on_the_shim_and_upcasts_small_checkpoints(embedded_target) -> None:
    """On the CPU: row-stable products where the shim is loaded, none of the CUDA kernels, float32
    for a small checkpoint, a quantized one's scales and biases, and the project's own modules; a
    requested dtype always wins."""
    chosen = backend()
    assert chosen.name == "cpu" and not chosen.gpu and not chosen.row_invariant_kernels
    assert chosen.row_stable_rows == row_stable_rows()
    assert (chosen.row_stable_rows > 0) == (app.BLAS == "openblas")  # the shim's kernel, where it runs
    assert chosen.module_dtype == mx.float32
    model, config = embedded_target.model, embedded_target.config
    assert compute_dtype(model, config, "auto") == mx.float32
    assert compute_dtype(model, config, "bfloat16") == mx.bfloat16
    assert compute_dtype(model, config | {"quantization": {"bits": 4}}, "auto") == mx.float32  # scales and biases
