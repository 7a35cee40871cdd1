"""Point MLX's CPU matrix products at OpenBLAS, before `mlx.core` is first imported.

The Linux `mlx-cpu` wheel links the netlib reference BLAS, which makes a k-token verify forward
cost about k single-token steps and so defeats speculative decoding. `sgemm_rows.c` (built once by
`build()`, which the Makefile runs) computes products of up to `row_stable_rows()` rows with its
own register-blocked kernel, which gives each row the same bits whatever the row count (what makes
verify forwards and batched forwards exact), and forwards longer ones to OpenBLAS.
Set `MLXCEL_BLAS=reference` to keep the bundled BLAS.
"""

from __future__ import annotations

import ctypes
import importlib.metadata
import os
import platform
import shutil
import subprocess
import sys
from pathlib import Path

SHIM = Path(__file__).with_name("libmlxcel_sgemm.so")
SOURCE = Path(__file__).with_name("sgemm_rows.c")

_shim: ctypes.CDLL | None = None


def preload() -> str:
    """Load the shim globally so MLX binds to it; return the BLAS MLX will use."""
    if cuda_build():
        return "not used (MLX CUDA build: products run on the GPU)"
    if os.environ.get("MLXCEL_BLAS", "openblas") == "reference" or not SHIM.exists():
        return "reference"
    if "mlx.core" in sys.modules:
        return "reference (mlx.core was imported before app)"
    # One thread measured fastest for decode-sized products on 2 cores; operators may override.
    os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
    global _shim
    _shim = ctypes.CDLL(str(SHIM), mode=ctypes.RTLD_GLOBAL)
    return "openblas"


def cuda_build() -> bool:
    """MLX's CUDA build is installed (the `cuda` extra): models compute on the GPU, where the
    shim has no part (app/execution/row_invariant.py keeps wide forwards exact there)."""
    try:
        importlib.metadata.distribution("mlx-cuda-13")
    except importlib.metadata.PackageNotFoundError:
        return False
    return True


def row_stable_rows() -> int:
    """Up to how many rows a CPU matrix product gives each row the same bits whatever the row
    count (the shim's own kernel: 1024, as many tokens as a tick forwards by default); 0 where
    MLX does not run on the shim."""
    limit = getattr(_shim, "mlxcel_row_stable_max", None)
    return int(limit()) if limit is not None else 0


def time_products(on: bool) -> bool:
    """Start (or stop) adding up the seconds MLX's CPU products spend in the shim's kernel, from
    zero; False where MLX does not run on the shim."""
    switch = getattr(_shim, "mlxcel_time_products", None)
    if switch is None:
        return False
    switch(int(on))
    return True


def product_seconds() -> float:
    """The seconds added up since `time_products(True)` (0.0 without the shim)."""
    read = getattr(_shim, "mlxcel_product_seconds", None)
    if read is None:
        return 0.0
    read.restype = ctypes.c_double
    return float(read())


def build() -> Path | None:
    """Compile the shim against the scipy-openblas32 wheel; None where it does not apply."""
    if sys.platform != "linux" or platform.machine() != "x86_64":
        return None
    compiler = shutil.which(os.environ.get("CC", "cc")) or shutil.which("gcc")
    try:
        import scipy_openblas32
    except ImportError:
        return None
    if compiler is None:
        print("no C compiler found: MLX keeps its reference BLAS (slow verify forwards)", file=sys.stderr)
        return None
    lib_dir = scipy_openblas32.get_lib_dir()
    command = [
        compiler,
        "-O3",
        "-march=native",
        "-ffp-contract=fast",  # the kernel's vector multiply-adds are fused (sgemm_rows.c)
        "-shared",
        "-fPIC",
        str(SOURCE),
        "-o",
        str(SHIM),
        f"-L{lib_dir}",
        "-lscipy_openblas",
        f"-Wl,-rpath,{lib_dir}",
    ]
    subprocess.run(command, check=True)
    return SHIM
