"""What speculation does for one row: the rule, the drafter kind, coupling, and whether to diagnose.

Fixed when the row is built and shared, read-only, by its round loop (which judges with the
rule) and its generation (which reports it); what the rounds did is in the row's `RowStats`
(app/decoding/outcome.py), folded from each round's outcome.
"""

from __future__ import annotations

from dataclasses import dataclass

from app.acceptance import Rule, describe
from app.drafters.kinds import DrafterKind


@dataclass(frozen=True)
class Speculation:
    rule: Rule | None = None  # None: no drafter runs for this row
    draft_kind: DrafterKind | None = None
    one_hot_proposals: bool = False
    diagnose: bool = False  # collect the closed forms (MLXCEL_SPECULATIVE_ACCEPT_DIAG)
    coupled: bool = False  # the drafts draw with the target's keys of their positions (LoopPlan.couples)

    @property
    def drafting(self) -> bool:
        return self.rule is not None

    @property
    def rule_name(self) -> str | None:
        """The rule's identifier as responses, headers and events name it (None: no drafter)."""
        return str(self.rule) if self.rule is not None else None

    @property
    def description(self) -> str:
        return describe(self.rule, one_hot_proposals=self.one_hot_proposals)

    def biased(self, greedy: bool) -> bool:
        """A rule that is exact only for argmax (argmax-against-argmax) served a sampling request:
        the stream followed the target's greedy path, not its distribution."""
        return self.rule is not None and not self.rule.lossless and not greedy
