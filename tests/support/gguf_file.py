"""GGUF files written from the embedded target, as llama.cpp's converter lays one out (its tensor
names, its metadata keys, the tokenizer's vocabulary and merges as metadata), with `mx.save_gguf`."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import mlx.core as mx

from app.loading import EMBEDDED_TARGET

# Hugging Face layout to GGUF, llama.cpp's names (written out here, not taken from app/loading/gguf.py)
LAYER = {
    "input_layernorm": "attn_norm",
    "post_attention_layernorm": "ffn_norm",
    "self_attn.q_proj": "attn_q",
    "self_attn.k_proj": "attn_k",
    "self_attn.v_proj": "attn_v",
    "self_attn.o_proj": "attn_output",
    "self_attn.q_norm": "attn_q_norm",
    "self_attn.k_norm": "attn_k_norm",
    "mlp.gate_proj": "ffn_gate",
    "mlp.up_proj": "ffn_up",
    "mlp.down_proj": "ffn_down",
}
TOP = {"model.embed_tokens": "token_embd", "model.norm": "output_norm", "lm_head": "output"}


def gguf_name(name: str) -> str:
    stem, _, leaf = name.rpartition(".")
    if stem in TOP:
        return f"{TOP[stem]}.{leaf}"
    _, _, layer, rest = stem.split(".", 3)
    return f"blk.{layer}.{LAYER[rest]}.{leaf}"


def source_weights(source: Path = EMBEDDED_TARGET) -> dict[str, mx.array]:
    weights: dict[str, mx.array] = {}
    for file in sorted(source.glob("*.safetensors")):
        weights |= mx.load(str(file))
    return weights


def metadata(source: Path = EMBEDDED_TARGET) -> dict[str, object]:
    """llama.cpp's metadata for a qwen3 model and its byte-level BPE tokenizer."""
    config = json.loads((source / "config.json").read_text())
    tokenizer = json.loads((source / "tokenizer.json").read_text())
    vocab = tokenizer["model"]["vocab"] | {t["content"]: t["id"] for t in tokenizer["added_tokens"]}
    tokens = [token for token, _ in sorted(vocab.items(), key=lambda item: item[1])]
    special = {t["id"] for t in tokenizer["added_tokens"] if t["special"]}
    merges = [m if isinstance(m, str) else " ".join(m) for m in tokenizer["model"]["merges"]]

    def u32(value: int) -> mx.array:
        return mx.array(value, dtype=mx.uint32)

    def f32(value: float) -> mx.array:
        return mx.array(value, dtype=mx.float32)

    return {
        "general.architecture": "qwen3",
        "general.name": "mlxcel-embedded-target",
        "qwen3.context_length": u32(config["max_position_embeddings"]),
        "qwen3.embedding_length": u32(config["hidden_size"]),
        "qwen3.feed_forward_length": u32(config["intermediate_size"]),
        "qwen3.block_count": u32(config["num_hidden_layers"]),
        "qwen3.attention.head_count": u32(config["num_attention_heads"]),
        "qwen3.attention.head_count_kv": u32(config["num_key_value_heads"]),
        "qwen3.attention.key_length": u32(config["head_dim"]),
        "qwen3.attention.value_length": u32(config["head_dim"]),
        "qwen3.attention.layer_norm_rms_epsilon": f32(config["rms_norm_eps"]),
        "qwen3.rope.freq_base": f32(config["rope_parameters"]["rope_theta"]),
        "tokenizer.ggml.model": "gpt2",
        "tokenizer.ggml.pre": "gpt-2",
        "tokenizer.ggml.tokens": tokens,
        "tokenizer.ggml.token_type": mx.array([3 if i in special else 1 for i in range(len(tokens))], dtype=mx.int32),
        "tokenizer.ggml.merges": merges,
        "tokenizer.ggml.eos_token_id": u32(config["eos_token_id"][0]),
        "tokenizer.ggml.eot_token_id": u32(config["eos_token_id"][1]),
        "tokenizer.ggml.padding_token_id": u32(config["pad_token_id"]),
        "tokenizer.ggml.add_bos_token": mx.array(False),
        "tokenizer.chat_template": (source / "chat_template.jinja").read_text(),
    }


def write_gguf(out: Path, dtype: mx.Dtype = mx.float32, source: Path = EMBEDDED_TARGET) -> Path:
    """The embedded target as a GGUF file of `dtype` (float32 or float16) tensors."""
    weights = {gguf_name(name): array.astype(dtype) for name, array in source_weights(source).items()}
    out.parent.mkdir(parents=True, exist_ok=True)
    mx.save_gguf(str(out), weights, metadata(source))
    return out


def retype(path: Path, tensor: str, ggml_type: int, out: Path) -> Path:
    """A copy of the GGUF file at `path` whose tensor `tensor` says it is of `ggml_type` (its bytes unchanged)."""
    data = bytearray(path.read_bytes())
    name = tensor.encode()
    at = data.index(struct.pack("<Q", len(name)) + name) + 8 + len(name)
    dims = struct.unpack_from("<I", data, at)[0]
    struct.pack_into("<I", data, at + 4 + 8 * dims, ggml_type)
    out.write_bytes(bytes(data))
    return out
