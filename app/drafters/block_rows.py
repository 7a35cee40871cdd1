"""Block drafters' passes, many rows' in one call: an MTP head step, a DFlash-family block forward.

A row's pass carries its own inputs and caches; `serve` lays the rows' inputs end to end and runs
the drafter's products once for all of them, each row's attention over its own cache
(app/drafters/block_model.py `rows`). Where products are row-stable (the CPU's shim,
app/runtime/sgemm_rows.c) each row gets the bits its own call would give it. Elsewhere (the GPU,
where the drafters' own layers are MLX's products) the shared call may move a row's drafts by
rounding, which moves only how many are accepted for a row whose tokens do not depend on its
drafts (argmax rules, sampler-match); a row whose rule reads its drafts' distribution (the
stochastic rule) sets `shares = False` there and runs its passes alone.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar

import mlx.core as mx
from mlx_lm.models.cache import KVCache

from app.drafters.block_model import DFlashModel, MtpHead, joined, spans_of
from app.execution.device import backend
from app.execution.target_taps import TargetTaps


def row_stable() -> bool:
    """Whether a shared call gives every row its own call's bits on this device."""
    device = backend()
    return device.row_stable_rows > 0 and not device.gpu


def calls(passes: Sequence[MtpPass | DFlashPass]) -> list[list[int]]:
    """The passes' indices by call: all in one where products are row-stable, else those that
    may share in one and each other alone."""
    if row_stable():
        return [list(range(len(passes)))]
    shared = [i for i, p in enumerate(passes) if p.shares]
    return ([shared] if shared else []) + [[i] for i, p in enumerate(passes) if not p.shares]


def in_order(passes: Sequence[object], results: dict[int, object]) -> list[object]:
    return [results[i] for i in range(len(passes))]


@dataclass(frozen=True)
class MtpPass:
    """One row's MTP head call: rows of (hidden, embedding of the next token) `[1, w, H]` appended
    causally to its cache. Its result: the head's output at its last row `[1, 1, H]` and the
    target's logits there `[1, V]` (what the next draft is picked from)."""

    drafting: ClassVar[bool] = True
    head: MtpHead
    taps: TargetTaps
    hidden: mx.array
    embedded: mx.array
    cache: KVCache
    shares: bool = True
    sampled: bool = False  # the row's draft is drawn through its sampler (its cost is priced apart)

    @property
    def module(self) -> MtpHead:
        return self.head

    @property
    def positions(self) -> int:
        return int(self.hidden.shape[1])

    @staticmethod
    def serve(passes: Sequence[MtpPass]) -> list[object]:
        results: dict[int, object] = {}
        for call in calls(passes):
            rows = [passes[i] for i in call]
            head, taps = rows[0].head, rows[0].taps
            spans = spans_of([row.positions for row in rows])
            out = head.rows(joined([r.hidden for r in rows]), joined([r.embedded for r in rows]),
                            [r.cache for r in rows], spans)  # fmt: skip
            lasts = [out[:, b - 1 : b] for _, b in spans]
            logits = taps.lm_head(head.norm(joined(lasts)))[0]
            for r, (i, last) in enumerate(zip(call, lasts, strict=True)):
                results[i] = (last, logits[r : r + 1])
        return in_order(passes, results)


@dataclass(frozen=True)
class DFlashPass:
    """One row's DFlash-family round: the context rows it owes (target features `[1, c, F]`, or
    None) appended to its caches, then its block `[1, L]` (anchor and masks) forwarded at
    positions `position`... Its result: the target's logits of the block's rows `[L, V]`."""

    drafting: ClassVar[bool] = True
    model: DFlashModel
    taps: TargetTaps
    context: mx.array | None
    block: mx.array
    caches: list[KVCache]
    position: int
    shares: bool = True
    sampled: bool = False

    @property
    def module(self) -> DFlashModel:
        return self.model

    @property
    def positions(self) -> int:
        owed = 0 if self.context is None else int(self.context.shape[1])
        return owed + int(self.block.shape[1])

    @staticmethod
    def serve(passes: Sequence[DFlashPass]) -> list[object]:
        results: dict[int, object] = {}
        for call in calls(passes):
            rows = [passes[i] for i in call]
            model, taps = rows[0].model, rows[0].taps
            owing = [row for row in rows if row.context is not None]
            if owing:
                spans = spans_of([int(row.context.shape[1]) for row in owing])
                model.add_contexts(joined([row.context for row in owing]), [row.caches for row in owing], spans)
            spans = spans_of([int(row.block.shape[1]) for row in rows])
            blocks = taps.embed_tokens(mx.concatenate([row.block for row in rows], axis=1))
            hidden = model.rows(blocks, [row.caches for row in rows], spans, [row.position for row in rows])
            logits = taps.lm_head(hidden)[0]
            for i, (a, b) in zip(call, spans, strict=True):
                results[i] = logits[a:b]
        return in_order(passes, results)
