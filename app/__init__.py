"""mlxcel: speculative decoding on MLX with explicit acceptance rules."""

import os
import sys

from app import early_stop

# `mlxcel serve` (`python -m app serve` too: sys.argv[1] is the command while the package loads)
# stops at once on SIGTERM/SIGINT from here, before any heavy import (app/early_stop.py).
early_stop.install(sys.argv)

from app.runtime.blas import preload  # noqa: E402  (after the stop handler)

# Must run before anything imports mlx.core (see app/runtime/blas.py).
BLAS = preload()
# Models are local directories only; never reach for the Hugging Face hub.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

__version__ = "0.1.0"
