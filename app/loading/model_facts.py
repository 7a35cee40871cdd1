"""What a model directory is, as model listings describe one (Ollama's `/api/tags`, `/api/show`):
its size on disk, a digest, its architecture, its parameter count and how its weights are stored.
Read from config.json and the safetensors headers (never the tensors), once per directory."""

from __future__ import annotations

import functools
import hashlib
import json
import math
import struct
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

HEADER_LIMIT = 100 << 20  # a safetensors header larger than this is not read (a damaged file)
# How a safetensors dtype spells the element types Ollama's listings name
DTYPES = {"F16": "F16", "BF16": "BF16", "F32": "F32"}


@dataclass(frozen=True)
class ModelFacts:
    size: int  # bytes of its weight files
    digest: str  # sha256 of its config.json: the same directory answers the same digest
    modified_at: str  # its config.json's time, ISO 8601
    architecture: str  # config.json's model_type
    parameters: int  # parameter count (a quantized weight counted as the values it packs)
    quantization: str  # "Q4", "Q8" (mlx-lm's affine bits) or the weights' float type ("BF16")
    hidden_size: int | None
    layers: int | None


@functools.lru_cache(maxsize=4)
def model_facts(path: str) -> ModelFacts:
    """`path`'s facts (OSError, ValueError for a directory that is not a model's)."""
    root = Path(path)
    config_file = root / "config.json"
    raw = config_file.read_bytes()
    config = json.loads(raw)
    weights = sorted(root.glob("*.safetensors"))
    quantization = config.get("quantization") or config.get("quantization_config") or {}
    bits = quantization.get("bits") if isinstance(quantization, dict) else None
    parameters, float_type = 0, ""
    for weight in weights:
        for name, tensor in safetensors_header(weight).items():
            if name == "__metadata__" or name.endswith((".scales", ".biases")):
                continue
            count = math.prod(tensor["shape"])
            packed = tensor["dtype"] == "U32" and isinstance(bits, int) and bits > 0
            parameters += count * 32 // bits if packed else count
            float_type = float_type or DTYPES.get(tensor["dtype"], "")
    text = config.get("text_config") if isinstance(config.get("text_config"), dict) else config
    modified = datetime.fromtimestamp(config_file.stat().st_mtime, UTC)
    return ModelFacts(
        size=sum(weight.stat().st_size for weight in weights),
        digest=hashlib.sha256(raw).hexdigest(),
        modified_at=modified.isoformat().replace("+00:00", "Z"),
        architecture=str(config.get("model_type", "")),
        parameters=parameters,
        quantization=f"Q{bits}" if isinstance(bits, int) else float_type,
        hidden_size=text.get("hidden_size"),
        layers=text.get("num_hidden_layers"),
    )


def safetensors_header(path: Path) -> dict:
    """The JSON header of a safetensors file: each tensor's dtype and shape (the tensors are not read)."""
    with path.open("rb") as weights:
        (length,) = struct.unpack("<Q", weights.read(8))
        if length > HEADER_LIMIT:
            raise ValueError(f"{path}: a safetensors header of {length} bytes")
        return json.loads(weights.read(length))


def parameter_size(parameters: int) -> str:
    """As Ollama writes it: 494.03M, 7.6B."""
    if parameters >= 10**9:
        return f"{parameters / 10**9:.1f}B"
    return f"{parameters / 10**6:.2f}M"
