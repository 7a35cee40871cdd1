"""llama.cpp's GGUF files as models: checked, converted once into a model directory, and served.

`-m model.gguf`, `-hf org/repo-GGUF:QUANT` (a file of that repository in the Hugging Face cache,
as llama-server picks it) and a profile's `target`/`drafter.model` naming either are read here.
The header is read first, in pure Python (`gguf_header.py`): a file whose architecture mlx-lm
has no module for here, or whose tensors MLX cannot read, is refused with one error naming GGUF,
what was found and docs/bring-your-own-model.md, before MLX loads. Otherwise `mx.load` reads the
tensors (F32, F16, BF16; Q8_0, Q4_0 and Q4_1 as MLX's affine 8- and 4-bit, group 32), which are
renamed to the Hugging Face layout mlx-lm loads (llama's q and k rows put back in their order:
llama.cpp's converter interleaves them), with a config.json from the metadata and a tokenizer
built from the metadata's vocabulary and merges (transformers' GGUF tokenizer builders). The
directory is written once under the cache (`$XDG_CACHE_HOME/mlxcel/gguf`, keyed by the file's
path, size and time) and reused.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import tempfile
from collections import Counter
from pathlib import Path
from typing import Any

from app.loading.checkpoint import ModelLoadError
from app.loading.gguf_header import GgufError, GgufHeader, read_header

DOC = "docs/bring-your-own-model.md"
# The ggml types mlx.core.load reads (as MLX's own dtypes or affine quantization), by name
READABLE = {"F32": None, "F16": None, "BF16": None, "Q8_0": 8, "Q4_0": 4, "Q4_1": 4}
GROUP = 32  # every readable quantized type's block
ARCHITECTURES = {"llama": "llama", "qwen2": "qwen2", "qwen3": "qwen3"}  # GGUF name: mlx-lm's model_type
CLASSES = {"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM", "qwen3": "Qwen3ForCausalLM"}
# llama-server's: `-hf org/repo:QUANT`, the quantization tag defaulting to Q4_K_M
REPO_TAG = re.compile(r"(?P<repo>[A-Za-z0-9][\w.-]*/[A-Za-z0-9][\w.-]*):(?P<tag>[\w.-]+)")
DEFAULT_TAG = "Q4_K_M"
LAYER_NAMES = {
    "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "attn_q_norm": "self_attn.q_norm",
    "attn_k_norm": "self_attn.k_norm",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}
TOP_NAMES = {"token_embd": "model.embed_tokens", "output_norm": "model.norm", "output": "lm_head"}


class GgufModelError(ModelLoadError):
    """A GGUF file that cannot be served; command-line tools exit with code 2 on it."""


def is_gguf_path(value: str) -> bool:
    return value.lower().endswith(".gguf")


def is_repo_tag(value: str) -> bool:
    """`org/name:QUANT`, llama-server's `-hf` spelling of one GGUF file of a repository."""
    return REPO_TAG.fullmatch(value) is not None


def refusal(path: Path, what: str) -> GgufModelError:
    return GgufModelError(
        f"{path}: a GGUF file (llama.cpp's format) that cannot be served: {what}. Convert the original "
        f"Hugging Face model with mlx_lm convert instead ({DOC})"
    )


def check(path: Path) -> GgufHeader:
    """The file's header, once the architecture and every tensor's type are ones this server reads."""
    if not path.is_file():
        raise GgufModelError(f"GGUF file not found: {path}")
    if re.search(r"-\d{5}-of-\d{5}\.gguf$", path.name):
        raise refusal(path, "it is one part of a split GGUF (join the parts with llama-gguf-split --merge)")
    try:
        header = read_header(path)
    except (GgufError, OSError) as exc:
        raise refusal(path, str(exc)) from exc
    if header.architecture not in ARCHITECTURES:
        known = ", ".join(sorted(ARCHITECTURES))
        raise refusal(path, f"architecture {header.architecture or '(none)'!r}; GGUF files are read for {known}")
    unreadable = Counter(t.type_name for t in header.tensors if t.type_name not in READABLE)
    if unreadable:
        found = ", ".join(f"{name} ({count} tensors)" for name, count in unreadable.most_common())
        first = next(t.name for t in header.tensors if t.type_name not in READABLE)
        readable = ", ".join(READABLE)
        raise refusal(path, f"tensor type {found}, first {first}; MLX reads {readable} (mlx.core.load)")
    if any(t.name == "rope_freqs.weight" for t in header.tensors):
        raise refusal(path, "Llama 3.1's rope frequency factors (rope_freqs), which its metadata does not describe")
    if "tokenizer.ggml.tokens" not in header.metadata:
        raise refusal(path, "no tokenizer in its metadata")
    return header


