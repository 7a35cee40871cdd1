"""What every round loop reads and extends for one row."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

import mlx.core as mx

from app.sampling import RowRng, SamplerPipeline, TokenHistory
from app.sampling.grammar import Constraint, masked


@dataclass
class RowState:
    """Prompt plus decided tokens, the penalty history, the sampler and the row's key stream,
    and the grammar's matcher where the output is constrained (it follows the decided tokens)."""

    tokens: list[int]
    sampler: SamplerPipeline
    rng: RowRng
    constraint: Constraint | None = None
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
        if self.constraint is not None:
            self.constraint.consume(tokens)

    def constrained(self, logits: mx.array) -> mx.array:
        """The next position's logits `[1, V]` with what the grammar forbids there at -inf."""
        if self.constraint is None:
            return logits
        return masked(logits, mx.array(self.constraint.allowed())[None, :])

    def settle(self, emitted: list[int], accepted: int) -> None:
        """End a round: keep the accepted drafts, rewind the rejected ones, add the last token."""
        self.history.rewind(len(self.tokens) + accepted)
        self.history.extend(emitted[accepted:])
        self.tokens.extend(emitted)
        if self.constraint is not None:
            self.constraint.consume(emitted)
