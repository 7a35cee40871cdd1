"""Many rows' forwards through one model in one pass, each row on its own cache.

`forward_rows(runners, inputs)` gives, bit for bit, what `[r.forward(t) for r, t in
zip(runners, inputs)]` gives (a row's output never depends on its batch-mates), and leaves each
runner's cache and `length` as those calls would.

On the CPU a forward of a small model costs mostly per-op dispatch, so the rows' tokens are
flattened into one sequence `[1, N, H]` and everything that treats tokens independently runs once
for all rows: embedding, norms, projections, MLP, final norm, lm_head, and RoPE (each token at its
own row's position). That is exact because the shim's matrix kernel computes every output row with
the same code whatever the row count, up to `row_stable_rows()` rows (app/runtime/sgemm_rows.c;
1024, so a tick of up to the default `server.max_batch_tokens` positions is one pass); rows are
packed into groups of at most that many tokens. What depends on a row's cache (the cache update
and attention with mlx-lm's mask) runs per row, with the shapes of the row's solo forward.
Models of other architectures, caches other than KVCache, devices without the row-stable kernel,
and a tensor-parallel target (app/loading/lockstep.py) take the reference loop.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import mlx.core as mx
import mlx.nn as nn
from mlx_lm.models import llama, qwen3
from mlx_lm.models.base import scaled_dot_product_attention
from mlx_lm.models.cache import KVCache

from app.loading.runner import ModelRunner
from app.runtime.blas import row_stable_rows

Tokens = Sequence[int] | mx.array
Span = tuple[int, int]

# Architectures whose forward `_flat_forward` mirrors op for op (mlx-lm's qwen3.py and llama.py).
FLATTENABLE_MODELS = (qwen3.Model, llama.Model)
FLATTENABLE_BLOCKS = (qwen3.TransformerBlock, llama.TransformerBlock)


def forward_rows(runners: Sequence[ModelRunner], inputs: Sequence[Tokens]) -> list[mx.array]:
    """Logits `[len(inputs[i]), V]` for each row (lazy); all runners share one model."""
    if len(runners) != len(inputs):
        raise ValueError(f"{len(runners)} runners for {len(inputs)} rows of tokens")
    rows = [t.reshape(-1) if isinstance(t, mx.array) else mx.array(list(t), dtype=mx.int32) for t in inputs]
    limit = row_stable_rows() if runners and flattens(runners) else 0
    logits: list[mx.array] = []
    for group in _groups([int(t.size) for t in rows], limit):
        if len(group) == 1:
            logits.append(runners[group.start].forward(rows[group.start]))
        else:
            logits.extend(_flat_forward([runners[i] for i in group], [rows[i] for i in group]))
    return logits


def _groups(widths: list[int], limit: int) -> list[range]:
    """Consecutive rows packed while their tokens fit in `limit`; a row wider than that (or empty)
    goes alone. Keeping row order keeps the taps' records in the order solo forwards make them."""
    groups: list[range] = []
    start, total = 0, 0
    for i, width in enumerate(widths):
        alone = width == 0 or width > limit
        if i > start and (alone or total + width > limit):
            groups.append(range(start, i))
            start, total = i, 0
        total += width
        if alone:
            groups.append(range(i, i + 1))
            start, total = i + 1, 0
    if start < len(widths):
        groups.append(range(start, len(widths)))
    return groups


def _unwrap(module: nn.Module) -> nn.Module:
    """The module under a recording tap (app/drafters/target_taps.py), which only records."""
    return module.inner if getattr(module, "passes_through", False) else module


def _record(module: nn.Module, out: mx.array, spans: list[Span]) -> None:
    if getattr(module, "passes_through", False):
        module.record_rows(out, spans)


def flattens(runners: Sequence[ModelRunner]) -> bool:
    """Whether these rows run as one flattened forward (else: the reference loop)."""
    model = runners[0].model
    if mx.default_device() != mx.cpu or type(model) not in FLATTENABLE_MODELS:
        return False
    if runners[0].lockstep is not None:  # a sharded target: each row's forward is one order to the followers
        return False
    if any(r.model is not model or any(type(c) is not KVCache for c in r.cache) for r in runners):
        return False
    for layer in model.model.layers:
        block = _unwrap(layer)
        if type(block) not in FLATTENABLE_BLOCKS or getattr(block, "use_sliding", False):
            return False
        if type(block.self_attn.rope) is not nn.RoPE:
            return False
    return True


