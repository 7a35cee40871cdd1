"""llama-server's LoRA adapter scales (`GET`/`POST /lora-adapters`, a request's `lora` field) over
the one adapter a profile fuses into the target at load (`target.adapter_path`).

llama-server reads `[{"id": 0, "scale": 0.5}]` in both places: each adapter named takes its scale,
each one left out takes 0. Here the adapter is part of the target's weights (app/execution/model.py),
so the scales asked for are honoured where they are the loaded ones and refused otherwise: a
different scale would be another model, and serving the fused one instead would be a wrong answer.
"""

from __future__ import annotations

from typing import Any

import msgspec

from app.profiles.schema import Settings
from app.server.core.shaping import shown_path

FUSED = "the adapter is fused into the target's weights at load (target.adapter_path), so its scale is fixed"


class LoraAdapter(msgspec.Struct, kw_only=True):
    """One loaded adapter, as llama-server's `GET /lora-adapters` lists it."""

    id: int
    path: str  # its last part unless server.props_show_paths, as /props shows paths
    scale: float
    task_name: str = ""
    prompt_prefix: str = ""


class LoraApplied(msgspec.Struct, kw_only=True):
    success: bool = True


def loaded(settings: Settings) -> tuple[float, ...]:
    """Each loaded adapter's scale, by id: the profile's one adapter, or none."""
    target = settings.target
    return (target.adapter_scale,) if target.adapter_path is not None else ()


def listing(settings: Settings) -> list[LoraAdapter]:
    path = settings.target.adapter_path
    return [LoraAdapter(id=0, path=shown_path(settings, path), scale=settings.target.adapter_scale)] if path else []


def asked(value: Any, count: int) -> tuple[float, ...]:
    """The scales `[{"id", "scale"}, ...]` asks for, by id, as llama-server reads them (an adapter
    left out: 0; an id named twice: the last); ValueError for anything else."""
    if not isinstance(value, list):
        raise ValueError("must be an array of objects with 'id' and 'scale' fields")
    scales = [0.0] * count
    for entry in value:
        if not isinstance(entry, dict):
            raise ValueError("must be an array of objects with 'id' and 'scale' fields")
        index, scale = entry.get("id", -1), entry.get("scale", 0.0)
        if not _number(scale):
            raise ValueError(f"the scale of adapter {index} is not a number")
        if not isinstance(index, int) or isinstance(index, bool) or not 0 <= index < count:
            held = "only adapter 0 is loaded (GET /lora-adapters)" if count else "no adapter is loaded"
            raise ValueError(f"invalid adapter id {index!r}: {held}")
        scales[index] = float(scale)
    return tuple(scales)


def problem(value: Any, settings: Settings) -> str | None:
    """Why the scales `value` asks for cannot be served, or None where they are the loaded ones."""
    have = loaded(settings)
    try:
        want = asked(value, len(have))
    except ValueError as exc:
        return str(exc)
    if want == have:
        return None
    keep = ", ".join(f'{{"id": {i}, "scale": {scale:g}}}' for i, scale in enumerate(have))
    return f"{FUSED} at {have[0]:g}; asked {want[0]:g} (an adapter the list leaves out is asked 0): send [{keep}]"


def _number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)
