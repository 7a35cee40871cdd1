"""Reading the MLXCEL_* switches."""

from __future__ import annotations

import os

TRUTHY = {"1", "true", "yes", "on"}


def truthy(value: str | None) -> bool:
    """The contract's spellings of "on": 1, true, yes, on (any case)."""
    return value is not None and value.strip().lower() in TRUTHY


def switch(name: str) -> bool | None:
    """An on/off switch's setting: None where it is unset or empty (the default applies), else
    whether it is on."""
    value = os.environ.get(name, "").strip()
    return truthy(value) if value else None
