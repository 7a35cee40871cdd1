"""The verify step every speculative row runs, whatever its drafter.

One target forward over `[pending, d_1 .. d_k]` (pending: the decided token the target cache
does not hold yet), the rule of the row's plan over the k + 1 rows, the rejected rows rewound
from the target cache, then the row's state, its proposer (with the target's hidden states of
the decided rows, when it reads them) and its counters settled. The cache always holds every
decided token but the last.

`verifying` is one row's verify as a step that asks for its target forward, so the engine's tick
serves every row's in one batched pass (app/execution/steps.py `run_together`) and a lone row its
own (`run_alone`). A row whose proposer reads the target's hidden states (block drafters) asks for
its forward with its hook, and gets the hook's rows of its own positions with its logits, batched
or not (app/execution/forward.py).
"""

from __future__ import annotations

from dataclasses import dataclass

import mlx.core as mx

from app.acceptance import Rule, Verdict, rules
from app.decoding.outcome import ClosedForms
from app.decoding.speculation import Speculation
from app.drafters.base import Proposal, Proposer
from app.execution.runner import ModelRunner
from app.execution.steps import Evaluate, Forward, Steps
from app.sampling import Distribution, RowRng
from app.sampling.draws import Sample
from app.sampling.grammar import masked
from app.sampling.state import RowState
from app.sampling.streams import PositionKeys, position_keys, sampled_rows, xtc_coins

ARGMAX_RULES = {Rule.GREEDY_ARGMAX: rules.greedy_argmax, Rule.ARGMAX_AGAINST_ARGMAX: rules.argmax_against_argmax}


@dataclass
class VerifyRow:
    """One row's part of a verify step: its state, caches, proposer and this round's proposal."""

    state: RowState
    target: ModelRunner
    proposer: Proposer
    proposal: Proposal
    speculation: Speculation  # the rule to judge with, and whether to diagnose
    masks: mx.array | None = None  # the grammar's mask of each verify row [k+1, V], if constrained


@dataclass(frozen=True)
class Verified:
    """A verify's verdict, and the closed forms of its tested positions where diagnosed."""

    verdict: Verdict
    closed_forms: ClosedForms | None = None


def verifying(row: VerifyRow) -> Steps[Verified]:
    """One row's verify of its proposal (an empty one decides one token): its target forward asked
    for (with its proposer's hook, if any), judged, settled."""
    state, target, proposal, speculation = row.state, row.target, row.proposal, row.speculation
    base = len(state.tokens)
    inputs = mx.concatenate([mx.array(state.tokens[target.length :]), proposal.tokens])
    sampled = speculation.rule not in ARGMAX_RULES and not state.sampler.is_greedy
    request = Forward(target, inputs, hook=row.proposer.hook, sampled=sampled)
    logits = yield request
    features = request.features  # the hook's rows of these positions (none without a hook)
    rows = logits[-(proposal.k + 1) :]
    # The rule judges against the masked target rows; log-probabilities read the unmasked ones.
    logits = rows if row.masks is None else masked(rows, row.masks)
    verdict, p = yield from judging(speculation.rule, state, proposal, logits, row.masks)
    target.rewind(target.length - (base + verdict.accepted))
    state.settle(verdict.tokens, verdict.accepted, p)
    state.report(rows, verdict.tokens, p, row.masks)  # the target's rows, never the drafter's
    decided = features[0][:, : verdict.accepted + 1] if features else None
    row.proposer.settle(state, base, proposal, verdict, decided)
    if proposal.k and speculation.diagnose:
        closed_forms = _closed_forms(proposal, p, verdict, logits.shape[-1])
        yield Evaluate(closed_forms)
        return Verified(verdict, ClosedForms(*(tuple(form.tolist()) for form in closed_forms)))
    return Verified(verdict)


