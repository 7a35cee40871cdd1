"""One tick: every row's tokens of one pooled model through one call of mlx-lm's model module.

The rows' tokens go in as a batch of N one-token sequences `[N, 1]`: embedding, norms,
projections, MLP, final norm and lm_head run once for all of them, RoPE once with each token at
its row's position, and each layer writes every token's keys and values into the KV pool with one
scatter and attends once for all of them (app/execution/attention.py). What the tick needs to
know of the rows is a few small arrays made on the host: each token's id, position and slot
(and, for the CPU's and the stock kernels' attention, the rows' layout).

On CUDA the step is compiled (`mx.compile`), per shape bucket (`bucket`): the graph of a 24-layer model is
built in Python once per bucket and replayed after, so a tick costs the host a few array
conversions and the replay. Every tick of the model, a lone row's included, goes through the
same compiled step: a tick of N tokens runs at the next bucket, the tokens past N being padding
that writes and reads the pool's scratch slot only and whose outputs are dropped. Nothing of a
padding token reaches a real one (every product, norm and attention computes a token from its
own row of inputs), so a row's bits are the same in any bucket. On the CPU (no compilation:
MLX's CPU compiler builds C++ at run time) the tick runs unpadded and uncompiled.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from contextlib import nullcontext
from dataclasses import dataclass, field

import mlx.core as mx

from app.execution import row_invariant
from app.execution.attention import Attending, Placement, PoolLayer, RowGroup, RowLayout
from app.execution.device import backend
from app.execution.pool import SCRATCH
from app.execution.prepare import Prepared

Tokens = Sequence[int] | mx.array
KEY_STEP = 256  # the attended key length of a compiled tick's row layout, in these steps


@dataclass(frozen=True)
class TickRow:
    """One row's part of a tick: `tokens` written at positions `start ..` of `slot`."""

    slot: int
    start: int
    tokens: Tokens
    # the tokens' count, taken once: a tick's layout reads it some sixteen times a row (on a
    # 16-row tick, 0.4 ms of the host's time when it was a property)
    width: int = field(init=False)

    def __post_init__(self) -> None:
        width = int(self.tokens.size) if isinstance(self.tokens, mx.array) else len(self.tokens)
        object.__setattr__(self, "width", width)


@dataclass(frozen=True)
class TickResult:
    logits: mx.array  # [N, V], the rows' tokens in order
    taps: dict[int | str, mx.array]  # the collected taps' outputs [N, 1, H]


def compiled() -> bool:
    """Whether ticks are compiled and padded to their bucket (CUDA; see the module's docstring)."""
    return backend().row_invariant_kernels


