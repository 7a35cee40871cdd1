"""LoRA adapters in mlx-lm's format, checked from their files before anything loads.

An adapter is a directory holding `adapter_config.json` (`fine_tune_type`: lora, dora or full;
`num_layers`; `lora_parameters` with `rank` and `scale`) and `adapters.safetensors`, as
`mlx_lm.lora` writes one and `mlx_lm.utils.load_adapters` reads it. Pure Python: the tensors'
shapes come from the safetensors headers, so a profile naming an adapter that cannot fit its
target fails at startup, naming where it was set, before MLX loads (app/profiles/checks.py).
The adapter itself is applied and fused into the target by app/execution/model.py.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from app.loading.checkpoint import Checkpoint, ModelLoadError
from app.loading.model_facts import safetensors_header

CONFIG_FILE = "adapter_config.json"
WEIGHTS_FILE = "adapters.safetensors"
FINE_TUNE_TYPES = ("lora", "dora", "full")
LAYOUT = f"an mlx-lm adapter directory ({CONFIG_FILE} and {WEIGHTS_FILE}, as mlx_lm.lora saves them)"


class AdapterError(ModelLoadError):
    """An adapter that cannot be applied to its target (exit 2, as any model that cannot load)."""


@dataclass(frozen=True)
class Adapter:
    """What an adapter directory says of itself."""

    path: Path
    fine_tune_type: str  # lora, dora or full (full: its weights replace the target's)
    tensors: dict[str, list[int]]  # adapter parameter name -> shape


def layout_problem(path: str | Path) -> str | None:
    """Why `path` is not an mlx-lm adapter directory (a GGUF LoRA file among them), or None."""
    found = Path(path).expanduser()
    if found.suffix == ".gguf" and not found.is_dir():
        return f"{found} is a GGUF LoRA, which only llama.cpp applies; give {LAYOUT}"
    if not found.exists():
        return f"adapter path does not exist: {found}; point it at {LAYOUT}"
    if not found.is_dir():
        return f"{found} is a file, not {LAYOUT}"
    missing = [name for name in (CONFIG_FILE, WEIGHTS_FILE) if not (found / name).is_file()]
    if missing:
        return f"{found} has no {' or '.join(missing)}: not {LAYOUT}"
    return None


def read_adapter(path: str | Path) -> Adapter:
    """The adapter at `path` (AdapterError naming the problem)."""
    problem = layout_problem(path)
    if problem is not None:
        raise AdapterError(problem)
    root = Path(path).expanduser()
    try:
        config = json.loads((root / CONFIG_FILE).read_text(encoding="utf-8"))
        header = safetensors_header(root / WEIGHTS_FILE)
    except (OSError, ValueError) as exc:  # JSONDecodeError and UnicodeDecodeError are ValueErrors
        raise AdapterError(f"{root}: cannot read the adapter: {exc}") from exc
    if not isinstance(config, dict):
        raise AdapterError(f"{root / CONFIG_FILE}: not a JSON object")
    kind = config.get("fine_tune_type", "lora")
    if kind not in FINE_TUNE_TYPES:
        raise AdapterError(f"{root / CONFIG_FILE}: fine_tune_type {kind!r} is none of {', '.join(FINE_TUNE_TYPES)}")
    if kind != "full":
        parameters = config.get("lora_parameters")
        if not isinstance(config.get("num_layers"), int) or not isinstance(parameters, dict):
            raise AdapterError(f"{root / CONFIG_FILE}: needs num_layers and lora_parameters (mlx-lm's LoRA config)")
        absent = [key for key in ("rank", "scale") if not _number(parameters.get(key))]
        if absent:
            raise AdapterError(f"{root / CONFIG_FILE}: lora_parameters has no {' or '.join(absent)}")
    tensors = {name: list(info["shape"]) for name, info in header.items() if name != "__metadata__"}
    return Adapter(path=root, fine_tune_type=kind, tensors=tensors)


def fit_problem(adapter: Adapter, target: Checkpoint) -> str | None:
    """Why the adapter's LoRA matrices cannot fit the target's linear layers, or None.

    Read from the weights' headers: a `NAME.lora_a` is `[in, rank]` and `NAME.lora_b` `[rank, out]`
    for the target's `NAME.weight` of `[out, in]` (its `in` packed into 32-bit words when quantized).
    Layers the headers do not show as plain or quantized linear ones (embeddings, expert stacks,
    names the architecture renames on load) are left to mlx-lm's own check when the adapter loads.
    """
    weights: dict[str, list[int]] = {}
    for file in sorted(target.path.glob("*.safetensors")):
        weights |= {name: info["shape"] for name, info in safetensors_header(file).items() if name != "__metadata__"}
    for name, shape in sorted(adapter.tensors.items()):
        base, _, leaf = name.rpartition(".")
        weight = weights.get(f"{base}.weight")
        if leaf not in ("lora_a", "lora_b") or weight is None or len(weight) != 2 or "embed" in base:
            continue
        out_dim, in_dim = weight
        if f"{base}.scales" in weights:
            in_dim = in_dim * 32 // _bits(target.config, base)
        want, axis = (in_dim, 0) if leaf == "lora_a" else (out_dim, 1)
        if len(shape) != 2 or shape[axis] != want:
            return (
                f"{name}: shape {tuple(shape)} does not fit the target's {base} ({in_dim} in, {out_dim} out: "
                f"lora_a is [in, rank], lora_b [rank, out]); this adapter was trained for another model"
            )
    return None


def _bits(config: dict[str, Any], layer: str) -> int:
    quantization = config.get("quantization") or config.get("quantization_config") or {}
    own = quantization.get(layer)
    return int((own if isinstance(own, dict) else quantization).get("bits", 4))


def _number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)
