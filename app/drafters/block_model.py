"""MLX modules of the block drafters: DFlash (with DSpark's Markov head) and MTP.

Weight names follow the published checkpoints (fact sheet `drafter-architectures.md`): a DFlash
drafter holds `fc`, `hidden_norm`, `layers.N.*` (Qwen3-style) and `norm`, and borrows the
target's embedding and lm_head; DSpark adds `markov_w1` / `markov_w2`; an MTP head holds `enorm`,
`hnorm`, `eh_proj`, one decoder layer `layer.*` and `norm`. `ops/models/train_block_drafters.py`
builds the same modules in torch; `ops/models/block_parity.py` checks both give the same outputs.

The server calls them for many rows at once (`rows`, app/drafters/block_rows.py): the rows' inputs
laid end to end through every product in one call, each row's attention over its own cache with
its own shapes, so where products are row-stable each row gets the bits of its own call.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import mlx.core as mx
import mlx.nn as nn
from mlx_lm.models.cache import KVCache
from mlx_lm.models.qwen3 import MLP, TransformerBlock
from mlx_lm.models.qwen3 import ModelArgs as Qwen3Args

from app.execution import row_invariant

Span = tuple[int, int]  # a row's [start, end) in rows laid end to end


@dataclass
class DraftShape:
    """The fields of a block drafter's config.json that shape its modules."""

    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    block_size: int = 8
    target_layer_ids: list[int] = field(default_factory=list)
    mask_token_id: int = 0
    markov_rank: int = 0

    @classmethod
    def from_config(cls, config: dict[str, Any]) -> DraftShape:
        inner = config.get("dflash_config") or config.get("mtp_config") or {}
        rope = config.get("rope_theta") or (config.get("rope_parameters") or {}).get("rope_theta", 10000.0)
        return cls(
            hidden_size=config["hidden_size"],
            intermediate_size=config["intermediate_size"],
            num_hidden_layers=config.get("num_hidden_layers", 1),
            num_attention_heads=config["num_attention_heads"],
            num_key_value_heads=config["num_key_value_heads"],
            head_dim=config.get("head_dim") or config["hidden_size"] // config["num_attention_heads"],
            rms_norm_eps=config.get("rms_norm_eps", 1e-6),
            rope_theta=float(rope),
            block_size=int(inner.get("block_size") or config.get("block_size") or 8),
            target_layer_ids=list(inner.get("target_layer_ids") or []),
            mask_token_id=int(inner.get("mask_token_id") or 0),
            markov_rank=int(config.get("markov_rank") or 0),
        )

    def qwen3_args(self, vocab_size: int) -> Qwen3Args:
        return Qwen3Args(
            model_type="qwen3",
            hidden_size=self.hidden_size,
            num_hidden_layers=1,
            intermediate_size=self.intermediate_size,
            num_attention_heads=self.num_attention_heads,
            rms_norm_eps=self.rms_norm_eps,
            vocab_size=vocab_size,
            num_key_value_heads=self.num_key_value_heads,
            max_position_embeddings=32768,
            rope_theta=self.rope_theta,
            head_dim=self.head_dim,
            tie_word_embeddings=True,
        )


