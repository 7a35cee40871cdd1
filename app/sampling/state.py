"""What every round loop reads and extends for one row (below the drafters, which read it too)."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

import mlx.core as mx

from app.sampling import Distribution, RowRng, SamplerPipeline, TokenHistory
from app.sampling.grammar import Constraint, masked
from app.sampling.logprobs import ProbsRequest, TokenLogprob, token_logprobs
from app.sampling.streams import drafter_stream


@dataclass
class RowState:
    """Prompt plus decided tokens, the penalty history, the sampler and the row's two key streams
    (app/sampling/streams.py: `rng` the target sampler's, `drafter_rng` derived from its seed for
    every draw a drafter makes); the grammar's matcher where the output is constrained (it follows
    the decided tokens); with `probs`, the log-probabilities of the decided tokens in `reported`
    (one per token)."""

    tokens: list[int]
    sampler: SamplerPipeline
    rng: RowRng
    constraint: Constraint | None = None
    probs: ProbsRequest | None = None
    reported: list[TokenLogprob] = field(default_factory=list)
    history: TokenHistory = field(init=False)
    drafter_rng: RowRng = field(init=False)

    def __post_init__(self) -> None:
        self.history = TokenHistory(self.tokens)
        self.drafter_rng = drafter_stream(self.rng.seed)

    @property
    def last(self) -> int:
        return self.tokens[-1]

    def contexts(self, ends: Iterable[int]) -> list[list[int]] | None:
        """History windows ending at each position (None when no stage reads the history)."""
        if not self.sampler.needs_context:
            return None
        last_n = self.sampler.params.context_length
        return [self.history.window(last_n, end) for end in ends]

    def decide(self, tokens: list[int], p: Distribution | None = None) -> None:
        """Append decided tokens (no speculation involved), drawn from the rows p (None: greedy or forced)."""
        self.sampler.observe(p, tokens)
        self.tokens.extend(tokens)
        self.history.rewind(len(self.tokens) - len(tokens))
        self.history.extend(tokens)
        if self.constraint is not None:
            self.constraint.consume(tokens)

    def next_mask(self) -> mx.array | None:
        """The grammar's mask `[1, V]` of the next position (None: unconstrained)."""
        if self.constraint is None:
            return None
        return mx.array(self.constraint.allowed())[None, :]

    def settle(self, emitted: list[int], accepted: int, p: Distribution | None = None) -> None:
        """End a round: keep the accepted drafts, rewind the rejected ones, add the last token
        (p: the target rows the round judged with, None where the rule built none)."""
        self.sampler.observe(p, emitted)
        self.history.rewind(len(self.tokens) + accepted)
        self.history.extend(emitted[accepted:])
        self.tokens.extend(emitted)
        if self.constraint is not None:
            self.constraint.consume(emitted)

    def report(self, logits: mx.array, decided: list[int], p: Distribution | None, masks: mx.array | None) -> None:
        """After `decide` or `settle`: the log-probabilities of the tokens just decided, from the
        target rows `logits` they were decided at (and the sampler's rows p, where built).

        `masks` are the grammar's rows there (None: unconstrained). The model's distribution is
        reported unmasked, as llama-server does (its grammar is a sampler stage); the sampler's
        (`post_sampling`) is the masked one the token was drawn from.
        """
        if self.probs is None:
            return
        self.probs.check_room(len(self.reported) + len(decided))
        n, start = len(decided), len(self.tokens) - len(decided)
        rows = None if p is None else p[:n]
        logits = logits[:n]
        if self.probs.post_sampling and masks is not None:
            logits = masked(logits, masks[:n])
        contexts = self.contexts(range(start, start + n))
        self.reported += token_logprobs(self.probs, self.sampler, logits, decided, rows, contexts)
