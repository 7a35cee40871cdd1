"""Round loops: target-only decoding, and verify rounds over a drafter's proposals."""

from __future__ import annotations

import mlx.core as mx

from app.acceptance import (
    AcceptanceStats,
    Rule,
    Verdict,
    argmax_against_argmax,
    greedy_argmax,
    modified_rejection,
    sampler_match,
    sum_min,
    sum_prod,
)
from app.decoding.state import RowState
from app.drafters.base import Drafter, Proposal
from app.loading.runner import ModelRunner
from app.sampling import Distribution


class TargetLoop:
    """Target-only decoding: one forward and one sampler decision per step.

    When the sampler needs nothing from the host (no penalty windows, no XTC coin), each step
    also queues the next one before reading its own token, so the forward of token n+1 computes
    while the host streams token n. Keys are drawn in the same order either way, so the output
    does not depend on it; the queued step is simply dropped when the row stops.
    """

    draft_kind: str | None = None
    rule: Rule | None = None
    stats: AcceptanceStats | None = None

    def __init__(self, target: ModelRunner) -> None:
        self.target = target
        self._ahead: mx.array | None = None

    def prefill_chunk(self, state: RowState) -> int | None:
        """Feed one chunk of the prompt; on the last one decide the first token and return it."""
        logits = self.target.prefill_chunk(state.tokens)
        if logits is None:
            return None
        token, _ = state.sampler.sample(logits, state.contexts([len(state.tokens)]), state.rng)
        state.decide([token])
        return token

    def step(self, state: RowState, budget: int) -> list[int]:
        """Decide at least one and at most `budget` tokens."""
        if not self._can_pipeline(state):
            return self.decode_one(state)
        current = self._ahead if self._ahead is not None else self._decide_lazily(state, state.tokens[-1:])
        self._ahead = self._decide_lazily(state, current) if budget > 1 else None
        if self._ahead is not None:
            mx.async_eval(self._ahead)
        token = int(current.item())
        state.decide([token])
        return [token]

    def _can_pipeline(self, state: RowState) -> bool:
        params = state.sampler.params
        return not state.sampler.needs_context and params.xtc_probability == 0.0

    def _decide_lazily(self, state: RowState, inputs: mx.array | list[int]) -> mx.array:
        logits = self.target.forward(inputs)[-1:]
        if state.sampler.is_greedy:
            return state.sampler.greedy(logits)
        return state.sampler.distribution(logits).draw(state.rng.next_key())

    def decode_one(self, state: RowState) -> list[int]:
        logits = self.target.forward(state.tokens[self.target.length :])[-1:]
        token, _ = state.sampler.sample(logits, state.contexts([len(state.tokens)]), state.rng)
        state.decide([token])
        return [token]


class SpeculativeLoop(TargetLoop):
    """Draft k tokens, verify [last, d_1..d_k] in one target forward, let the rule decide, rewind.

    The target cache always holds every decided token but the last; after a round that emitted
    accepted + 1 tokens it is rewound by the k - accepted rejected rows.
    """

    def __init__(
        self, target: ModelRunner, drafter: Drafter, rule: Rule, width: int, diagnose: bool, n_min: int = 0
    ) -> None:
        super().__init__(target)
        self.target.require_rewindable("target")
        self.drafter = drafter
        self.draft_kind = drafter.kind
        self.rule = rule
        self.width = width
        self.diagnose = diagnose
        self.n_min = max(1, n_min)
        self.stats = AcceptanceStats()
        self._first: int | None = None  # the first token, decided before the drafter's prefill ends

    def prefill_chunk(self, state: RowState) -> int | None:
        """A chunk of the target's prefill, then (from the tick it decides) one of the drafter's."""
        if self._first is None:
            self._first = super().prefill_chunk(state)
            if self._first is None:
                return None
        return self._first if self.drafter.prefill(state) else None

    def step(self, state: RowState, budget: int) -> list[int]:
        """One verify round, or a plain decode step when there is nothing to verify."""
        base = len(state.tokens)
        k = min(self.width, budget - 1)
        proposal = self.drafter.propose(state, k) if k > 0 else Proposal.empty()
        if proposal.k < self.n_min:  # nothing (or too little) to verify: retract, decode plainly
            emitted = self.decode_one(state)
            self.drafter.settle(state, base, Proposal.empty(), None)
            return emitted
        logits = self.target.forward(mx.concatenate([mx.array(state.tokens[self.target.length :]), proposal.tokens]))
        verdict = self.judge(state, proposal, logits[-(proposal.k + 1) :])
        self.target.rewind(self.target.length - (base + verdict.accepted))
        state.settle(verdict.tokens, verdict.accepted)
        self.drafter.settle(state, base, proposal, verdict)
        self.stats.observe(proposal.k, verdict)
        return verdict.tokens

    def judge(self, state: RowState, proposal: Proposal, logits: mx.array) -> Verdict:
        """Apply the rule to the verify rows `[k+1, V]`."""
        base, sampler = len(state.tokens), state.sampler
        if sampler.needs_context:
            drafts = proposal.tokens.tolist()
            state.history.rewind(base)
            state.history.extend(drafts)
        contexts = state.contexts(range(base, base + proposal.k + 1))
        if self.rule in (Rule.GREEDY_ARGMAX, Rule.ARGMAX_AGAINST_ARGMAX):
            argmax = sampler.greedy(logits, contexts)
            mx.eval(proposal.tokens, argmax)
            rule = greedy_argmax if self.rule is Rule.GREEDY_ARGMAX else argmax_against_argmax
            verdict = rule(proposal.tokens.tolist(), argmax.tolist())
            p = None
        else:
            p = sampler.distribution(logits, contexts, state.rng)
            drafts = proposal.tokens.tolist()
            if self.rule is Rule.STOCHASTIC and proposal.q is not None:
                verdict = modified_rejection(drafts, p, proposal.q, state.rng)
            else:
                verdict = sampler_match(drafts, p, state.rng)
        if self.diagnose:
            self._diagnose(proposal, p, verdict, logits.shape[-1])
        return verdict

    def _diagnose(self, proposal: Proposal, p: Distribution | None, verdict: Verdict, vocab: int) -> None:
        """Closed forms over the positions this round tested (one-hot rows where nothing is sampled)."""
        tested = verdict.tested
        # Greedy p is one-hot on the argmax, which is the emitted token at every tested row.
        p = _one_hot(mx.array(verdict.tokens[:tested]), vocab) if p is None else p[:tested].dense()
        q = proposal.q[:tested].dense() if proposal.q is not None else _one_hot(proposal.tokens[:tested], vocab)
        self.stats.observe_closed_forms(sum_min(p, q).tolist(), sum_prod(p, q).tolist())


def _one_hot(tokens: mx.array, vocab: int) -> mx.array:
    return (mx.arange(vocab)[None, :] == tokens[:, None]).astype(mx.float32)