class InjectedAttention(nn.Module):
    """Queries from the block rows; keys and values from the cached context rows and the block.

    Context rows are projected with the same k/v weights (k_norm included) from the drafter's
    context features, rotated at their absolute positions, and cached. No mask: the block sees
    every context row (all strictly before its anchor) and itself in both directions.
    """

    def __init__(self, shape: DraftShape) -> None:
        super().__init__()
        h, d = shape.hidden_size, shape.head_dim
        self.n_heads, self.n_kv_heads, self.scale = shape.num_attention_heads, shape.num_key_value_heads, d**-0.5
        self.q_proj = nn.Linear(h, self.n_heads * d, bias=False)
        self.k_proj = nn.Linear(h, self.n_kv_heads * d, bias=False)
        self.v_proj = nn.Linear(h, self.n_kv_heads * d, bias=False)
        self.o_proj = nn.Linear(self.n_heads * d, h, bias=False)
        self.q_norm = nn.RMSNorm(d, eps=shape.rms_norm_eps)
        self.k_norm = nn.RMSNorm(d, eps=shape.rms_norm_eps)
        self.rope = nn.RoPE(d, traditional=False, base=shape.rope_theta)

    def _heads(self, keys: mx.array, values: mx.array, offset: int) -> tuple[mx.array, mx.array]:
        """One row's projected keys and values `[1, n, kv * D]` as heads `[1, kv, n, D]`, normed and
        rotated at positions offset.."""
        b, n, _ = keys.shape
        keys = self.k_norm(keys.reshape(b, n, self.n_kv_heads, -1)).transpose(0, 2, 1, 3)
        values = values.reshape(b, n, self.n_kv_heads, -1).transpose(0, 2, 1, 3)
        return self.rope(keys, offset=offset), values

    def add_context(self, h_ctx: mx.array, caches: Sequence[KVCache], spans: Sequence[Span]) -> None:
        """Context rows of several rows `[1, S, H]` (row r's at `spans[r]`): projected in one
        product, appended to each row's cache at its own positions."""
        keys, values = self.k_proj(h_ctx), self.v_proj(h_ctx)
        for cache, (a, b) in zip(caches, spans, strict=True):
            cache.update_and_fetch(*self._heads(keys[:, a:b], values[:, a:b], cache.offset))

    def __call__(
        self, x: mx.array, caches: Sequence[KVCache], spans: Sequence[Span], offsets: Sequence[int]
    ) -> mx.array:
        """Block rows of several rows `[1, L, H]` (row r's at `spans[r]`, at positions offsets[r]..):
        the products over all of them at once, each row's attention over its own cache and block."""
        queries, keys, values = self.q_proj(x), self.k_proj(x), self.v_proj(x)
        outputs = []
        for cache, (a, b), offset in zip(caches, spans, offsets, strict=True):
            n = b - a
            row_queries = self.q_norm(queries[:, a:b].reshape(1, n, self.n_heads, -1)).transpose(0, 2, 1, 3)
            row_queries = self.rope(row_queries, offset=offset)
            row_keys, row_values = self._heads(keys[:, a:b], values[:, a:b], offset)
            if cache.offset:
                row_keys = mx.concatenate([cache.keys[..., : cache.offset, :], row_keys], axis=2)
                row_values = mx.concatenate([cache.values[..., : cache.offset, :], row_values], axis=2)
            out = row_invariant.attention(row_queries, row_keys, row_values, self.scale, causal=False)
            outputs.append(out.transpose(0, 2, 1, 3).reshape(1, n, -1))
        return self.o_proj(joined(outputs))


class DraftLayer(nn.Module):
    def __init__(self, shape: DraftShape) -> None:
        super().__init__()
        self.self_attn = InjectedAttention(shape)
        self.mlp = MLP(shape.hidden_size, shape.intermediate_size)
        self.input_layernorm = nn.RMSNorm(shape.hidden_size, eps=shape.rms_norm_eps)
        self.post_attention_layernorm = nn.RMSNorm(shape.hidden_size, eps=shape.rms_norm_eps)

    def __call__(
        self, x: mx.array, caches: Sequence[KVCache], spans: Sequence[Span], offsets: Sequence[int]
    ) -> mx.array:
        x = x + self.self_attn(self.input_layernorm(x), caches, spans, offsets)
        return x + self.mlp(self.post_attention_layernorm(x))


class DFlashModel(nn.Module):
    """fc + hidden_norm over the concatenated target features, N injected layers, final norm;
    with `markov_rank > 0` (DSpark) a rank-r Markov bias w2(w1[previous token])."""

    def __init__(self, shape: DraftShape, vocab_size: int) -> None:
        super().__init__()
        n_features = max(1, len(shape.target_layer_ids))
        self.fc = nn.Linear(n_features * shape.hidden_size, shape.hidden_size, bias=False)
        self.hidden_norm = nn.RMSNorm(shape.hidden_size, eps=shape.rms_norm_eps)
        self.layers = [DraftLayer(shape) for _ in range(shape.num_hidden_layers)]
        self.norm = nn.RMSNorm(shape.hidden_size, eps=shape.rms_norm_eps)
        if shape.markov_rank > 0:
            self.markov_w1 = nn.Embedding(vocab_size, shape.markov_rank)
            self.markov_w2 = nn.Linear(shape.markov_rank, vocab_size, bias=False)

    def add_context(self, features: mx.array, caches: list[KVCache]) -> None:
        """Append one row's target feature rows `[1, S, n_ids * H]` to every layer's context cache."""
        self.add_contexts(features, [caches], [(0, features.shape[1])])

    def add_contexts(self, features: mx.array, rows: Sequence[list[KVCache]], spans: Sequence[Span]) -> None:
        """Several rows' feature rows `[1, S, n_ids * H]` (row r's at `spans[r]`, appended to the
        layer caches `rows[r]`), every product over all of them at once."""
        h_ctx = self.hidden_norm(self.fc(features))
        for index, layer in enumerate(self.layers):
            layer.self_attn.add_context(h_ctx, [caches[index] for caches in rows], spans)

    def __call__(self, block: mx.array, caches: list[KVCache], offset: int) -> mx.array:
        """One row's block embeddings `[1, L, H]` at positions offset..offset+L-1; returns normed hidden."""
        return self.rows(block, [caches], [(0, block.shape[1])], [offset])

    def rows(
        self, block: mx.array, rows: Sequence[list[KVCache]], spans: Sequence[Span], offsets: Sequence[int]
    ) -> mx.array:
        """Several rows' blocks `[1, L, H]` (row r's at `spans[r]`, its layer caches `rows[r]`), as
        each row's own call would give them where the products are row-stable."""
        x = block
        for index, layer in enumerate(self.layers):
            x = layer(x, [caches[index] for caches in rows], spans, offsets)
        return self.norm(x)

    def markov_bias(self, previous: mx.array) -> mx.array:
        return self.markov_w2(self.markov_w1(previous))