def tagged_file(snapshot: Path, repo: str, tag: str | None) -> Path:
    """The GGUF file of a repository snapshot that llama-server's `-hf repo:tag` picks (the tag
    in its name, case-insensitive; no tag: Q4_K_M, or the only file)."""
    files = sorted(p for p in snapshot.rglob("*.gguf") if "mmproj" not in p.name.lower())
    wanted = (tag or DEFAULT_TAG).lower()
    chosen = [p for p in files if wanted in p.name.lower()]
    if not chosen and tag is None and len(files) == 1:
        chosen = files
    if len(chosen) != 1:
        names = ", ".join(p.name for p in files) or "none"
        which = f"tag {tag!r}" if tag else f"no tag (llama-server's default {DEFAULT_TAG})"
        raise GgufModelError(
            f"{repo}: {which} picks {len(chosen)} of its GGUF files ({names}); name one as {repo}:QUANT"
        )
    return chosen[0]


def cache_root() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or "~/.cache"
    return Path(base).expanduser() / "mlxcel" / "gguf"


def served_directory(path: Path) -> Path:
    """The model directory converted from the GGUF file at `path` (made on first use, then reused)."""
    path = path.expanduser().absolute()  # not resolved: a cache's snapshot links to blobs without a name
    header = check(path)
    stat = path.stat()
    key = hashlib.sha256(f"{path}:{stat.st_size}:{stat.st_mtime_ns}".encode()).hexdigest()[:16]
    target = cache_root() / f"{path.stem}-{key}"
    if (target / "config.json").is_file():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    scratch = Path(tempfile.mkdtemp(prefix=f".{path.stem}-", dir=target.parent))
    try:
        convert(header, scratch)
        scratch.replace(target)  # another process may have made it meanwhile: either is whole
    except OSError:
        if not (target / "config.json").is_file():
            raise
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return target