def bucket(n: int) -> int:
    """The compiled size a tick of n tokens (or rows, or places) runs at: powers of two up to 16,
    then multiples of 8 up to 128 and of 64 past it. Padding tokens cost what real ones do in the
    row-invariant products (their work grows with the rows), so the steps are fine; each bucket
    is one trace, the first time it runs (the warm-up runs the usual ones)."""
    if n <= 16:
        return 1 << max(0, n - 1).bit_length()
    step = 8 if n <= 128 else 64
    return -(-n // step) * step


def run_tick(record: Prepared, rows: Sequence[TickRow], taps: tuple[int | str, ...]) -> TickResult:
    """The rows' logits (lazy) and the named taps' outputs; the pool holds their keys and values."""
    pool = record.pool()
    pool.reserve(max(row.start + row.width for row in rows))
    is_compiled = compiled()
    n = sum(row.width for row in rows)
    size = bucket(n) if is_compiled else n
    pad = size - n
    positions = [p for row in rows for p in range(row.start, row.start + row.width)]
    positions += [i % pool.capacity for i in range(pad)]
    slots = [row.slot for row in rows for _ in range(row.width)] + [SCRATCH] * pad
    inputs = [_token_ids(rows, pad), mx.array(positions, dtype=mx.int32), mx.array(slots, dtype=mx.int32)]
    attending = record.attending
    groups = 0
    if attending is not Attending.KERNEL:
        layout = _layout(rows, size, is_compiled)
        inputs += layout
        groups = (len(layout) - 1) // 4
    step = _step(record, attending, taps, is_compiled, groups)
    out = step(*inputs, *pool.state())
    layers = 2 * len(pool.shapes)
    pool.replace(out[1 : 1 + layers])
    collected = dict(zip(taps, out[1 + layers :], strict=True))
    if pad:
        return TickResult(out[0][:n], {name: value[:n] for name, value in collected.items()})
    return TickResult(out[0], collected)


def _token_ids(rows: Sequence[TickRow], pad: int) -> mx.array:
    """[N + pad] int32: host tokens in one array, lazy ones (sampled drafts) joined to them."""
    if all(not isinstance(row.tokens, mx.array) for row in rows):
        return mx.array([t for row in rows for t in row.tokens] + [0] * pad, dtype=mx.int32)
    parts = [
        row.tokens.reshape(-1).astype(mx.int32) if isinstance(row.tokens, mx.array) else mx.array(row.tokens, mx.int32)
        for row in rows
    ]
    if pad:
        parts.append(mx.zeros((pad,), dtype=mx.int32))
    return mx.concatenate(parts)


NARROW = 16  # rows this wide or narrower (decode steps, verify rounds) share a row group; prompt chunks another


def _layout(rows: Sequence[TickRow], size: int, compiled: bool) -> list[mx.array]:
    """The arrays of a `RowLayout`: per group of like widths, the rows' slots, each place's token
    and position, and the key positions attended; then each token's place (compiled: rows,
    widths and keys at bucket sizes)."""
    groups = [[i for i, row in enumerate(rows) if (row.width > NARROW) == wide] for wide in (False, True)]
    starts, first = [], 0
    for row in rows:
        starts.append(first)
        first += row.width
    arrays, back, base = [], [0] * size, 0
    for members in (group for group in groups if group):
        count = bucket(len(members)) if compiled else len(members)
        width = max(rows[i].width for i in members)
        width = bucket(width) if compiled else width
        keys = max(rows[i].start + rows[i].width for i in members)
        keys = -(-keys // KEY_STEP) * KEY_STEP if compiled else keys
        gather, positions = [], []
        for r, i in enumerate(members):
            row = rows[i]
            gather += [starts[i] + k for k in range(row.width)] + [starts[i]] * (width - row.width)
            positions += [row.start + k for k in range(row.width)] + [0] * (width - row.width)
            for k in range(row.width):
                back[starts[i] + k] = base + r * width + k
        gather += [0] * ((count - len(members)) * width)
        positions += [0] * ((count - len(members)) * width)
        slots = [rows[i].slot for i in members] + [SCRATCH] * (count - len(members))
        arrays += [
            mx.array(slots, dtype=mx.int32),
            mx.array(gather, dtype=mx.int32),
            mx.array(positions, dtype=mx.int32),
            mx.arange(keys, dtype=mx.int32),
        ]
        base += count * width
    return [*arrays, mx.array(back, dtype=mx.int32)]


def _step(
    record: Prepared, attending: Attending, taps: tuple[int | str, ...], compiled: bool, groups: int
) -> Callable[..., list[mx.array]]:
    """The tick's function of (token ids, positions, slots[, the layout's `groups` row groups and
    places], *pool state), made once per model, attention, taps collected and row groups;
    compiled where ticks are. It reaches the model through the record's weak reference: the record
    keeps the function, and a model held by its own record would never be freed."""
    key = (attending, taps, compiled, groups)
    if key in record.ticks:
        return record.ticks[key]
    exact = attending is not Attending.STOCK
    layered = attending is not Attending.KERNEL
    tapped = record.taps
    model_of = record.model

    def step(tokens: mx.array, positions: mx.array, slots: mx.array, *rest: mx.array) -> list[mx.array]:
        layout, state = None, rest
        if layered:
            arrays, state = rest[: 4 * groups + 1], rest[4 * groups + 1 :]
            row_groups = tuple(RowGroup(*arrays[4 * g : 4 * g + 4]) for g in range(groups))
            layout = RowLayout(row_groups, arrays[-1])
        placement = Placement(positions, slots, attending, layout)
        half = len(state) // 2
        layers = [PoolLayer(state[i], state[half + i], placement) for i in range(half)]
        collect = tapped.collecting(taps) if taps else nullcontext({})
        with row_invariant.exact_forward() if exact else nullcontext(), collect as seen:
            logits = model_of()(tokens[:, None], cache=layers)
        outputs = [logits.reshape(tokens.shape[0], -1)]
        outputs += [layer.keys for layer in layers] + [layer.values for layer in layers]
        return outputs + [seen[name] for name in taps]

    record.ticks[key] = mx.compile(step) if compiled else step
    return record.ticks[key]


def forward_rows(
    record: Prepared, rows: Sequence[TickRow], hooks: Sequence[tuple[int | str, ...]]
) -> tuple[list[mx.array], list[mx.array | None]]:
    """One tick of `rows` of the model: each row's logits `[w, V]` (lazy) and, for a row whose
    hook names taps, their outputs of its positions `[1, w, F]` (features joined in the hook's
    order); an open capture of the model's taps gets each row's slices, in row order, as the
    rows' own forwards would give them."""
    taps = record.taps
    wanted = taps.wanted if taps is not None else ()
    names = tuple(dict.fromkeys([*wanted, *(name for hook in hooks for name in hook)]))
    result = run_tick(record, rows, names)
    spans, start = [], 0
    for row in rows:
        spans.append((start, start + row.width))
        start += row.width
    for name in wanted:
        taps.deliver(name, result.taps[name], spans)
    logits = [result.logits[a:b] for a, b in spans]
    # each hook's taps joined once for the whole tick, every row its slice of them: one operation
    # per hook, not one per row (on a GPU each is a launch, on the CPU a task); the same values
    joined = {hook: _joined_taps(result.taps, hook) for hook in set(hooks) if hook}
    features = [joined[hook][:, a:b] if hook else None for hook, (a, b) in zip(hooks, spans, strict=True)]
    return logits, features


def _joined_taps(taps: dict[int | str, mx.array], hook: tuple[int | str, ...]) -> mx.array:
    """The tick's outputs of the taps `hook` names, joined in its order along the features `[1, T, F]`."""
    parts = [taps[name].reshape(1, taps[name].shape[0], -1) for name in hook]
    return parts[0] if len(parts) == 1 else mx.concatenate(parts, axis=-1)
