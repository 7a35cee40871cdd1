"""The embedded target grown to 1.2 B parameters, computing the same function, with its block drafters.

On a GPU the embedded pair is launch overhead (issue 46): its 9 M target costs about what its
drafter costs. `random-1.2b` (ops/models/random_target.py) has the cost of a real model but no
drafter that agrees with it. Growing the embedded target keeps what it computes and gives it the
cost: `grown-1.2b` is the target widened 256 -> 2048, heads 4 -> 32 over KV heads 2 -> 16, MLP
512 -> 6144, layers 14 -> 24 (1,216 M parameters), and every drafter of the embedded pair still
agrees with it as much as it agreed with the original.

    python -m ops.models.grown OUT_DIR [--hidden 2048 --heads 32 --kv-heads 16 --intermediate 6144
        --layers 24] [--dtype bfloat16] [--no-drafters] [--no-quantized]

writes OUT_DIR/target (the grown target, the embedded tokenizer's files beside it),
OUT_DIR/target-4bit (mlx-lm's 4-bit quantization of it, group size 64), and OUT_DIR/mtp,
dflash, dspark and muse (the block drafters, grown to read it). The standalone draft model
(models/drafter) needs no growing: it has its own embedding and head and pairs by vocabulary.

Why the function is the same. Let h0 = 256 and h = 2048.

- The residual stream carries the original 256 values and 1,792 zeros. The embedding's new
  columns are zero, and every product that writes the stream (o_proj, down_proj) has zero rows
  for the new dimensions, so they stay zero at every layer.
- RMSNorm over the padded vector: mean(x^2) over h is (h0 / h) times the mean over the original
  h0 values, so x / rms is sqrt(h / h0) times the original's. Each norm of the stream (the two per
  layer and the final one) gets its weight scaled by sqrt(h0 / h), and its new entries are
  irrelevant (they multiply zeros). The q/k norms normalise each head's head_dim (64) values,
  which do not change: their weights stay as they are. The norm adds eps to the mean before its
  square root, so the stream's norms need eps scaled by h0 / h as well: `rms_norm_eps` is
  scaled. It is one setting for every norm, so the q/k norms get the smaller eps too, a relative
  change of their scale of (1 - h0 / h) eps / (2 mean(q^2)). Measured on the CPU in float32 over
  four held-out prompts, the stream widened 256 -> 2048 alone: logits within 1.4e-5 of the
  original's with eps scaled, within 7.6e-3 with eps kept (the stream's mean squares are small).
- Input products (q/k/v, gate/up, and the lm_head through the tied embedding) read the new
  dimensions as zeros, so their new input columns add nothing: they are seeded noise (dense, as a
  real model's, and every 4-bit group of the original's weights is the original's group).
- Heads: query head i reads KV head i // (heads / kv_heads). With 32 over 16 the original heads
  0-3 read KV heads 0, 0, 1, 1, as they did over 2; with any other ratio they would read other
  heads (32 over 8 broke greedy output on 4 of 4 prompts): the ratio is required to be kept. The
  new heads' o_proj columns are zero, so what they attend adds nothing; likewise the new MLP
  units' down_proj columns.
- New layers have zero o_proj and down_proj: each adds exactly zero to the stream (the rest of
  their weights are seeded noise, so they cost what a real layer costs, KV cache included).

Where the new layers go: spread evenly between the original layers (original layer i becomes
layer i + floor(i * new / old), where new is the count added), not appended or prepended. Any
place computes the same function, since a new layer passes the stream through unchanged, so the
choice is about what else reads the layer stack. The block drafters tap chosen layers
(`target_layer_ids`), picked spread over the depth (DFlash's 1, 5, 9, 12 of 14). Spread new
layers keep each tap at about its relative depth (12 of 14 -> 20 of 24, 0.86 -> 0.83), so the
grown drafter's taps read like those of a drafter made for a 24-layer target. Appended ones
would leave every tap in the first 13 layers and the last 10 layers as dead weight ahead of the
final norm; prepended ones would put 10 identities on the raw embeddings. The cost is the same
anywhere.

The block drafters borrow the target's embedding and lm_head, so their residual stream must be
the target's width: each is widened 256 -> 2048 the same way (zero input columns for the new
dimensions, zero output rows, its stream's norms scaled), its heads, MLP and layers unchanged.
Each tapped layer index maps to the grown index of the same original layer, which holds the
same hidden state (`num_target_layers` follows). DFlash's `fc` reads the taps concatenated, so
each tap's 256 input columns move to the start of that tap's 2048; MTP's `eh_proj` reads
[enorm(embedding); hnorm(hidden)], so the same for its two halves.

A float32 build is the function up to rounding. A bf16 build (the default, as the GPU computes in
the checkpoint's dtype) also rounds the scaled norm weights to bf16 (sqrt(1/8) is not a power of
two), a relative change of at most 2^-9 per weight: with the stream widened 256 -> 2048 alone and
computed in float32, logits moved by up to 0.048 (of about 18) and the argmax of every position
of four held-out prompts stayed. tests/drafters/test_grown_pair.py builds a small growth on the
CPU in float32 and checks its greedy tokens and every drafter's acceptance against the embedded
target's.
"""

