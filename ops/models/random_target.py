"""A random-weight bf16 Qwen3 target of a realistic size, built on the spot (no hub, no training).

The GPU benchmarks measure throughput on a model whose weights stream like a real one's: issue
25's 1.2 B target (hidden 2048 x 24 layers, intermediate 6144, 16 query and 8 KV heads of 128,
the embedded tokenizer's vocabulary). Only the shapes matter: the weights are seeded noise,
scaled down so activations stay finite over 24 layers.

    python -m ops.models.random_target OUT_DIR [--hidden 2048 --layers 24 ...]
"""

from __future__ import annotations

import argparse
import json
import shutil
from pathlib import Path

import mlx.core as mx
from mlx.utils import tree_flatten, tree_map
from mlx_lm.models import qwen3

from ops.models.tiny import TOKENIZER_FILES, TOKENIZER_SOURCE

SIZE_1_2B = {"hidden": 2048, "layers": 24, "intermediate": 6144, "heads": 16, "kv_heads": 8, "head_dim": 128}
WEIGHT_SCALE = 0.5  # of mlx's default initialisation: keeps 24 random layers' activations finite


def build_random_target(
    out: Path,
    *,
    hidden: int,
    layers: int,
    intermediate: int,
    heads: int,
    kv_heads: int,
    head_dim: int,
    seed: int = 0,
) -> Path:
    """A model directory at `out`: the embedded target's config with these sizes, bf16 weights."""
    out.mkdir(parents=True, exist_ok=True)
    config = json.loads((TOKENIZER_SOURCE / "config.json").read_text())
    config |= {
        "hidden_size": hidden, "num_hidden_layers": layers, "intermediate_size": intermediate,
        "num_attention_heads": heads, "num_key_value_heads": kv_heads, "head_dim": head_dim,
        "layer_types": ["full_attention"] * layers, "tie_word_embeddings": False, "dtype": "bfloat16",
    }  # fmt: skip
    (out / "config.json").write_text(json.dumps(config, indent=2))
    for name in TOKENIZER_FILES:
        shutil.copy(TOKENIZER_SOURCE / name, out / name)
    mx.random.seed(seed)
    model = qwen3.Model(qwen3.ModelArgs.from_dict(config))
    model.update(tree_map(lambda w: (w * WEIGHT_SCALE).astype(mx.bfloat16), model.parameters()))
    mx.save_safetensors(str(out / "model.safetensors"), dict(tree_flatten(model.parameters())))
    return out


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(allow_abbrev=False, description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path)
    for key, value in SIZE_1_2B.items():
        parser.add_argument(f"--{key.replace('_', '-')}", type=int, default=value)
    parser.add_argument("--seed", type=int, default=0)
    args = vars(parser.parse_args(argv))
    print(build_random_target(args.pop("out"), **args))


if __name__ == "__main__":
    main()