def model_config(header: GgufHeader, vocab: int, tied: bool) -> dict[str, Any]:
    """config.json from the metadata (llama.cpp's keys, under the architecture's name)."""
    arch, meta = header.architecture, header.metadata

    def key(name: str, default: Any = None) -> Any:
        return meta.get(f"{arch}.{name}", default)

    heads = int(key("attention.head_count"))
    hidden = int(key("embedding_length"))
    config: dict[str, Any] = {
        "model_type": ARCHITECTURES[arch],
        "architectures": [
            {"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM", "qwen3": "Qwen3ForCausalLM"}[arch]
        ],
        "vocab_size": vocab,
        "hidden_size": hidden,
        "intermediate_size": int(key("feed_forward_length")),
        "num_hidden_layers": int(key("block_count")),
        "num_attention_heads": heads,
        "num_key_value_heads": int(key("attention.head_count_kv", heads)),
        "head_dim": int(key("attention.key_length", hidden // heads)),
        "rms_norm_eps": single(key("attention.layer_norm_rms_epsilon", 1e-6)),
        "rope_theta": single(key("rope.freq_base", 10000.0)),
        "max_position_embeddings": int(key("context_length", 4096)),
        "tie_word_embeddings": tied,
    }
    if key("rope.scaling.type") == "linear":
        config["rope_scaling"] = {"type": "linear", "factor": float(key("rope.scaling.factor"))}
    ends = [meta.get(f"tokenizer.ggml.{name}_token_id") for name in ("eos", "eot", "eom")]
    config["eos_token_id"] = sorted({int(t) for t in ends if t is not None})
    if meta.get("tokenizer.ggml.bos_token_id") is not None:
        config["bos_token_id"] = int(meta["tokenizer.ggml.bos_token_id"])
    return config


def single(value: float) -> float:
    """A float32 metadata value as its shortest spelling (1e-06, not 9.99999997e-07)."""
    import numpy as np

    return float(str(np.float32(value)))


def hf_name(name: str) -> str:
    """A GGUF tensor's name in the Hugging Face layout (`blk.3.attn_q.weight`:
    `model.layers.3.self_attn.q_proj.weight`)."""
    stem, _, leaf = name.rpartition(".")
    parts = stem.split(".")
    if parts[0] == "blk" and len(parts) == 3 and parts[2] in LAYER_NAMES:
        return f"model.layers.{parts[1]}.{LAYER_NAMES[parts[2]]}.{leaf}"
    if stem in TOP_NAMES:
        return f"{TOP_NAMES[stem]}.{leaf}"
    raise GgufModelError(f"GGUF tensor {name} has no place in the Hugging Face layout ({DOC})")


def unpermute(weight: Any, heads: int) -> Any:
    """Undo llama.cpp's q/k row interleave (its converter's `permute`) on rows `[heads * head_dim, ...]`."""
    rows = weight.shape[0]
    return weight.reshape(heads, 2, rows // heads // 2, *weight.shape[1:]).swapaxes(1, 2).reshape(weight.shape)


def convert(header: GgufHeader, out: Path) -> None:
    """Write the model directory for `header`'s file into `out` (loads MLX)."""
    import mlx.core as mx

    weights = mx.load(str(header.path), format="gguf")
    types = {t.name: t.type_name for t in header.tensors}
    converted: dict[str, Any] = {}
    quantized: dict[str, int] = {}  # layer path: bits
    meta = header.metadata
    for name, array in weights.items():
        source = name if name in types else name.rsplit(".", 1)[0] + ".weight"  # .scales and .biases
        if types.get(source) == "BF16":
            array = array.view(mx.bfloat16)  # MLX reads BF16 as float16's bits
        target = hf_name(name)
        if header.architecture == "llama" and (".attn_q." in name or ".attn_k." in name):
            kv = ".attn_k." in name
            heads = meta.get("llama.attention.head_count_kv" if kv else "llama.attention.head_count")
            array = unpermute(array, int(heads))
        converted[target] = array
        bits = READABLE.get(types.get(source, ""))
        if bits is not None:
            quantized[target.rsplit(".", 1)[0]] = bits
    vocab = int(weights["token_embd.weight"].shape[0])
    config = model_config(header, vocab, tied="output.weight" not in weights)
    if quantized:
        common = Counter(quantized.values()).most_common(1)[0][0]
        config["quantization"] = {"group_size": GROUP, "bits": common, "mode": "affine"}
        config["quantization"] |= {
            layer: {"group_size": GROUP, "bits": bits} for layer, bits in quantized.items() if bits != common
        }
    mx.save_safetensors(str(out / "model.safetensors"), converted, metadata={"format": "mlx"})
    (out / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    write_tokenizer(header, out)


def write_tokenizer(header: GgufHeader, out: Path) -> None:
    """tokenizer.json and tokenizer_config.json (and chat_template.jinja) from the metadata."""
    from transformers.integrations.gguf.gguf_tokenizer_mapping import convert_gguf_tokenizer

    meta = header.metadata
    renames = {"model": "tokenizer_type", "pre": "pre_tokenizer_type", "tokens": "tokens", "scores": "scores"}
    renames |= {"token_type": "token_type", "merges": "merges", "add_space_prefix": "add_prefix_space"}
    found = {name: meta[f"tokenizer.ggml.{key}"] for key, name in renames.items() if f"tokenizer.ggml.{key}" in meta}
    try:
        backend, _ = convert_gguf_tokenizer(header.architecture, found)
    except (ValueError, KeyError) as exc:
        raise refusal(header.path, f"its tokenizer cannot be built from the metadata ({exc})") from exc
    backend.save(str(out / "tokenizer.json"))
    tokens = meta["tokenizer.ggml.tokens"]
    config: dict[str, Any] = {"backend": "tokenizers", "tokenizer_class": "TokenizersBackend"}
    for name in ("bos", "eos", "unknown", "padding"):
        token = meta.get(f"tokenizer.ggml.{name}_token_id")
        if token is not None and 0 <= int(token) < len(tokens):
            config[{"unknown": "unk", "padding": "pad"}.get(name, name) + "_token"] = tokens[int(token)]
    for flag in ("add_bos_token", "add_eos_token"):
        if f"tokenizer.ggml.{flag}" in meta:
            config[flag] = bool(meta[f"tokenizer.ggml.{flag}"])
    (out / "tokenizer_config.json").write_text(json.dumps(config, indent=2) + "\n")
    if isinstance(meta.get("tokenizer.chat_template"), str):
        (out / "chat_template.jinja").write_text(meta["tokenizer.chat_template"])
