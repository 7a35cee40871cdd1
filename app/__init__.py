"""mlxcel: speculative decoding on MLX with explicit acceptance rules."""

import os

from app.runtime.blas import preload

# Must run before anything imports mlx.core (see app/runtime/blas.py).
BLAS = preload()
# Models are local directories only; never reach for the Hugging Face hub.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

__version__ = "0.1.0"
