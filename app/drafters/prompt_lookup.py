"""Prompt lookup: propose what followed the latest earlier occurrence of the current suffix."""

from __future__ import annotations

from typing import TYPE_CHECKING

from app.drafters.base import Proposal, ProposesAtOnce
from app.drafters.kinds import DrafterKind
from app.drafters.ngram import NgramIndex
from app.drafters.passes import NO_PASSES

if TYPE_CHECKING:
    import mlx.core as mx

    from app.acceptance import Verdict
    from app.sampling.state import RowState

PROMPT_LOOKUP_WIDTH = 7  # proposals per round: the server's, and the CLI's default


class PromptLookupDrafter(ProposesAtOnce):
    """Deterministic proposals, so q is one-hot on each draft: sampler-match accepts at p(d),
    which is already the ceiling sum_x min(p, q), and the stochastic rule has nothing to add.
    """

    kind = DrafterKind.PROMPT_LOOKUP
    hook = None  # reads nothing of the target's forward
    passes = NO_PASSES  # a lookup in its own index: nothing to price
    reports_distribution = True
    one_hot_proposals = True
    draws_within_grammar = True  # no rows: a draft the grammar forbids is cut, an allowed one kept

    def __init__(self) -> None:
        self.index = NgramIndex()

    def prefill(self, state: RowState, features: mx.array | None) -> bool:
        self.index.extend(state.tokens)
        return True

    def propose(self, state: RowState, width: int) -> Proposal:
        """The width is the row's width policy's (prompt lookup's governor is one of its sources)."""
        return Proposal.of(self.index.lookup(width)) if width > 0 else Proposal.empty()

    def lookup(self, width: int) -> list[int]:
        """What the index proposes now (the governor's shadow lookups while it pauses)."""
        return self.index.lookup(width)

    def settle(
        self, state: RowState, base: int, proposal: Proposal, verdict: Verdict | None, features: mx.array | None
    ) -> None:
        self.index.extend(state.tokens[len(self.index) :])
