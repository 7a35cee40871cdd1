"""Every forward of the project: rows in (a runner and the tokens to append to its cache), logits out.

`forward(rows)` gives, bit for bit, what `[row.runner.forward(row.tokens) for row in rows]` gives
(a row's output never depends on its batch-mates), and leaves each runner's cache and `length` as
those calls would. A tap open on the model (target_taps.py) records each row as its own forward
would, and a row with a block drafter's hook gets its own hidden states, so block-drafter rows
share the target's batched forward with every other row.

On the CPU a forward of a small model costs mostly per-op dispatch, so rows of one model share one
call of mlx-lm's own model: their tokens go in as a batch of N one-token sequences `[N, 1]`, and
everything that treats tokens independently (embedding, norms, projections, MLP, lm_head, RoPE)
runs once for all of them. That is exact because the shim's matrix kernel computes every output
row with the same code whatever the row count, up to `row_stable_rows()` rows
(app/runtime/sgemm_rows.c; 1024, so a tick of up to the default `server.max_batch_tokens`
positions is one pass); rows are packed into groups of at most that many tokens. What depends
on a row's cache runs per row with the shapes of its solo forward, through two objects of ours
that the model module is handed, as mlx-lm's own `BatchKVCache` is:

- each layer's cache is a `FlatRows`: its `offset` is every token's absolute position (RoPE takes
  a position per batch entry), `make_mask` asks each row's own cache of that layer for the mask
  the model would ask it for alone, and `update_and_fetch` appends each row's keys and values
  `[1, kv_heads, w, D]` to the row's own cache;
- the architecture module's `scaled_dot_product_attention` (mlx-lm's models import it from
  `mlx_lm.models.base` into their own namespace, so it can be replaced per module) is a dispatcher,
  installed on the first batched forward: for a `FlatRows` cache it runs mlx-lm's attention per row
  with the row's queries, keys, values and mask; for any other cache it is mlx-lm's function. On
  CUDA, where every row's own call would run the row-invariant kernel, one call of its many-row
  form serves up to 16 rows (each query walking its own row's keys exactly as its row's call
  would, so the bits are the same).

Only architectures whose forwards were checked to use the cache and the mask only that way batch
(`BATCHING_ARCHITECTURES`, each covered by tests/execution/test_forward.py); any other, a layer
that is not the architecture's own, a RoPE that computes with its offset, caches other than
KVCache and RotatingKVCache, a device without the row-stable kernel and a tensor-parallel target
(lockstep.py) run one forward per row. `batching()` says which, once, in the startup event.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field
from types import ModuleType

import mlx.core as mx
import mlx.nn as nn
from mlx_lm.models import rope_utils
from mlx_lm.models.cache import KVCache, RotatingKVCache

from app.execution import row_invariant
from app.execution.cost import cost_of
from app.execution.device import backend
from app.execution.lockstep import lockstep_of
from app.execution.runner import ModelRunner, Tokens
from app.execution.target_taps import FeatureHook, taps_of

Span = tuple[int, int]

# mlx-lm architecture modules (`mlx_lm.models.<name>`; Mistral checkpoints load as llama) whose
# forwards touch the cache and the mask only through `cache.offset` given to RoPE,
# `create_attention_mask`/`cache.make_mask`, `cache.update_and_fetch` and the module's
# `scaled_dot_product_attention`, and mix tokens nowhere else.
BATCHING_ARCHITECTURES = ("qwen3", "llama", "qwen2", "gemma3_text", "phi3")
# RoPE classes that hand their offset to `mx.fast.rope` untouched (it takes one per batch entry).
POSITIONWISE_ROPES = (nn.RoPE, rope_utils.SuScaledRoPE, rope_utils.Llama3RoPE, rope_utils.YarnRoPE)
ROW_CACHES = (KVCache, RotatingKVCache)
COVERAGE = "_mlxcel_row_invariant_coverage"  # where _uncovered keeps its verdict on a model


@dataclass(frozen=True)
class RowForward:
    """One row's forward: `tokens` appended to `runner`'s cache. With a `hook` (a block drafter's),
    the forward also leaves the hook's rows of these tokens `[1, w, F]` in `features`."""

    runner: ModelRunner
    tokens: Tokens
    hook: FeatureHook | None = None
    features: list[mx.array] = field(default_factory=list)


def forward(rows: Sequence[RowForward]) -> list[mx.array]:
    """Logits `[len(row.tokens), V]` for each row (lazy). Rows of several models may mix; only
    consecutive rows of one model share a pass."""
    if len(rows) == 1:  # nothing to share
        return [_solo_forward(rows[0], rows[0].tokens)]
    tokens = [_flat_tokens(row.tokens) for row in rows]
    logits: list[mx.array] = []
    for group in _groups(rows, [int(t.size) for t in tokens]):
        if len(group) == 1:
            logits.append(_solo_forward(rows[group.start], tokens[group.start]))
        else:
            logits.extend(_flat_forward([rows[i] for i in group], [tokens[i] for i in group]))
    return logits


def measured_forward(rows: Sequence[RowForward]) -> list[mx.array]:
    """`forward(rows)` of rows of one model, evaluated now, its seconds recorded against its
    positions in the model's `ForwardCost` (what the width policy reads). A batch's rows are
    judged on its logits straight after, so evaluating here costs the tick nothing."""
    started = time.perf_counter()
    logits = forward(rows)
    mx.eval(logits)
    positions = sum(int(logit.shape[0]) for logit in logits)
    cost_of(rows[0].runner.model).observe(positions, time.perf_counter() - started)
    return logits


def _solo_forward(row: RowForward, tokens: Tokens) -> mx.array:
    if row.hook is None:
        return row.runner.forward(tokens)
    with row.hook.capture() as features:
        logits = row.runner.forward(tokens)
    row.features.extend(features)
    return logits


def batching(model: nn.Module) -> str:
    """`rows` where this model's rows share forwards, else `per-row (why)`: for the startup event."""
    reason = _why_not_batched(model)
    return "rows" if reason is None else f"per-row ({reason})"


def _flat_tokens(tokens: Tokens) -> mx.array:
    return tokens.reshape(-1) if isinstance(tokens, mx.array) else mx.array(list(tokens), dtype=mx.int32)


def _groups(rows: Sequence[RowForward], widths: list[int]) -> list[range]:
    """Consecutive rows of one batching model packed while their tokens fit in `row_stable_rows()`;
    any other row goes alone. Keeping row order keeps the taps' records in the order solo forwards
    make them."""
    limit = backend().row_stable_rows
    verdicts: dict[int, bool] = {}  # per model: whether its rows batch

    def batches(runner: ModelRunner) -> bool:
        if id(runner.model) not in verdicts:
            verdicts[id(runner.model)] = _why_not_batched(runner.model) is None
        return verdicts[id(runner.model)] and _keeps_row_caches(runner)

    groups: list[range] = []
    start, total = 0, 0
    for i, (row, width) in enumerate(zip(rows, widths, strict=True)):
        model = row.runner.model
        alone = width == 0 or width > limit or not batches(row.runner)
        if i > start and (alone or total + width > limit or model is not rows[start].runner.model):
            groups.append(range(start, i))
            start, total = i, 0
        total += width
        if alone:
            groups.append(range(i, i + 1))
            start, total = i + 1, 0
    if start < len(rows):
        groups.append(range(start, len(rows)))
    return groups


def _keeps_row_caches(runner: ModelRunner) -> bool:
    return all(type(c) in ROW_CACHES for c in runner.cache)


def _unwrap(module: nn.Module) -> nn.Module:
    """The module under a recording tap (target_taps.py), which only records."""
    return module.inner if getattr(module, "passes_through", False) else module


def _why_not_batched(model: nn.Module) -> str | None:
    device = backend()
    if device.row_stable_rows == 0:
        return "matrix products on this device are not row-stable"
    if lockstep_of(model) is not None:
        return "a tensor-parallel target: each row's forward is one order to the followers"
    module = type(model).__module__
    name = module.rpartition(".")[2]
    if not module.startswith("mlx_lm.models.") or name not in BATCHING_ARCHITECTURES:
        return f"{module}.{type(model).__name__} is not one of the architectures checked to batch"
    for layer in model.model.layers:
        block = _unwrap(layer)
        if type(block).__module__ != module:
            return f"layer {type(block).__name__} is not {name}'s own"
        if not isinstance(block.self_attn.rope, POSITIONWISE_ROPES):
            return f"RoPE {type(block.self_attn.rope).__name__} computes with its offset"
    return _uncovered(model) if device.row_invariant_kernels else None


def _uncovered(model: nn.Module) -> str | None:
    """row_invariant.uncovered, walked once per model: the kernels are installed at load and a
    tick asks on every forward (a 24-layer model's walk costs about a millisecond)."""
    known = vars(model)  # the object's own attributes, not the module tree (a Module is a dict)
    if COVERAGE not in known:
        known[COVERAGE] = row_invariant.uncovered(model)
    return known[COVERAGE]


class RowMasks:
    """The rows' own masks, in row order, where the model holds one mask for its batch."""

    def __init__(self, masks: list[mx.array | str | None]) -> None:
        self.masks = masks


class RowGroups:
    """The batch's rows in groups of ROWS_PER_ATTENTION, each group's tokens told which of its rows
    they belong to and how many of their row's tokens follow them: what the rows' attention kernel
    reads (row_invariant.rows_attention). Made once per forward, on the first layer that asks."""

    def __init__(self, spans: list[Span]) -> None:
        self.spans = spans
        self._groups: list[tuple[range, Span, mx.array, mx.array]] | None = None

    def groups(self) -> list[tuple[range, Span, mx.array, mx.array]]:
        if self._groups is None:
            self._groups = []
            for first in range(0, len(self.spans), row_invariant.ROWS_PER_ATTENTION):
                rows = range(first, min(first + row_invariant.ROWS_PER_ATTENTION, len(self.spans)))
                spans = [self.spans[r] for r in rows]
                token_rows = [r - first for r, (a, b) in zip(rows, spans, strict=True) for _ in range(a, b)]
                tails = [b - 1 - t for a, b in spans for t in range(a, b)]
                tokens = (spans[0][0], spans[-1][1])
                self._groups.append((rows, tokens, mx.array(token_rows, dtype=mx.int32), mx.array(tails, mx.int32)))
        return self._groups


class FlatRows:
    """One decoder layer's cache for a flattened batch `[N, heads, 1, D]`: the rows' own caches of
    that layer, and the span of each row's tokens in the batch."""

    def __init__(self, caches: list[KVCache], rows: RowGroups, offset: mx.array) -> None:
        self.caches = caches
        self.rows = rows
        self.spans = rows.spans
        self.offset = offset  # each token's absolute position, for RoPE
        self._fetched: list[tuple[mx.array, mx.array]] = []

    def make_mask(self, n: int, window_size: int | None = None, return_array: bool = False) -> RowMasks:
        """Each row's mask, as its own cache of this layer gives it for the row's width."""
        assert n == 1, "a flattened batch holds one token per sequence"
        return RowMasks(
            [
                c.make_mask(b - a, window_size=window_size, return_array=return_array)
                for c, (a, b) in zip(self.caches, self.spans, strict=True)
            ]
        )

    def update_and_fetch(self, keys: mx.array, values: mx.array) -> tuple[None, None]:
        """Append each row's keys and values to its own cache; the attention reads them from here
        (nothing is handed back, so a model that attends other than through the dispatcher fails)."""
        keys, values = _as_sequence(keys), _as_sequence(values)  # one transpose, then a slice per row
        self._fetched = [
            c.update_and_fetch(keys[:, :, a:b], values[:, :, a:b])
            for c, (a, b) in zip(self.caches, self.spans, strict=True)
        ]
        return None, None

    def attend(
        self, attention: Callable[..., mx.array], queries: mx.array, scale: float, mask: object, sinks: object
    ) -> mx.array:
        """`attention` (mlx-lm's) per row with its solo shapes, back in the batch's layout."""
        if not isinstance(mask, RowMasks):
            raise TypeError(f"a flattened batch needs the rows' own masks, not {type(mask).__name__}")
        if self._one_call(queries, mask, sinks):
            outputs = [
                row_invariant.rows_attention(
                    queries[a:b], self._fetched[rows.start : rows.stop], token_rows, tails, scale
                )
                for rows, (a, b), token_rows, tails in self.rows.groups()
            ]
            return outputs[0] if len(outputs) == 1 else mx.concatenate(outputs, axis=0)
        outputs = [
            attention(_row(queries, a, b), keys, values, cache=cache, scale=scale, mask=row_mask, sinks=sinks)
            for cache, row_mask, (a, b), (keys, values) in zip(
                self.caches, mask.masks, self.spans, self._fetched, strict=True
            )
        ]
        return mx.concatenate([_row(out, 0, out.shape[2]) for out in outputs], axis=0)

    def _one_call(self, queries: mx.array, mask: RowMasks, sinks: object) -> bool:
        """Whether every row's own attention call would run the row kernel: then one kernel call
        per group of rows gives each query the same bits."""
        heads, head_dim = queries.shape[1], queries.shape[3]
        return all(
            row_invariant.takes((1, heads, b - a, head_dim), keys, cache, row_mask, sinks)
            for cache, row_mask, (a, b), (keys, _) in zip(
                self.caches, mask.masks, self.spans, self._fetched, strict=True
            )
        )


def _as_sequence(x: mx.array) -> mx.array:
    """A flattened batch `[N, heads, 1, D]` as one sequence `[1, heads, N, D]`."""
    return x.transpose(2, 1, 0, 3)


def _row(x: mx.array, start: int, end: int) -> mx.array:
    """Tokens [start, end) of a flattened batch `[N, heads, 1, D]` as one sequence `[1, heads, w, D]`
    (and back: the transpose is its own inverse)."""
    return x[start:end].transpose(2, 1, 0, 3)


def _install_row_attention(architecture: ModuleType) -> None:
    """Make the architecture's attention function the dispatcher (once per module)."""
    original = architecture.scaled_dot_product_attention
    if getattr(original, "flat_rows", False):
        return

    def attention(queries, keys, values, cache, scale, mask, sinks=None):  # noqa: ANN001, ANN202
        if isinstance(cache, FlatRows):
            return cache.attend(original, queries, scale, mask, sinks)
        return original(queries, keys, values, cache=cache, scale=scale, mask=mask, sinks=sinks)

    attention.flat_rows = True  # type: ignore[attr-defined]
    architecture.scaled_dot_product_attention = attention


def _flat_forward(rows: list[RowForward], tokens: list[mx.array]) -> list[mx.array]:
    runners = [row.runner for row in rows]
    model = runners[0].model
    _install_row_attention(sys.modules[type(model).__module__])
    spans, start = [], 0
    for row_tokens in tokens:
        spans.append((start, start + int(row_tokens.size)))
        start += int(row_tokens.size)
    positions: dict[tuple[int, ...], mx.array] = {}
    groups = RowGroups(spans)
    caches = []
    for index in range(len(runners[0].cache)):
        layer = [r.cache[index] for r in runners]
        offsets = tuple(c.offset for c in layer)
        if offsets not in positions:  # the same for every layer, unless a cache was rewound alone
            positions[offsets] = mx.array(
                [p for o, (a, b) in zip(offsets, spans, strict=True) for p in range(o, o + b - a)]
            )
        caches.append(FlatRows(layer, groups, positions[offsets]))
    with _taps_read(model, rows, spans), row_invariant.exact_forward():
        logits = model(mx.concatenate(tokens).reshape(start, 1), cache=caches)
    for runner, (a, b) in zip(runners, spans, strict=True):
        runner.length += b - a
    logits = logits.reshape(start, -1)
    return [logits[a:b] for a, b in spans]


@contextmanager
def _taps_read(model: nn.Module, rows: list[RowForward], spans: list[Span]) -> Iterator[None]:
    """The model's taps record each row's slice of the batch; a hooked row's features are its own
    slices of the taps its hook names, as its solo forward's capture would give them."""
    taps = taps_of(model)
    if taps is None:
        yield
        return
    names = list(dict.fromkeys(name for row in rows if row.hook is not None for name in row.hook.names))
    with taps.flattened(spans), taps.capture(names) if names else nullcontext({}) as seen:
        yield
    for i, row in enumerate(rows):
        if row.hook is not None:
            row.features.append(mx.concatenate([seen[name][i] for name in row.hook.names], axis=-1))
