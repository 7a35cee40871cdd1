"""Loading mlx-lm model directories onto the device: the embedded pair or a user's Llama/Qwen/Gemma
checkpoint, in the dtype and with the kernels `device.py` decides, with its LoRA adapter fused in."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import mlx.core as mx
import mlx.nn as nn
from mlx.utils import tree_unflatten
from mlx_lm.tokenizer_utils import TokenizerWrapper
from mlx_lm.utils import load as mlx_lm_load
from mlx_lm.utils import load_adapters

from app.execution.device import compute_dtype
from app.execution.prepare import prepare
from app.loading.adapter import AdapterError
from app.loading.checkpoint import Checkpoint, ModelLoadError, read_checkpoint, require_standalone


@dataclass
class LoadedModel:
    checkpoint: Checkpoint
    model: nn.Module
    tokenizer: TokenizerWrapper

    @property
    def path(self) -> Path:
        return self.checkpoint.path

    @property
    def config(self) -> dict[str, Any]:
        return self.checkpoint.config

    @property
    def vocab_size(self) -> int:
        """Rows of the output layer (may exceed the tokenizer's size by padding)."""
        return int(self.config.get("vocab_size") or self.config.get("text_config", {}).get("vocab_size"))


def load_model(
    path: str | Path,
    *,
    role: str = "target",
    dtype: str = "auto",
    shard_group: mx.distributed.Group | None = None,
    exact: bool = True,
    adapter: str | Path | None = None,
    adapter_scale: float = 1.0,
) -> LoadedModel:
    """Load a standalone mlx-lm model directory, refusing anything else with ModelLoadError, fuse
    its LoRA `adapter` into it (`fuse_adapter`), and prepare it (app/execution/prepare.py: `exact`
    picks the row-invariant kernels or MLX's own).

    With `shard_group`, only this rank's shard is kept: mlx-lm's own `shard()` splits attention
    heads and the MLP over the group, and its sharded products meet in all_sum collectives."""
    checkpoint = read_checkpoint(path)
    require_standalone(checkpoint, role)
    try:
        model, tokenizer = mlx_lm_load(str(checkpoint.path), lazy=shard_group is not None)
    except (ValueError, TypeError, KeyError, AttributeError, FileNotFoundError, RuntimeError) as exc:
        # What a broken directory raises from mlx-lm, transformers or MLX: a config.json value of
        # the wrong type, a malformed tokenizer.json, truncated weights; a restart fixes none of
        # them (exit 2). Other OSErrors (EIO on a network mount) may pass, so they stay exit 1.
        raise ModelLoadError(f"cannot load {checkpoint.path} as an mlx-lm model: {type(exc).__name__}: {exc}") from exc
    if adapter is not None:
        fuse_adapter(model, Path(adapter), adapter_scale, checkpoint.path)
    target_dtype = compute_dtype(model, checkpoint.config, dtype)  # the whole model's size decides, sharded or not
    if shard_group is not None:
        if not hasattr(model, "shard"):
            raise ModelLoadError(
                f"{checkpoint.path}: mlx-lm's {checkpoint.config.get('model_type')} model has no shard(), so it "
                'cannot run tensor parallel; set target.parallel = "none"'
            )
        model.shard(shard_group)
    if target_dtype is not None:
        model.set_dtype(target_dtype)
    if target_dtype is not None or shard_group is not None or adapter is not None:
        mx.eval(model.parameters())
    prepare(model, exact=exact, sharded=shard_group is not None)
    return LoadedModel(checkpoint=checkpoint, model=model, tokenizer=tokenizer)


def fuse_adapter(model: nn.Module, adapter: Path, scale: float, target: Path) -> None:
    """mlx-lm's own adapter loading (`load_adapters`: its LoRA, DoRA or full fine-tune layers and
    weights, checked against the model), then each LoRA layer fused into the plain layer it wraps,
    as `mlx_lm.fuse` fuses it. The served model is then plain `Linear` (or quantized) layers, so
    every kernel and guard of `prepare` applies unchanged, and it is the model mlx_lm.fuse would
    save. `scale` (llama-server's --lora-scaled) multiplies each layer's own `scale` before fusing:
    the model an adapter_config.json with that product for its scale would give."""
    try:
        load_adapters(model, str(adapter))
    except (ValueError, TypeError, KeyError, FileNotFoundError, RuntimeError) as exc:  # as a broken model, above
        said = " ".join(str(exc).split())  # mlx-lm lists the tensors one a line: one line here
        raise AdapterError(f"cannot apply the adapter {adapter} to {target}: {type(exc).__name__}: {said}") from exc
    model.eval()
    fused = []
    for name, module in model.named_modules():
        if hasattr(module, "fuse"):
            if scale != 1.0:
                module.scale = module.scale * scale
            fused.append((name, module.fuse()))
    if fused:
        model.update_modules(tree_unflatten(fused))
