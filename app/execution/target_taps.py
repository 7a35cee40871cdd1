"""Reading hidden states out of a target's forward, for drafters that condition on them.

DFlash-family drafters read the outputs of chosen decoder layers; MTP heads read the final
hidden state (after the last norm, what the lm_head sees). The target's decoder layers and final
norm are wrapped in `Tap`s (by app/execution/prepare.py, once): the forward itself is untouched
(same ops, same bits), and a tap only hands its output on while a forward collects it.

A forward (app/execution/forward.py, app/execution/tick.py) collects the taps that an open
capture or a row's hook names (`collecting`), then delivers each row its own slices (`deliver`):
a tick may be compiled, so what a tap saw must leave the forward as its output, never as a side
effect. One engine thread runs all MLX work, so the open capture is plain state on the taps
object.
"""

from __future__ import annotations

import weakref
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import mlx.core as mx
import mlx.nn as nn

FINAL = "final"
Span = tuple[int, int]


class Tap(nn.Module):
    """A module whose output a forward may collect (its output is `inner`'s)."""

    def __init__(self, inner: nn.Module, name: int | str, taps: TargetTaps) -> None:
        super().__init__()
        self.inner = inner
        self._name = name
        self._taps = taps

    def __call__(self, *args: Any, **kwargs: Any) -> mx.array:
        out = self.inner(*args, **kwargs)
        self._taps.record(self._name, out)
        return out


class TargetTaps:
    """A target's taps: what an open `capture(names)` wants, and the taps' outputs of `layer index
    | "final"` a forward collected."""

    FINAL = FINAL

    def __init__(self, model: nn.Module) -> None:
        self.num_layers = len(model.model.layers)
        self.embed_tokens = model.model.embed_tokens
        # weakly: the model's prepared record (app/execution/prepare.py) holds these taps, and a
        # strong reference back would keep the model, its pool and its record alive for good
        self._model = weakref.ref(model)
        self._wanted: tuple[int | str, ...] = ()  # the open capture's names, in order
        self._seen: dict[int | str, list[mx.array]] = {}
        self._collected: dict[int | str, mx.array] | None = None

    @property
    def wanted(self) -> tuple[int | str, ...]:
        return self._wanted

    def record(self, name: int | str, value: mx.array) -> None:
        """A tap's output, kept while a forward collects it."""
        if self._collected is not None and name in self._collected:
            self._collected[name] = value

    @contextmanager
    def collecting(self, names: tuple[int | str, ...]) -> Iterator[dict[int | str, mx.array]]:
        """Within this block (one forward of the model), the named taps' outputs are kept."""
        self._collected = dict.fromkeys(names)
        collected = self._collected
        try:
            yield collected
        finally:
            self._collected = None

    def deliver(self, name: int | str, value: mx.array, spans: list[Span]) -> None:
        """A tap's output of a forward (`[N, 1, H]` of a tick, `[1, T, H]` of one row's own), cut at
        the rows' `spans` of its positions: each row's `[1, w, H]`, in row order, to the open
        capture that wants it."""
        if name not in self._wanted:
            return
        flat = value.reshape(-1, value.shape[-1])
        self._seen.setdefault(name, []).extend(flat[a:b][None] for a, b in spans)

    @contextmanager
    def capture(self, names: list[int | str]) -> Iterator[dict[int | str, list[mx.array]]]:
        """Everything the named taps output inside the block, per row in call order (a chunked
        prefill delivers once per chunk)."""
        self._wanted, self._seen = tuple(names), {}
        seen = self._seen
        try:
            yield seen
        finally:
            self._wanted = ()

    @staticmethod
    def rows(seen: dict[int | str, list[mx.array]], names: list[int | str]) -> mx.array:
        """The captured rows `[1, L, len(names) * H]`, features concatenated in `names` order."""
        return mx.concatenate([mx.concatenate(seen[name], axis=1) for name in names], axis=-1)

    def lm_head(self, hidden: mx.array) -> mx.array:
        """The target's output layer (tied embedding or its own head), for borrowing drafters."""
        model = self._model()
        if hasattr(model, "lm_head"):
            return model.lm_head(hidden)
        return self.embed_tokens.as_linear(hidden)


@dataclass(frozen=True)
class FeatureHook:
    """What a block drafter reads from each target forward of its row: the named taps' rows."""

    taps: TargetTaps
    names: tuple[int | str, ...]

    @contextmanager
    def capture(self) -> Iterator[list[mx.array]]:
        """Run one target forward inside; afterwards the list holds its rows `[1, L, F]`."""
        rows: list[mx.array] = []
        with self.taps.capture(list(self.names)) as seen:
            yield rows
        rows.append(TargetTaps.rows(seen, list(self.names)))
