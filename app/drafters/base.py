"""What a drafter gives the round loop: proposals, and the distribution each was drawn from."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

import mlx.core as mx

from app.sampling import Distribution

if TYPE_CHECKING:
    from app.acceptance import Verdict
    from app.decoding.state import RowState


@dataclass
class Proposal:
    """k drafted tokens and, where the drafter sampled them, the rows q they were drawn from."""

    tokens: mx.array  # [k] int32, possibly still lazy
    q: Distribution | None = None  # k rows the drafts were drawn from; None when greedy/not reported

    @property
    def k(self) -> int:
        return int(self.tokens.size)

    @classmethod
    def empty(cls) -> Proposal:
        return cls(tokens=mx.zeros((0,), dtype=mx.int32))

    @classmethod
    def of(cls, tokens: list[int]) -> Proposal:
        return cls(tokens=mx.array(tokens, dtype=mx.int32))


class Drafter(Protocol):
    """One row's drafter. `kind` is the draft_kind reported in timings and events."""

    kind: str
    reports_distribution: bool  # can report q (needed by the stochastic rule)
    one_hot_proposals: bool  # deterministic proposals: q is one-hot on the draft

    def prefill(self, state: RowState) -> bool:
        """Take in the prompt, once the target has decided the first token; called again each
        tick until it returns True (a model drafter feeds one chunk per call)."""

    def propose(self, state: RowState, k: int) -> Proposal:
        """Up to k proposals continuing `state.tokens` (fewer, or none, is allowed)."""
        ...

    def settle(self, state: RowState, base: int, proposal: Proposal, verdict: Verdict | None) -> None:
        """After a step: `base` was len(state.tokens) before it; verdict is None for a plain step."""