def _spans(widths: list[int]) -> list[Span]:
    spans, start = [], 0
    for width in widths:
        spans.append((start, start + width))
        start += width
    return spans


@dataclass(frozen=True)
class _LayerRows:
    """What one decoder layer needs per row: its tokens' span of the flat sequence, its cache,
    its attention mask, and (for all rows) each token's position."""

    spans: list[Span]
    caches: list[KVCache]
    masks: list[str | None]
    positions: mx.array


def _flat_forward(runners: list[ModelRunner], rows: list[mx.array]) -> list[mx.array]:
    model = runners[0].model
    inner = model.model
    spans = _spans([int(t.size) for t in rows])
    # As the model does, each row's mask comes from its first layer's cache before any update.
    masks = [
        r.cache[0].make_mask(b - a, return_array=False, window_size=None)
        for r, (a, b) in zip(runners, spans, strict=True)
    ]
    positions: dict[tuple[int, ...], mx.array] = {}
    h = inner.embed_tokens(mx.concatenate(rows).reshape(1, spans[-1][1]))
    for index, layer in enumerate(inner.layers):
        caches = [r.cache[index] for r in runners]
        offsets = tuple(c.offset for c in caches)
        if offsets not in positions:  # the same for every layer, unless a cache was rewound alone
            positions[offsets] = mx.array(
                [p for o, (a, b) in zip(offsets, spans, strict=True) for p in range(o, o + b - a)]
            )
        h = _block(_unwrap(layer), h, _LayerRows(spans, caches, masks, positions[offsets]))
        _record(layer, h, spans)
    out = _unwrap(inner.norm)(h)
    _record(inner.norm, out, spans)
    logits = inner.embed_tokens.as_linear(out) if model.args.tie_word_embeddings else model.lm_head(out)
    for runner, (a, b) in zip(runners, spans, strict=True):
        runner.length += b - a
    return [logits[0, a:b] for a, b in spans]


def _block(block: nn.Module, x: mx.array, rows: _LayerRows) -> mx.array:
    """One decoder block (mlx-lm's TransformerBlock.__call__) over the flattened rows."""
    h = x + _attention(block.self_attn, block.input_layernorm(x), rows)
    return h + block.mlp(block.post_attention_layernorm(h))


def _attention(attn: nn.Module, x: mx.array, rows: _LayerRows) -> mx.array:
    """mlx-lm's Attention.__call__ with every token as its own RoPE batch entry `[N, heads, 1, D]`
    (each at its row's position), then the cache update and attention per row `[1, heads, L, D]`
    (the shapes of the row's own forward)."""
    n = x.shape[1]
    queries, keys, values = attn.q_proj(x), attn.k_proj(x), attn.v_proj(x)
    queries = queries.reshape(1, n, attn.n_heads, -1)
    keys = keys.reshape(1, n, attn.n_kv_heads, -1)
    if hasattr(attn, "q_norm"):  # qwen3 normalises each head before RoPE
        queries, keys = attn.q_norm(queries), attn.k_norm(keys)
    queries = attn.rope(queries.reshape(n, attn.n_heads, 1, -1), offset=rows.positions)
    keys = attn.rope(keys.reshape(n, attn.n_kv_heads, 1, -1), offset=rows.positions)
    values = values.reshape(n, attn.n_kv_heads, 1, -1)
    outputs = []
    for cache, mask, (a, b) in zip(rows.caches, rows.masks, rows.spans, strict=True):
        row_keys, row_values = cache.update_and_fetch(
            keys[a:b].transpose(2, 1, 0, 3), values[a:b].transpose(2, 1, 0, 3)
        )
        row_queries = queries[a:b].transpose(2, 1, 0, 3)
        outputs.append(
            scaled_dot_product_attention(row_queries, row_keys, row_values, cache=cache, scale=attn.scale, mask=mask)
        )
    output = mx.concatenate(outputs, axis=2).transpose(0, 2, 1, 3).reshape(1, n, -1)
    return attn.o_proj(output)