def judging(
    rule: Rule, state: RowState, proposal: Proposal, logits: mx.array, masks: mx.array | None = None
) -> Steps[tuple[Verdict, Distribution | None]]:
    """Apply `rule` to the verify rows `[k+1, V]` (`masks`: the grammar's, if constrained); also
    the target rows p where it built them. Every draw is the target stream's (app/sampling/streams.py).
    What a rule reads on the host is asked for as one evaluation (a tick evaluates every row's
    together); the rule itself is a pure function of those values, and the keys its verdict used
    are consumed here."""
    base, sampler = len(state.tokens), state.sampler
    if sampler.needs_context:  # each row reads its history as if the drafts before it were decided
        yield Evaluate((proposal.tokens,))  # the drafts on the host, read with every row's at once
        state.history.rewind(base)
        state.history.extend(proposal.tokens.tolist())
    contexts = state.contexts(range(base, base + proposal.k + 1))
    if rule in ARGMAX_RULES:
        argmax = sampler.greedy(logits, contexts)
        yield Evaluate((proposal.tokens, argmax))
        return ARGMAX_RULES[rule](proposal.tokens.tolist(), argmax.tolist()), None
    rows = proposal.k + 1
    # p (and its draws) asked for as a `Sample`: the tick's rows of like samplers share one pass
    if rule is Rule.STOCHASTIC and proposal.q is not None:
        coins = xtc_coins(state.rng, rows, sampler.uses_coin)
        _, p = yield Sample(logits, sampler, contexts, coins)
        return (yield from judging_stochastic(proposal.tokens, p, proposal.q, state.rng)), p
    keys = position_keys(state.rng, sampled_rows(masks, rows), sampler.uses_coin)
    drawn, p = yield Sample(logits, sampler, contexts, keys.coins, tuple(keys.draws))
    return (yield from judging_sampler_match(proposal.tokens, drawn, keys)), p


def judging_sampler_match(drafts: mx.array, drawn: mx.array, keys: PositionKeys) -> Steps[Verdict]:
    """Sampler-match over `drafts` `[k]` against the target's draws `drawn` `[k+1]` at `keys`, read
    in one evaluation, and the keys of the emitted positions consumed (target-only's, no more)."""
    yield Evaluate((drafts, drawn))
    verdict = rules.sampler_match(drafts.tolist(), drawn.tolist())
    keys.consume(len(verdict.tokens))
    return verdict


def judging_stochastic(drafts: mx.array, p: Distribution, q: Distribution, rng: RowRng) -> Steps[Verdict]:
    """The stochastic rule over `drafts` `[k]` (p `[k+1]`, q `[k]`): its uniforms, probabilities
    and every possible last draw read in one evaluation, and the keys the verdict used consumed."""
    draws = rules.rejection_draws(drafts, p, q, rng.peek(int(drafts.shape[0]) + 1))
    yield Evaluate((drafts, *draws.arrays))
    verdict = rules.modified_rejection(*(array.tolist() for array in (drafts, *draws.arrays)))
    rng.advance(verdict.tested + 1)
    return verdict


def _closed_forms(
    proposal: Proposal, p: Distribution | None, verdict: Verdict, vocab: int
) -> tuple[mx.array, mx.array, mx.array]:
    """Closed forms over the positions this round tested (one-hot rows where nothing is sampled),
    lazy: sum_min, sum_prod and the coupled chance per tested position."""
    tested = verdict.tested
    # Greedy p is one-hot on the argmax, which is the emitted token at every tested row.
    p = _one_hot(mx.array(verdict.tokens[:tested]), vocab) if p is None else p[:tested].dense()
    if proposal.q is not None:
        q, candidates = proposal.q[:tested].dense(), proposal.q.ids[:tested]
    else:
        q, candidates = _one_hot(proposal.tokens[:tested], vocab), proposal.tokens[:tested, None]
    return rules.sum_min(p, q), rules.sum_prod(p, q), rules.sum_coupled(p, q, candidates)


def _one_hot(tokens: mx.array, vocab: int) -> mx.array:
    return (mx.arange(vocab)[None, :] == tokens[:, None]).astype(mx.float32)
