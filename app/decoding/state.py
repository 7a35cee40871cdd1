"""What every round loop reads and extends for one row."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from app.sampling import RowRng, SamplerPipeline, TokenHistory


@dataclass
class RowState:
    """Prompt plus decided tokens, the penalty history, the sampler and the row's key stream."""

    tokens: list[int]
    sampler: SamplerPipeline
    rng: RowRng
    history: TokenHistory = field(init=False)

    def __post_init__(self) -> None:
        self.history = TokenHistory(self.tokens)

    @property
    def last(self) -> int:
        return self.tokens[-1]

    def contexts(self, ends: Iterable[int]) -> list[list[int]] | None:
        """Penalty windows ending at each history position (None when no penalty is active)."""
        if not self.sampler.needs_context:
            return None
        last_n = self.sampler.params.repeat_last_n
        return [self.history.window(last_n, end) for end in ends]

    def decide(self, tokens: list[int]) -> None:
        """Append decided tokens (no speculation involved)."""
        self.tokens.extend(tokens)
        self.history.rewind(len(self.tokens) - len(tokens))
        self.history.extend(tokens)

    def settle(self, emitted: list[int], accepted: int) -> None:
        """End a round: keep the accepted drafts, rewind the rejected ones, add the last token."""
        self.history.rewind(len(self.tokens) + accepted)
        self.history.extend(emitted[accepted:])
        self.tokens.extend(emitted)
