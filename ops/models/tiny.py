"""Tiny random-weight models in mlx-lm format, built on the fly (tests use these).

Each borrows the embedded pair's tokenizer so it pairs with the embedded target, unless asked
for a perturbed vocabulary. Weights are random (seeded); only the shapes and files are real.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import mlx.core as mx
from mlx.utils import tree_flatten

REPO_ROOT = Path(__file__).resolve().parents[2]
TOKENIZER_SOURCE = REPO_ROOT / "models" / "target"
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja")


def _architecture(model_type: str, vocab_size: int, hidden: int, layers: int) -> dict[str, Any]:
    if model_type == "mamba":
        return {
            "model_type": "mamba", "architectures": ["MambaForCausalLM"], "vocab_size": vocab_size,
            "hidden_size": hidden, "intermediate_size": 2 * hidden, "state_size": 8,
            "num_hidden_layers": layers, "conv_kernel": 4, "use_bias": False, "use_conv_bias": True,
            "time_step_rank": 4, "tie_word_embeddings": True,
        }
    arch = "Qwen3ForCausalLM" if model_type == "qwen3" else "LlamaForCausalLM"
    return {
        "model_type": model_type, "architectures": [arch], "vocab_size": vocab_size, "hidden_size": hidden,
        "intermediate_size": 2 * hidden, "num_hidden_layers": layers, "num_attention_heads": 2,
        "num_key_value_heads": 1, "head_dim": hidden // 2, "rms_norm_eps": 1e-6, "rope_theta": 10000.0,
        "max_position_embeddings": 4096, "tie_word_embeddings": True,
    }


def _copy_tokenizer(out: Path, source: Path, perturb_vocab: bool) -> int:
    for name in TOKENIZER_FILES:
        if (source / name).exists():
            shutil.copy(source / name, out / name)
    tokenizer = json.loads((out / "tokenizer.json").read_text())
    vocab = tokenizer["model"]["vocab"]
    if perturb_vocab:
        # Swap the ids of two ordinary tokens: same tokens, same size, different text-to-id mapping.
        first, second = (next(t for t, i in vocab.items() if i == n) for n in (300, 301))
        vocab[first], vocab[second] = vocab[second], vocab[first]
        (out / "tokenizer.json").write_text(json.dumps(tokenizer))
    return len(vocab) + len(tokenizer.get("added_tokens", []))


def build_tiny_model(
    out: Path,
    *,
    model_type: str = "qwen3",
    hidden: int = 64,
    layers: int = 2,
    seed: int = 0,
    perturb_vocab: bool = False,
    tie_embeddings: bool = True,
    tokenizer_source: Path = TOKENIZER_SOURCE,
) -> Path:
    """Write a loadable random-weight model directory and return its path."""
    from mlx_lm.utils import _get_classes  # private but stable; maps config to classes

    out.mkdir(parents=True, exist_ok=True)
    source_config = json.loads((tokenizer_source / "config.json").read_text())
    _copy_tokenizer(out, tokenizer_source, perturb_vocab)
    config = _architecture(model_type, int(source_config["vocab_size"]), hidden, layers)
    config["eos_token_id"] = source_config.get("eos_token_id")
    config["tie_word_embeddings"] = tie_embeddings
    model_class, args_class = _get_classes(config)
    mx.random.seed(seed)
    model = model_class(args_class.from_dict(config))
    weights = dict(tree_flatten(model.parameters()))
    mx.save_safetensors(str(out / "model.safetensors"), weights, metadata={"format": "mlx"})
    (out / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    return out


def build_block_drafter_checkpoint(out: Path, config: dict[str, Any], seed: int = 0) -> Path:
    """A drafter-shaped directory (config.json plus one weight file, no embeddings or lm_head)."""
    out.mkdir(parents=True, exist_ok=True)
    (out / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    mx.random.seed(seed)
    mx.save_safetensors(str(out / "model.safetensors"), {"fc.weight": mx.random.normal((8, 16))})
    return out
