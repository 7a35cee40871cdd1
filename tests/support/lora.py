"""A small LoRA adapter for the embedded target, made with mlx-lm's own LoRA tooling."""

from __future__ import annotations

import json
import math
import struct
from pathlib import Path

import mlx.core as mx
from mlx.utils import tree_flatten
from mlx_lm.tuner.lora import LoRALinear
from mlx_lm.tuner.utils import linear_to_lora_layers
from mlx_lm.utils import load as mlx_lm_load

from app.loading.paths import EMBEDDED_TARGET

RANK = 4
SCALE = 20.0  # mlx_lm.lora's default scale


def build_adapter(out: Path, num_layers: int = 6, seed: int = 0, target: Path = EMBEDDED_TARGET) -> Path:
    """An adapter over the last `num_layers` blocks' linear layers, saved as mlx_lm.lora saves one
    (`adapters.safetensors` of the trainable parameters, `adapter_config.json`). Its lora_b are
    small seeded random values rather than trained ones (mlx-lm starts them at zero, which would
    change nothing), large enough to change the target's greedy answers."""
    model, _ = mlx_lm_load(str(target))
    model.freeze()
    parameters = {"rank": RANK, "scale": SCALE, "dropout": 0.0}
    # seeded before the LoRA layers are made: their lora_a are drawn there, and from whatever the
    # process's random state was (the worker's earlier tests), an adapter that left one prompt's
    # greedy answer unchanged now and then made the test that checks it does change it flaky
    mx.random.seed(seed)
    linear_to_lora_layers(model, num_layers, parameters)
    for _, module in model.named_modules():
        if isinstance(module, LoRALinear):
            module.lora_b = 0.02 * mx.random.normal(module.lora_b.shape)
    out.mkdir(parents=True, exist_ok=True)
    mx.save_safetensors(str(out / "adapters.safetensors"), dict(tree_flatten(model.trainable_parameters())))
    config = {"fine_tune_type": "lora", "num_layers": num_layers, "lora_parameters": parameters}
    (out / "adapter_config.json").write_text(json.dumps(config, indent=2))
    return out


def mlx_lm_fused(adapter: Path, target: Path = EMBEDDED_TARGET):
    """mlx-lm's own model with the adapter fused, as `mlx_lm.fuse` makes it (its `load` with
    `adapter_path`, then each LoRA layer's `fuse()`), in the dtype this device computes in."""
    from mlx.utils import tree_unflatten

    from app.execution.device import compute_dtype
    from app.loading import read_checkpoint

    model, tokenizer = mlx_lm_load(str(target), adapter_path=str(adapter))
    fused = [(name, module.fuse()) for name, module in model.named_modules() if hasattr(module, "fuse")]
    model.update_modules(tree_unflatten(fused))
    dtype = compute_dtype(model, read_checkpoint(target).config, "auto")
    if dtype is not None:
        model.set_dtype(dtype)
    return model, tokenizer


def greedy_tokens(model, tokenizer, prompt: list[int], max_tokens: int) -> list[int]:
    """mlx-lm's own greedy decoding (`stream_generate`, argmax), up to EOS or `max_tokens`."""
    from mlx_lm.generate import stream_generate

    return [r.token for r in stream_generate(model, tokenizer, prompt, max_tokens=max_tokens)][:max_tokens]


def write_adapter(root: Path, tensors: dict[str, list[int]], config: dict | None = None) -> Path:
    """An adapter directory in mlx-lm's layout; its safetensors header written by hand (zero tensors)."""
    root.mkdir(parents=True)
    header, offset = {}, 0
    for name, shape in tensors.items():
        size = 4 * math.prod(shape)
        header[name] = {"dtype": "F32", "shape": shape, "data_offsets": [offset, offset + size]}
        offset += size
    raw = json.dumps(header).encode()
    raw += b" " * (-len(raw) % 8)
    (root / "adapters.safetensors").write_bytes(struct.pack("<Q", len(raw)) + raw + bytes(offset))
    lora = {"rank": RANK, "scale": SCALE, "dropout": 0.0}
    (root / "adapter_config.json").write_text(json.dumps(config or {"num_layers": 1, "lora_parameters": lora}))
    return root
