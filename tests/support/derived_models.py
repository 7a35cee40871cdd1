"""Model directories derived from a tiny one by editing its weights (for regimes tests pin down)."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path

import mlx.core as mx

Weights = dict[str, mx.array]


def derive_model(src: Path, dst: Path, edit: Callable[[Weights], Weights]) -> Path:
    shutil.copytree(src, dst)
    weights = mx.load(str(src / "model.safetensors"))
    mx.save_safetensors(str(dst / "model.safetensors"), edit(dict(weights)), metadata={"format": "mlx"})
    return dst


def with_context(src: Path, dst: Path, positions: int) -> Path:
    """The model at `src` with its context (`max_position_embeddings`, the server's n_ctx) set to
    `positions`; its other files linked, not copied."""
    dst.mkdir(parents=True)
    for item in src.iterdir():
        if item.name != "config.json":
            (dst / item.name).symlink_to(item.resolve())
    config = json.loads((src / "config.json").read_text()) | {"max_position_embeddings": positions}
    (dst / "config.json").write_text(json.dumps(config))
    return dst


def anti_drafter(src: Path, dst: Path) -> Path:
    """Same model with its logits negated: its argmax is the target's argmin, so it never agrees."""

    def negate(w: Weights) -> Weights:
        w["model.norm.weight"] = -w["model.norm.weight"]
        return w

    return derive_model(src, dst, negate)


def constant_output(src: Path, dst: Path, probs: dict[int, float]) -> Path:
    """A model whose next-token distribution is `probs` at every position, whatever the input.

    Every token embeds identically, so the final hidden state h is the same everywhere; the head
    is rebuilt as outer(logits, h) / |h|^2 so that its logits are exactly log(probs) (and -30 for
    every other token). Needs an untied model (its own lm_head).
    """
    from app.execution.model import load_model  # loads the base once

    assert not json.loads((src / "config.json").read_text())["tie_word_embeddings"]
    weights = dict(mx.load(str(src / "model.safetensors")))
    table = weights["model.embed_tokens.weight"]
    weights["model.embed_tokens.weight"] = mx.broadcast_to(table[:1], table.shape)
    base = load_model(src).model
    base.load_weights(list(weights.items()))
    hidden = base.model(mx.array([[0]]))[0, -1].astype(mx.float32)
    logits = mx.full((table.shape[0],), -30.0)
    logits = logits.at[mx.array(list(probs))].add(mx.log(mx.array(list(probs.values()))) + 30.0)
    head = logits[:, None] * hidden[None, :] / mx.sum(hidden * hidden)

    def rebuild(w: Weights) -> Weights:
        w["model.embed_tokens.weight"] = weights["model.embed_tokens.weight"]
        w["lm_head.weight"] = head.astype(w["lm_head.weight"].dtype)
        return w

    return derive_model(src, dst, rebuild)


def fixed_distribution_pair(
    root: Path, tokens: list[int], target_probs: list[float], drafter_probs: list[float]
) -> tuple:
    """A target and a drafter of fixed next-token distributions over `tokens`, loaded."""
    from app.execution.model import load_model
    from ops.models.tiny import build_tiny_model

    base = build_tiny_model(root / "base", tie_embeddings=False, layers=1)
    target = constant_output(base, root / "target", dict(zip(tokens, target_probs, strict=True)))
    drafter = constant_output(base, root / "drafter", dict(zip(tokens, drafter_probs, strict=True)))
    return load_model(target), load_model(drafter)


def scaled_block_drafter(root: Path, target, kind: str, scale: float, width: int) -> Path:
    """A block drafter (`mtp`, `dflash` or `muse`) of verify width `width` for a `constant_output`
    target whose logits are the target's own times `scale` at every slot and chained step (so q is
    the target's row at temperature 1 / scale, whatever the input).

    Its decoder layers add nothing (o_proj and down_proj zero), so the pre-norm output is a fixed
    vector x: MTP's eh_proj passes hnorm(the target's final hidden h) through, a DFlash block row is
    the (shared) token embedding e. The final norm's weight is set so that norm(x) = scale * h,
    and the borrowed lm_head turns that into scale times the target's logits.
    """
    from mlx.utils import tree_flatten

    from app.drafters.block_model import DFlashModel, DraftShape, MtpHead

    hidden = target.config["hidden_size"]
    config = {
        "hidden_size": hidden, "intermediate_size": 2 * hidden, "num_attention_heads": 2, "num_key_value_heads": 1,
        "head_dim": hidden // 2, "num_hidden_layers": 1, "rms_norm_eps": 1e-6, "rope_theta": 10000.0,
        "vocab_size": target.vocab_size, "tie_word_embeddings": False, "model_type": "qwen3",
    }  # fmt: skip
    if kind == "mtp":
        config |= {"architectures": ["MtpDraftHead"], "mtp_config": {"depth": width - 1}}
    else:
        dflash = {"block_size": width, "target_layer_ids": [0], "mask_token_id": 3}
        config |= {"architectures": ["DFlashDraftModel"], "dflash_config": dflash}
        if kind == "muse":
            config |= {"architectures": ["MuseGlimmerAssistantModel"], "model_type": "muse_glimmer_assistant"}
    shape = DraftShape.from_config(config)
    module = MtpHead(shape, target.vocab_size) if kind == "mtp" else DFlashModel(shape, target.vocab_size)
    weights = dict(tree_flatten(module.parameters()))
    for name in list(weights):
        if name.endswith(("o_proj.weight", "down_proj.weight")):
            weights[name] = mx.zeros_like(weights[name])
    h = target.model.model(mx.array([[0]]))[0, -1].astype(mx.float32)  # the lm_head's input, everywhere

    def rms(v: mx.array) -> mx.array:
        return mx.sqrt(mx.mean(v * v))

    if kind == "mtp":
        weights["eh_proj.weight"] = mx.concatenate([mx.zeros((hidden, hidden)), mx.eye(hidden)], axis=1)
        weights["norm.weight"] = scale * rms(h) * mx.ones((hidden,))  # x = h / rms(h)
    else:
        e = target.model.model.embed_tokens.weight[0].astype(mx.float32)
        weights["norm.weight"] = scale * h * rms(e) / e  # x = e
    out = root / kind
    out.mkdir(parents=True)
    mx.save_safetensors(str(out / "model.safetensors"), weights, metadata={"format": "mlx"})
    (out / "config.json").write_text(json.dumps(config))
    return out