from __future__ import annotations

import argparse
import json
import math
import shutil
import zlib
from dataclasses import dataclass
from pathlib import Path

import mlx.core as mx
from mlx.utils import tree_flatten
from mlx_lm.models import qwen3

from app.loading.paths import REPO_ROOT

EMBEDDED = REPO_ROOT / "models"
GROWN_1_2B = "grown-1.2b"
SIZE_1_2B = {"hidden": 2048, "heads": 32, "kv_heads": 16, "intermediate": 6144, "layers": 24}
BLOCK_DRAFTERS = ("mtp", "dflash", "dspark", "muse")
INIT_STD = 0.02  # the embedded target's initializer_range: the new weights' noise
WEIGHT_FILES = ("config.json", "model.safetensors.index.json")  # not copied beside the grown weights

Weights = dict[str, mx.array]


@dataclass(frozen=True)
class Growth:
    """The sizes before and after; what every grown weight is placed by."""

    hidden: tuple[int, int]
    heads: tuple[int, int]
    kv_heads: tuple[int, int]
    intermediate: tuple[int, int]
    layers: tuple[int, int]
    head_dim: int

    @classmethod
    def of(cls, config: dict, *, hidden: int, heads: int, kv_heads: int, intermediate: int, layers: int) -> Growth:
        """The growth of a checkpoint of `config` to these sizes; ValueError for one that cannot keep its function."""
        growth = cls(
            hidden=(config["hidden_size"], hidden),
            heads=(config["num_attention_heads"], heads),
            kv_heads=(config["num_key_value_heads"], kv_heads),
            intermediate=(config["intermediate_size"], intermediate),
            layers=(config["num_hidden_layers"], layers),
            head_dim=config.get("head_dim") or config["hidden_size"] // config["num_attention_heads"],
        )
        for name in ("hidden", "heads", "kv_heads", "intermediate", "layers"):
            old, new = getattr(growth, name)
            if new < old:
                raise ValueError(f"{name} {new} is smaller than the original's {old}: a growth only adds")
        (h0, h), (k0, k) = growth.heads, growth.kv_heads
        if h % k or h // k != h0 // k0:
            raise ValueError(
                f"{h} heads over {k} KV heads: the original's ratio is {h0 // k0} (over {k0}), and query head i "
                "reads KV head i // ratio, so the original heads would read other KV heads; keep the ratio"
            )
        return growth

    @property
    def norm_scale(self) -> float:
        """What each norm of the residual stream is scaled by: mean(x^2) over the wider vector
        is h0 / h times the original's."""
        return math.sqrt(self.hidden[0] / self.hidden[1])

    def layer_map(self) -> list[int]:
        """The grown index of each original layer (the new layers spread between them)."""
        old, new = self.layers
        return [i + i * (new - old) // old for i in range(old)]


def placed(old: mx.array, new: mx.array) -> mx.array:
    """`new` with `old` over its leading corner (`old`'s index i at i on every axis)."""
    new[tuple(slice(0, n) for n in old.shape)] = old.astype(new.dtype)
    return new


def noise(name: str, shape: tuple[int, ...], seed: int) -> mx.array:
    """Seeded noise for a new weight; its key follows from its name, so the build is the same in any order."""
    key = mx.random.key((seed * 1_000_003 + zlib.crc32(name.encode())) % 2**32)
    return INIT_STD * mx.random.normal(shape, key=key)


def stream_norm(old: mx.array | None, shape: tuple[int, ...], growth: Growth) -> mx.array:
    """A norm of the residual stream: its weight scaled, the new entries (which multiply zeros) the scale."""
    scale = growth.norm_scale
    new = mx.full(shape, scale, dtype=mx.float32)
    return new if old is None else placed(old.astype(mx.float32) * scale, new)


def target_weight(name: str, shape: tuple[int, ...], old: mx.array | None, growth: Growth, seed: int) -> mx.array:
    """One weight of the grown target (`old`: the original's of that name, None in a new layer)."""
    leaf = name.removesuffix(".weight").rsplit(".", 1)[-1]
    if leaf in ("input_layernorm", "post_attention_layernorm", "norm"):
        return stream_norm(old, shape, growth)
    if leaf in ("q_norm", "k_norm"):  # over head_dim, which does not change
        return mx.ones(shape) if old is None else old.astype(mx.float32)
    if leaf == "embed_tokens":  # the new dimensions of the stream start at zero
        return placed(old, mx.zeros(shape))
    if leaf in ("o_proj", "down_proj"):  # writes the stream: not its new dimensions, nothing of new heads/units/layers
        return mx.zeros(shape) if old is None else placed(old, mx.zeros(shape))
    if leaf in ("q_proj", "k_proj", "v_proj", "gate_proj", "up_proj", "lm_head"):
        fresh = noise(name, shape, seed)
        return fresh if old is None else placed(old, fresh)
    raise ValueError(f"{name}: no rule to grow this weight")


def grown_eps(config: dict, growth: Growth) -> float:
    """The norms' eps over the wider stream: mean(x^2) is h0 / h of the original's, so is eps."""
    return config.get("rms_norm_eps", 1e-6) * growth.hidden[0] / growth.hidden[1]


def grown_config(config: dict, growth: Growth, dtype: str) -> dict:
    layers = growth.layers[1]
    return config | {
        "hidden_size": growth.hidden[1], "num_attention_heads": growth.heads[1],
        "num_key_value_heads": growth.kv_heads[1], "intermediate_size": growth.intermediate[1],
        "num_hidden_layers": layers, "layer_types": ["full_attention"] * layers, "dtype": dtype,
        "rms_norm_eps": grown_eps(config, growth),
    }  # fmt: skip


def read_weights(path: Path) -> Weights:
    weights: Weights = {}
    for file in sorted(path.glob("*.safetensors")):
        weights |= mx.load(str(file))
    return weights


def grow_target(source: Path, out: Path, growth: Growth, dtype: str = "bfloat16", seed: int = 0) -> Path:
    """The target at `source` grown into `out` (config, weights, and its other files copied)."""
    config = json.loads((source / "config.json").read_text())
    new_config = grown_config(config, growth, dtype)
    out.mkdir(parents=True, exist_ok=True)
    for file in source.iterdir():
        if file.is_file() and file.suffix != ".safetensors" and file.name not in WEIGHT_FILES:
            shutil.copy(file, out / file.name)
    (out / "config.json").write_text(json.dumps(new_config, indent=2))
    original = read_weights(source)
    originals = {new: old for old, new in enumerate(growth.layer_map())}
    # the new model's names and shapes; its own initialisation is lazy and never evaluated
    grown_model = qwen3.Model(qwen3.ModelArgs.from_dict(new_config))
    shapes = {name: tuple(w.shape) for name, w in tree_flatten(grown_model.parameters())}
    weights = {}
    for name, shape in shapes.items():
        old_name = name
        if name.startswith("model.layers."):
            index, rest = name.removeprefix("model.layers.").split(".", 1)
            old_index = originals.get(int(index))
            old_name = None if old_index is None else f"model.layers.{old_index}.{rest}"
        old = original.get(old_name) if old_name is not None else None
        if old_name is not None and old is None:
            raise ValueError(f"{source}: no weight {old_name} to grow into {name}")
        weights[name] = target_weight(name, shape, old, growth, seed).astype(getattr(mx, dtype))
        mx.eval(weights[name])  # one weight's float32 noise at a time, not the whole model's
    mx.save_safetensors(str(out / "model.safetensors"), weights, metadata={"format": "mlx"})
    return out


def drafter_weight(name: str, old: mx.array, growth: Growth) -> mx.array:
    """One weight of a block drafter widened to the grown stream: zero padding and scaled norms."""
    h0, h = growth.hidden
    leaf = name.removesuffix(".weight").rsplit(".", 1)[-1]
    if leaf in ("input_layernorm", "post_attention_layernorm", "norm", "hidden_norm", "enorm", "hnorm"):
        return stream_norm(old, (h,), growth)
    if leaf in ("q_norm", "k_norm", "markov_w1", "markov_w2"):
        return old.astype(mx.float32)
    if leaf in ("q_proj", "k_proj", "v_proj", "gate_proj", "up_proj"):  # read the stream
        return placed(old, mx.zeros((old.shape[0], h)))
    if leaf in ("o_proj", "down_proj"):  # write the stream
        return placed(old, mx.zeros((h, old.shape[1])))
    if leaf in ("fc", "eh_proj"):  # read pieces of h0 laid end to end (taps; enorm and hnorm): each to its h
        pieces = old.shape[1] // h0
        new = mx.zeros((h, pieces * h))
        for k in range(pieces):
            new[:h0, k * h : k * h + h0] = old[:, k * h0 : (k + 1) * h0].astype(new.dtype)
        return new
    raise ValueError(f"{name}: no rule to grow this drafter weight")


def grow_block_drafter(source: Path, out: Path, growth: Growth, dtype: str = "bfloat16") -> Path:
    """A block drafter of the original target widened to read the grown one, into `out`."""
    config = json.loads((source / "config.json").read_text())
    new_config = dict(config, hidden_size=growth.hidden[1], torch_dtype=dtype, rms_norm_eps=grown_eps(config, growth))
    if "num_target_layers" in config:
        new_config["num_target_layers"] = growth.layers[1]
    inner = config.get("dflash_config")
    if inner and inner.get("target_layer_ids"):
        grown_index = growth.layer_map()
        new_config["dflash_config"] = inner | {"target_layer_ids": [grown_index[i] for i in inner["target_layer_ids"]]}
    out.mkdir(parents=True, exist_ok=True)
    (out / "config.json").write_text(json.dumps(new_config, indent=2))
    weights = {name: drafter_weight(name, w, growth) for name, w in read_weights(source).items()}
    weights = {name: w.astype(getattr(mx, dtype)) for name, w in weights.items()}
    mx.save_safetensors(str(out / "model.safetensors"), weights, metadata={"format": "mlx"})
    return out


def quantized_copy(path: Path, out: Path, bits: int = 4, group_size: int = 64, dtype: str | None = None) -> Path:
    """mlx-lm's quantization of the model at `path` into `out` (as `mlx_lm convert -q`), its
    unquantized weights and scales in `dtype` (None: the checkpoint's)."""
    from mlx_lm import convert

    if out.exists():
        shutil.rmtree(out)
    convert(hf_path=str(path), mlx_path=str(out), quantize=True, q_bits=bits, q_group_size=group_size, dtype=dtype)
    return out


@dataclass(frozen=True)
class Grown:
    """What a build wrote: the grown target, its 4-bit copy, the grown block drafters by name."""

    root: Path
    target: Path
    quantized: Path | None
    drafters: dict[str, Path]


def build_grown(
    out: Path,
    *,
    hidden: int,
    heads: int,
    kv_heads: int,
    intermediate: int,
    layers: int,
    dtype: str = "bfloat16",
    seed: int = 0,
    drafters: bool = True,
    quantized: bool = False,
    source: Path = EMBEDDED,
) -> Grown:
    """The target under `source` (a models/ directory: target/ and the block drafters) grown to
    these sizes into `out`: out/target, out/target-4bit with `quantized`, out/<drafter> with
    `drafters`."""
    config = json.loads((source / "target" / "config.json").read_text())
    growth = Growth.of(config, hidden=hidden, heads=heads, kv_heads=kv_heads, intermediate=intermediate, layers=layers)
    target = grow_target(source / "target", out / "target", growth, dtype, seed)
    grown = {}
    if drafters:
        grown = {name: grow_block_drafter(source / name, out / name, growth, dtype) for name in BLOCK_DRAFTERS}
    copy = quantized_copy(target, out / "target-4bit") if quantized else None
    return Grown(root=out, target=target, quantized=copy, drafters=grown)


def build_grown_1_2b(out: Path, **options: object) -> Grown:
    """`grown-1.2b` (issue 46's sizes) into `out`."""
    return build_grown(out, **SIZE_1_2B, **options)  # type: ignore[arg-type]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(allow_abbrev=False, description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path)
    for key, value in SIZE_1_2B.items():
        parser.add_argument(f"--{key.replace('_', '-')}", type=int, default=value)
    parser.add_argument("--dtype", choices=("bfloat16", "float16", "float32"), default="bfloat16")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--no-drafters", action="store_true", help="the target alone")
    parser.add_argument("--no-quantized", action="store_true", help="no 4-bit copy")
    args = vars(parser.parse_args(argv))
    out, no_drafters, no_quantized = args.pop("out"), args.pop("no_drafters"), args.pop("no_quantized")
    grown = build_grown(out, **args, drafters=not no_drafters, quantized=not no_quantized)
    for name, path in [("target", grown.target), ("target-4bit", grown.quantized), *grown.drafters.items()]:
        if path is not None:
            print(f"{name}: {path}")


if __name__ == "__main__":
    main()
