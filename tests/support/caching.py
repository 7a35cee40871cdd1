"""What the prompt cache restores on this machine's device (its servers' device too)."""

from __future__ import annotations

from app.execution.prompt_cache import exact_grain

GRAIN = exact_grain()  # one token on the CPU, a prefill chunk on a GPU


def restored(shared: int, length: int) -> int:
    """The tokens a prompt of `length` that shares `shared` with a cached one restores (its last
    token is always prefilled)."""
    return min(shared, length - 1) // GRAIN * GRAIN
