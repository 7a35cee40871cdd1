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
    from app.loading import load_model  # loads the base once

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
    from app.loading import load_model
    from ops.models.tiny import build_tiny_model

    base = build_tiny_model(root / "base", tie_embeddings=False, layers=1)
    target = constant_output(base, root / "target", dict(zip(tokens, target_probs, strict=True)))
    drafter = constant_output(base, root / "drafter", dict(zip(tokens, drafter_probs, strict=True)))
    return load_model(target), load_model(drafter)
