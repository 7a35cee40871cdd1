"""The classic drafter: a small model sharing the target's tokenizer, with its own KV cache."""

from __future__ import annotations

from typing import TYPE_CHECKING

import mlx.core as mx

from app.drafters.base import Proposal
from app.drafters.kinds import DrafterKind
from app.drafters.passes import DrafterPasses, PassShape
from app.execution.runner import ModelRunner
from app.execution.steps import Evaluate, Forward, Steps, run_alone
from app.sampling import Distribution
from app.sampling.draws import Sample
from app.sampling.grammar import masked
from app.sampling.streams import draft_keys

if TYPE_CHECKING:
    from app.acceptance import Verdict
    from app.execution.model import LoadedModel
    from app.sampling.state import RowState


class DraftModelDrafter:
    """Drafts `width` tokens autoregressively through the request's own sampler pipeline.

    The cache holds a prefix of the decided tokens plus the drafts it has forwarded. Whatever of
    `state.tokens` it has not seen is *owed* and is fed at the head of the next proposal: after a
    fully accepted round that is the last draft (proposed but never forwarded) and the bonus.
    """

    kind = DrafterKind.DRAFT_MODEL
    hook = None  # reads nothing of the target's forward
    reports_distribution = True
    one_hot_proposals = False
    draws_within_grammar = True

    def __init__(self, drafter: LoadedModel, target_vocab_size: int, p_min: float = 0.0, coupled: bool = False) -> None:
        self.runner = ModelRunner(drafter.model)
        self.runner.require_rewindable("drafter")
        self.passes = DrafterPasses(PassShape.CHAIN, drafter.model)  # one forward per draft position
        self.target_vocab_size = target_vocab_size
        self.p_min = p_min
        self.coupled = coupled  # draws with the target's keys of its positions (app/sampling/streams.py)

    def owed(self, state: RowState) -> list[int]:
        """Decided tokens not yet in the drafter's cache, excluding the last one."""
        return state.tokens[self.runner.length : -1]

    def prefill(self, state: RowState, features: mx.array | None) -> bool:
        return run_alone(self.prefilling(state, features))

    def prefilling(self, state: RowState, features: mx.array | None) -> Steps[bool]:
        """One chunk of the prompt (every decided token but the last); True once all are in."""
        chunk, last = self.runner.next_chunk(state.tokens[:-1])
        if chunk:
            yield Forward(self.runner, chunk, drafting=True)
            self.runner.evaluate()
        return last

    def _fit(self, logits: mx.array) -> mx.array:
        """Align the drafter's output rows with the target's vocabulary (padding rows differ)."""
        width = logits.shape[-1]
        if width > self.target_vocab_size:
            return logits[:, : self.target_vocab_size]
        if width < self.target_vocab_size:
            pad = mx.full((logits.shape[0], self.target_vocab_size - width), -mx.inf, dtype=logits.dtype)
            return mx.concatenate([logits, pad], axis=-1)
        return logits

    def propose(self, state: RowState, width: int) -> Proposal:
        return run_alone(self.proposing(state, width))

    def proposing(self, state: RowState, width: int) -> Steps[Proposal]:
        """Draft step by step, each step's forward asked for (a batch serves every row's step j
        together); each step's keys are its position's (`draft_keys`: the target's, peeked, when
        coupled; else the row's drafter stream's), the same whoever serves the forwards."""
        sampler, constraint = state.sampler, state.constraint
        # Host values are only needed for penalty windows, the p_min cut or the grammar's next
        # mask; otherwise the whole chain stays lazy and is evaluated with the verify forward.
        needs_host = sampler.needs_context or self.p_min > 0.0 or constraint is not None
        base = len(state.tokens)
        sampled = not sampler.is_greedy  # each draft drawn through the request's sampler
        pending = state.tokens[self.runner.length :]
        logits = self._fit((yield Forward(self.runner, pending, drafting=True, sampled=sampled))[-1:])
        drafts: list[mx.array] = []
        rows: list[Distribution] = []
        followed, ended = 0, False  # drafts the grammar's matcher follows, rolled back at the end
        keys = draft_keys(state.rng, state.drafter_rng, width, sampler.uses_coin, self.coupled)
        for i in range(width):
            contexts = state.contexts([base + i])
            sampled = True  # the position draws (the grammar does not force it)
            if constraint is not None:  # q is the masked drafter row, as p is the masked target's
                allowed = constraint.allowed()
                sampled = int(allowed.sum()) != 1  # the verify row's mask here is this one
                logits = masked(logits, mx.array(allowed)[None, :])
            if sampler.is_greedy:
                adjusted = sampler.adjust(logits, contexts)
                draft = mx.argmax(adjusted, axis=-1).astype(mx.int32)
                q = Distribution.from_dense(mx.softmax(adjusted, axis=-1)) if self.p_min > 0.0 else None
            else:  # asked for as a `Sample`: the tick's rows of like samplers share one pass
                coin, key = keys.take(sampled)
                drawn, q = yield Sample(logits, sampler, contexts, coin, (key,))
                draft = drawn.astype(mx.int32)
            if needs_host:  # read with every row's draft of this step, in one wait
                likelihood = q.prob_of(draft) if q is not None and self.p_min > 0.0 else None
                yield Evaluate((draft,) if likelihood is None else (draft, likelihood))
                token = int(draft.item())
                if likelihood is not None and likelihood.item() < self.p_min:
                    break
                state.history.extend([token])
                if constraint is not None:
                    ended = not constraint.drafted(token)  # an EOS ends the chain
                    followed += not ended
            # else the draft stays lazy: whoever serves the pass queued its logits on the device
            # (run_together's `_drafted`, run_alone), and the argmax goes with the next pass
            drafts.append(draft)
            if q is not None and not sampler.is_greedy:
                rows.append(q)
            if ended:
                break
            if i + 1 < width:
                logits = self._fit((yield Forward(self.runner, draft, drafting=True, sampled=sampled))[-1:])
        state.history.rewind(base)
        if constraint is not None:
            constraint.rollback(followed)
        if not drafts:
            return Proposal.empty()
        return Proposal(tokens=mx.concatenate(drafts), q=Distribution.stack(rows) if rows else None)

    def settle(
        self, state: RowState, base: int, proposal: Proposal, verdict: Verdict | None, features: mx.array | None
    ) -> None:
        """Keep the accepted drafts the cache holds; the rejected ones are rewound."""
        accepted = verdict.accepted if verdict is not None else 0
        keep = min(self.runner.length, base + accepted)
        self.runner.rewind(self.runner.length - keep)
