"""Reading the MLXCEL_* switches."""

from __future__ import annotations

TRUTHY = {"1", "true", "yes", "on"}


def truthy(value: str | None) -> bool:
    """The contract's spellings of "on": 1, true, yes, on (any case)."""
    return value is not None and value.strip().lower() in TRUTHY
