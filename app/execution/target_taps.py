"""Reading hidden states out of a target's forward, for drafters that condition on them.

DFlash-family drafters read the outputs of chosen decoder layers; MTP heads read the final
hidden state (after the last norm, what the lm_head sees). `TargetTaps` wraps those modules of
an mlx-lm model in place: the forward itself is untouched (same ops, same bits), and a tap only
records while a capture is open. One engine thread runs all MLX work, so the open capture is
plain state on the taps object.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import mlx.core as mx
import mlx.nn as nn

FINAL = "final"


class _Tap(nn.Module):
    passes_through = True  # its output is `inner`'s (what app/execution/forward.py checks layers by)

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
    """Installed once per loaded target; `capture(names)` collects outputs of `layer index | "final"`."""

    def __init__(self, model: nn.Module) -> None:
        inner = model.model
        if not hasattr(inner, "layers") or not hasattr(inner, "norm"):
            raise ValueError(f"{type(model).__name__} has no model.layers and model.norm to read hidden states from")
        self._wanted: set[int | str] = set()
        self._seen: dict[int | str, mx.array] = {}
        self._spans: list[tuple[int, int]] | None = None  # a flattened batch's rows, while one runs
        for i, layer in enumerate(inner.layers):
            if not isinstance(layer, _Tap):
                inner.layers[i] = _Tap(layer, i, self)
        if not isinstance(inner.norm, _Tap):
            inner.norm = _Tap(inner.norm, FINAL, self)
        self.num_layers = len(inner.layers)
        self.embed_tokens = inner.embed_tokens
        self._model = model

    def record(self, name: int | str, value: mx.array) -> None:
        if name not in self._wanted:
            return
        if self._spans is None:
            self._seen.setdefault(name, []).append(value)
            return
        for start, end in self._spans:  # a flattened batch `[N, 1, H]`: each row as its own forward's `[1, w, H]`
            self._seen.setdefault(name, []).append(value[start:end].reshape(1, end - start, -1))

    @contextmanager
    def flattened(self, spans: list[tuple[int, int]]) -> Iterator[None]:
        """Within this block the model runs a flattened batch whose rows are these spans of it."""
        self._spans = spans
        try:
            yield
        finally:
            self._spans = None

    @contextmanager
    def capture(self, names: list[int | str]) -> Iterator[dict[int | str, list[mx.array]]]:
        """Everything the named modules output inside the block, in call order (a chunked
        prefill calls them once per chunk)."""
        self._wanted, self._seen = set(names), {}
        seen = self._seen
        try:
            yield seen
        finally:
            self._wanted = set()

    @staticmethod
    def rows(seen: dict[int | str, list[mx.array]], names: list[int | str]) -> mx.array:
        """The captured rows `[1, L, len(names) * H]`, features concatenated in `names` order."""
        return mx.concatenate([mx.concatenate(seen[name], axis=1) for name in names], axis=-1)

    def lm_head(self, hidden: mx.array) -> mx.array:
        """The target's output layer (tied embedding or its own head), for borrowing drafters."""
        if hasattr(self._model, "lm_head"):
            return self._model.lm_head(hidden)
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


def taps_of(model: nn.Module) -> TargetTaps | None:
    """The model's taps, if a drafter installed them."""
    return getattr(model, "_mlxcel_taps", None)


def taps_for(model: nn.Module) -> TargetTaps:
    """The model's taps, installing them on first use."""
    taps = taps_of(model)
    if taps is None:
        taps = TargetTaps(model)
        object.__setattr__(model, "_mlxcel_taps", taps)
    return taps
