"""The one interface every drafter gives the round loop: take the prompt, propose, settle."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

import mlx.core as mx

from app.drafters.passes import DrafterPasses
from app.execution.steps import Steps
from app.sampling import Distribution

if TYPE_CHECKING:
    from app.acceptance import Verdict
    from app.drafters.kinds import DrafterKind
    from app.execution.target_taps import FeatureHook
    from app.sampling.state import RowState


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


class Proposer(Protocol):
    """One row's drafter, whatever its kind (draft model, prompt lookup, MTP, the DFlash family).

    `hook` names the target hidden states it conditions on (block drafters), or is None: the round
    loop runs every target forward of the row under it and hands the rows of the decided
    positions to `prefill` and `settle`, so a proposer never runs the target itself.
    """

    kind: DrafterKind  # the draft_kind reported in timings and events
    reports_distribution: bool  # can report q (needed by the stochastic rule)
    one_hot_proposals: bool  # deterministic proposals: q is one-hot on the draft
    draws_within_grammar: bool  # a constrained row's drafts come from rows the grammar already masked
    hook: FeatureHook | None
    passes: DrafterPasses  # how its drafting grows with the width, and what prices it (app/drafters/passes.py)

    def prefill(self, state: RowState, features: mx.array | None) -> bool:
        """Take in the prompt, once the target has decided the first token (`features`: the
        hook's rows of every prompt position); called again each tick until it returns True
        (a model drafter feeds one chunk per call)."""
        ...

    def prefilling(self, state: RowState, features: mx.array | None) -> Steps[bool]:
        """`prefill` as the forwards it asks for, so a batch can share a model drafter's chunks."""
        ...

    def propose(self, state: RowState, width: int) -> Proposal:
        """Up to `width` proposals continuing `state.tokens` (fewer, or none, is allowed)."""
        ...

    def proposing(self, state: RowState, width: int) -> Steps[Proposal]:
        """`propose` as the forwards it asks for, so a batch can share a model drafter's steps."""
        ...

    def settle(
        self, state: RowState, base: int, proposal: Proposal, verdict: Verdict | None, features: mx.array | None
    ) -> None:
        """After a step: `base` was len(state.tokens) before it; verdict is None for a plain
        step (nothing verified); `features` are the hook's rows of the positions now decided."""
        ...


class ProposesAtOnce:
    """For proposers that ask for no forward a batch could share (prompt lookup)."""

    def proposing(self, state: RowState, width: int) -> Steps[Proposal]:
        yield from ()
        return self.propose(state, width)

    def prefilling(self, state: RowState, features: mx.array | None) -> Steps[bool]:
        yield from ()
        return self.prefill(state, features)
