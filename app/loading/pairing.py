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


def pairing_problem(target: Checkpoint, drafter: Checkpoint) -> str | None:
    """Why `drafter` cannot draft for `target` (None when it can).

    Block drafters borrow the target's lm_head, so their vocab_size must match it; every drafter's
    proposals are token ids, so both tokenizers must map text to the same ids.
    """
    rows, target_rows = drafter.config.get("vocab_size"), target.config.get("vocab_size")
    if not drafter.is_standalone and rows is not None and rows != target_rows:
        return f"vocab_size {rows} differs from the target's {target_rows}; train the drafter for this target"
    target_vocab, drafter_vocab = tokenizer_vocab(target.path), tokenizer_vocab(drafter.path)
    if target_vocab is None or drafter_vocab is None or target_vocab == drafter_vocab:
        return None
    differ = len(set(target_vocab.items()) ^ set(drafter_vocab.items()))
    return f"its vocabulary differs from the target's ({differ} entries differ); pair models that share a tokenizer"


def require_pairing(target: Checkpoint, drafter: Checkpoint) -> None:
    problem = pairing_problem(target, drafter)
    if problem is not None:
        raise ModelLoadError(f"drafter {drafter.path}: {problem}")