class MtpHead(nn.Module):
    """One multi-token-prediction module: [enorm(embed(t+1)); hnorm(h_t)] -> eh_proj -> a causal
    decoder layer with its own KV cache -> norm -> the target's lm_head predicts t+2."""

    def __init__(self, shape: DraftShape, vocab_size: int) -> None:
        super().__init__()
        h = shape.hidden_size
        self.enorm = nn.RMSNorm(h, eps=shape.rms_norm_eps)
        self.hnorm = nn.RMSNorm(h, eps=shape.rms_norm_eps)
        self.eh_proj = nn.Linear(2 * h, h, bias=False)
        self.layer = TransformerBlock(shape.qwen3_args(vocab_size))
        self.norm = nn.RMSNorm(h, eps=shape.rms_norm_eps)

    def __call__(self, hidden: mx.array, embedded: mx.array, cache: KVCache, mask: mx.array | None = None) -> mx.array:
        """Rows of (target or previous-step hidden, embedding of the next token) -> output hidden.
        Causal over the rows unless `mask` says otherwise (chained training's, ops/models)."""
        x = self.eh_proj(mx.concatenate([self.enorm(embedded), self.hnorm(hidden)], axis=-1))
        if mask is None and x.shape[1] > 1:
            mask = "causal"
        with row_invariant.exact_forward():  # on the GPU, the wide calls skip MLX's slow fused attention
            return self.layer(x, mask, cache)

    def rows(self, hidden: mx.array, embedded: mx.array, caches: Sequence[KVCache], spans: Sequence[Span]) -> mx.array:
        """Several rows' calls at once: rows `[1, S, H]` (row r's at `spans[r]`, causal among
        themselves, appended to `caches[r]`); every product over all rows, each row's attention
        through the function its own call (`__call__`) uses, on its own cache, so each row gets
        its own call's output where the products are row-stable."""
        x = self.eh_proj(mx.concatenate([self.enorm(embedded), self.hnorm(hidden)], axis=-1))
        block, attention = self.layer, self.layer.self_attn
        attend = sys.modules[type(attention).__module__].scaled_dot_product_attention  # as the block's own call
        with row_invariant.exact_forward():
            h = block.input_layernorm(x)
            queries, keys, values = attention.q_proj(h), attention.k_proj(h), attention.v_proj(h)
            outputs = []
            for cache, (a, b) in zip(caches, spans, strict=True):
                n = b - a
                q = attention.q_norm(queries[:, a:b].reshape(1, n, attention.n_heads, -1)).transpose(0, 2, 1, 3)
                k = attention.k_norm(keys[:, a:b].reshape(1, n, attention.n_kv_heads, -1)).transpose(0, 2, 1, 3)
                v = values[:, a:b].reshape(1, n, attention.n_kv_heads, -1).transpose(0, 2, 1, 3)
                q, k = attention.rope(q, offset=cache.offset), attention.rope(k, offset=cache.offset)
                k, v = cache.update_and_fetch(k, v)
                out = attend(q, k, v, cache=cache, scale=attention.scale, mask="causal" if n > 1 else None)
                outputs.append(out.transpose(0, 2, 1, 3).reshape(1, n, -1))
            h = x + attention.o_proj(joined(outputs))
            return h + block.mlp(block.post_attention_layernorm(h))


def spans_of(lengths: Sequence[int]) -> list[Span]:
    """The [start, end) of each of consecutive pieces of these lengths."""
    spans, start = [], 0
    for length in lengths:
        spans.append((start, start + length))
        start += length
    return spans


def joined(rows: Sequence[mx.array]) -> mx.array:
    """Rows' pieces `[1, n_r, ...]` as one `[1, sum n_r, ...]` (one piece as it is)."""
    return rows[0] if len(rows) == 1 else mx.concatenate(list(rows), axis=1)
