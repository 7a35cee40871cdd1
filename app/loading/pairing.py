"""Whether a drafter checkpoint can draft for a target: same output rows, same text-to-id mapping.

Read from the checkpoints' files (config.json, tokenizer.json), never from loaded models, so the
profile check refuses a bad pair before anything loads and the loop builder asks the same question.
"""

from __future__ import annotations

import json
from pathlib import Path

from app.loading.checkpoint import Checkpoint, ModelLoadError


class TokenizerFileError(ModelLoadError):
    """A tokenizer.json that cannot be read as one."""


def tokenizer_vocab(model_dir: Path) -> dict[str, int] | None:
    """Token-to-id map from tokenizer.json, added tokens included (None if the file is absent)."""
    path = model_dir / "tokenizer.json"
    if not path.is_file():
        return None
    try:
        data = json.loads(path.read_bytes())
        vocab = dict(data.get("model", {}).get("vocab", {}))
        vocab |= {t["content"]: t["id"] for t in data.get("added_tokens", [])}
    except (OSError, ValueError, AttributeError, TypeError, KeyError) as exc:  # unreadable, not JSON, not its shape
        raise TokenizerFileError(
            f"{path} is not a valid tokenizer.json ({type(exc).__name__}: {exc}); replace it with the model's own"
        ) from exc
    return vocab


def text_size(config: dict, key: str) -> object:
    """A size of a checkpoint's language model (a multimodal config keeps it in `text_config`)."""
    return config.get(key, (config.get("text_config") or {}).get(key))


def block_problem(target: Checkpoint, drafter: Checkpoint) -> str | None:
    """Why a block drafter cannot read `target`: it adds the target's embeddings to its own stream
    and hands its output to the target's lm_head, so its hidden size is the target's; it taps
    layers the target must have."""
    rows, target_rows = drafter.config.get("vocab_size"), text_size(target.config, "vocab_size")
    if rows is not None and rows != target_rows:
        return f"vocab_size {rows} differs from the target's {target_rows}; train the drafter for this target"
    width, target_width = drafter.config.get("hidden_size"), text_size(target.config, "hidden_size")
    if width is not None and target_width is not None and width != target_width:
        return (
            f"hidden_size {width} differs from the target's {target_width} (a block drafter reads the target's hidden "
            "states and borrows its embedding and lm_head); use a drafter made for this target"
        )
    taps = (drafter.config.get("dflash_config") or {}).get("target_layer_ids") or []
    layers = text_size(target.config, "num_hidden_layers")
    if isinstance(layers, int) and any(not 0 <= i < layers for i in taps):
        return f"target_layer_ids {taps} exceed the target's {layers} layers; use a drafter made for this target"
    return None


def pairing_problem(target: Checkpoint, drafter: Checkpoint) -> str | None:
    """Why `drafter` cannot draft for `target` (None when it can).

    Block drafters borrow the target's lm_head and read its hidden states (`block_problem`); every
    drafter's proposals are token ids, so both tokenizers must map text to the same ids.
    """
    if not drafter.is_standalone and (problem := block_problem(target, drafter)) is not None:
        return problem
    target_vocab, drafter_vocab = tokenizer_vocab(target.path), tokenizer_vocab(drafter.path)
    if target_vocab is None or drafter_vocab is None or target_vocab == drafter_vocab:
        return None
    differ = len(set(target_vocab.items()) ^ set(drafter_vocab.items()))
    return f"its vocabulary differs from the target's ({differ} entries differ); pair models that share a tokenizer"


def require_pairing(target: Checkpoint, drafter: Checkpoint) -> None:
    problem = pairing_problem(target, drafter)
    if problem is not None:
        raise ModelLoadError(f"drafter {drafter.path}: {problem}")
