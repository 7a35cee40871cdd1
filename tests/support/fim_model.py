"""A tiny model that fills in the middle: a random tiny Qwen3 whose tokenizer gains Qwen2.5-coder's
FIM tokens, trained (in MLX, seconds on the CPU) on a few gaps laid out by the server's own
prompt builder (app/server/core/infill.py), so /infill and `suffix` have a model that really fills
in, and whose answer depends on the suffix and on the other files' text."""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass, field
from pathlib import Path

import mlx.core as mx
import mlx.nn as nn
import mlx_lm

from app.loading import EMBEDDED_TARGET
from app.server.core.infill import infill_prompt
from ops.models.tiny import TOKENIZER_FILES, build_tiny_model
from tests.support.training import fit_and_save

FIM_TOKENS = ("<|fim_prefix|>", "<|fim_middle|>", "<|fim_suffix|>", "<|fim_pad|>", "<|repo_name|>", "<|file_sep|>")
END = "<|endoftext|>"  # ends a middle, as Qwen2.5-coder ends one (an EOS of the embedded pair's config)
CONTEXT = 4096  # the tiny model's max_position_embeddings: the server's context, which sizes the extra's take
STEPS = 200


@dataclass(frozen=True)
class Gap:
    """One training gap: /infill's fields and the middle the model learns to write."""

    prefix: str
    suffix: str
    middle: str
    prompt: str = ""
    extra: list[dict[str, str]] = field(default_factory=list)


SHAPES = {"filename": "shapes.py", "text": "def area(width, height):\n    return width * height\n"}
# Two gaps differ only in their suffix: the middle is read from it. One reads another file's text.
GAPS = (
    Gap("def f(a, b):\n    return ", "\n\ntotal = f(2, 3)\n", "a + b"),
    Gap("def f(a, b):\n    return ", "\n\nproduct = f(2, 3)\n", "a * b"),
    Gap("from shapes import *\n\n", "\nprint(size)\n", "area(width, height)", prompt="size = ", extra=[SHAPES]),
)


def fim_tokenizer(out: Path) -> Path:
    """The embedded pair's tokenizer with the FIM tokens added after its vocabulary, and a config
    whose vocabulary holds them (a tokenizer source for ops/models/tiny.py)."""
    out.mkdir(parents=True, exist_ok=True)
    for name in TOKENIZER_FILES:
        shutil.copy(EMBEDDED_TARGET / name, out / name)
    tokenizer = json.loads((out / "tokenizer.json").read_text())
    config = json.loads((EMBEDDED_TARGET / "config.json").read_text())
    first = int(config["vocab_size"])
    for offset, content in enumerate(FIM_TOKENS):
        tokenizer["added_tokens"].append(
            {"id": first + offset, "content": content, "single_word": False, "lstrip": False, "rstrip": False}
            | {"normalized": False, "special": True}
        )
    (out / "tokenizer.json").write_text(json.dumps(tokenizer))
    config["vocab_size"] = first + len(FIM_TOKENS)
    (out / "config.json").write_text(json.dumps(config))
    return out


def build_fim_model(out: Path) -> Path:
    """A model directory whose greedy middle for each of GAPS, asked through /infill, is its `middle`."""
    build_tiny_model(out, hidden=64, layers=2, seed=11, tokenizer_source=fim_tokenizer(out.parent / "fim-tokenizer"))
    model, tokenizer = mlx_lm.load(str(out))
    end = tokenizer.encode(END, add_special_tokens=False)
    rows = []
    for gap in GAPS:
        prompt = infill_prompt(
            gap.prefix, gap.suffix, gap.extra, gap.prompt, tokenizer, model.args.vocab_size, CONTEXT, -1
        ).tokens
        rows.append((prompt, tokenizer.encode(gap.middle, add_special_tokens=False) + end))
    # one batch, right-padded: the answers' tokens are the only targets
    width = max(len(prompt) + len(answer) for prompt, answer in rows)
    tokens = mx.array([prompt + answer + [0] * (width - len(prompt) - len(answer)) for prompt, answer in rows])
    targets = mx.array(
        [
            [0] * (len(prompt) - 1) + [1] * len(answer) + [0] * (width - len(prompt) - len(answer))
            for prompt, answer in rows
        ]
    )

    def loss(model: nn.Module) -> mx.array:
        losses = nn.losses.cross_entropy(model(tokens[:, :-1]), tokens[:, 1:])
        return (losses * targets).sum() / targets.sum()

    return fit_and_save(model, loss, out, STEPS, seed=11)
