"""Round loops: target-only decoding, and verify rounds over any proposer's proposals.

Both satisfy `RoundLoop`; `Generation` drives either one and folds the `RoundOutcome` each step
returns into the row's stats (app/decoding/outcome.py): a loop keeps no counters and nothing
outside it reads its state. A step exists twice over one body: `steps` asks for its forwards
(the engine batches many rows' steps, app/execution/steps.py) and `step` serves them itself (a
lone row; the target-only loop then also pipelines).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Protocol

import mlx.core as mx

from app.acceptance import Rule
from app.decoding.outcome import RoundOutcome
from app.decoding.speculation import Speculation
from app.decoding.verify import VerifyRow, verifying
from app.decoding.width import OWN_WIDTH, WidthOffer, WidthPolicy
from app.drafters.base import Proposal, Proposer
from app.execution.runner import PREFILL_CHUNK, ModelRunner
from app.execution.steps import Evaluate, Forward, Steps, run_alone
from app.execution.target_taps import FeatureHook
from app.sampling.draws import sampling
from app.sampling.grammar import Constraint, masked
from app.sampling.state import RowState
from app.sampling.streams import sampled_rows


@dataclass
class Drafting:
    """What a speculative row drafts with: its proposer and its width policy."""

    proposer: Proposer
    widths: WidthPolicy


class RoundLoop(Protocol):
    """One row's decode: the prompt chunk by chunk, then one step (or verify round) at a time."""

    target: ModelRunner

    def prefill_chunk(self, state: RowState) -> int | None:
        """Feed one chunk of the prompt; once it is all in, decide the first token and return it."""
        ...

    def prefilling(self, state: RowState) -> Steps[int | None]:
        """`prefill_chunk` as the forwards it asks for, for a batch to serve (many rows' chunks in one tick)."""
        ...

    def step(self, state: RowState, budget: int) -> RoundOutcome:
        """Decide at least one and at most `budget` tokens."""
        ...

    def steps(self, state: RowState, budget: int, offer: WidthOffer = OWN_WIDTH) -> Steps[RoundOutcome]:
        """`step` as the forwards it asks for, for a batch to serve; `offer`: the tick's choice of
        the round's width (app/decoding/width.py), which a drafting row's round is decided within."""
        ...

    def positions(self, state: RowState) -> int:
        """Target positions the row's next tick forwards at most (its share of a tick's budget)."""
        ...


def sample_next(state: RowState, logits: mx.array, greedy: bool = False) -> Steps[int]:
    """The token after the prompt (or after the last decided one), from that position's logits
    `[1, V]`, masked by the grammar where the row is constrained; `greedy`: the argmax of the
    adjusted row whatever the sampler (the biased block rule's stream), drawing nothing. The
    token is read on the host with the tick's other rows' reads, in one wait."""
    mask = state.next_mask()
    row = logits if mask is None else masked(logits, mask)
    contexts = state.contexts([len(state.tokens)])
    if greedy:
        drawn, p = state.sampler.greedy(row, contexts)[:1], None
    else:
        forced = mask is not None and not sampled_rows(mask, 1)[0]
        drawn, p = yield from sampling(state.sampler, row, contexts, state.rng, forced)
    yield Evaluate((drawn,))
    token = int(drawn.item())
    state.decide([token], p)
    state.report(logits, [token], p, mask)
    return token


def decode_one(target: ModelRunner, state: RowState) -> Steps[list[int]]:
    """One plain decode step: forward the pending token, sample the next."""
    logits = (yield Forward(target, state.tokens[target.length :], sampled=not state.sampler.is_greedy))[-1:]
    return [(yield from sample_next(state, logits))]


def jump_forward(state: RowState, budget: int) -> list[int]:
    """Decide the tokens the grammar forces (the only one its mask allows), with no forward;
    the step goes on after them (leaving it at least one token of its budget).

    Exact: such a token has probability 1 under the masked target distribution whatever the
    sampler, and a forced position draws no key however it is decided (app/sampling/streams.py).
    Empty when nothing is forced, the row is not constrained, or it reports log-probabilities
    (each token's entries come from the target row it was decided at, so forced tokens are then
    decoded as usual).
    """
    if state.constraint is None or state.probs is not None:
        return []  # a jumped token has no target row to report log-probabilities from
    forced = state.constraint.forced(budget - 1)
    state.decide(forced)
    return forced


def ends_here(state: RowState) -> bool:
    """The grammar is complete and its EOS decided: the step must not go on."""
    return state.constraint is not None and state.constraint.ended


def within_grammar(constraint: Constraint, proposal: Proposal, renormalise: bool) -> Steps[tuple[Proposal, mx.array]]:
    """The proposal cut at its first draft the grammar forbids, and the masks of its verify rows;
    `renormalise`: the drafts came from unmasked rows q (block drafters). The drafts are read on
    the host with every row's of the tick, in one wait."""
    yield Evaluate((proposal.tokens,))
    walked, masks = constraint.walk(proposal.tokens.tolist())
    if walked < proposal.k:
        q = proposal.q[:walked] if proposal.q is not None else None
        proposal = Proposal(tokens=proposal.tokens[:walked], q=q)
    if renormalise and proposal.q is not None and proposal.k:
        # A draft survives only where the grammar allows it, so a surviving draft is distributed
        # as its row masked and renormalised: that is the q the stochastic rule must judge with.
        proposal = Proposal(tokens=proposal.tokens, q=proposal.q.within(masks[: proposal.k]))
    return proposal, masks


def positions(target: ModelRunner, state: RowState, proposals: int) -> int:
    """A prefill chunk, or the pending token and `proposals` drafts."""
    return min(PREFILL_CHUNK, max(1, len(state.tokens) - target.length) + proposals)


def prefill_target(
    target: ModelRunner, state: RowState, hook: FeatureHook | None = None, features: list[mx.array] | None = None
) -> Steps[mx.array | None]:
    """One chunk of the prompt through the target (with a block drafter's hook, whose rows of the
    chunk join `features`): the last position's logits `[1, V]` once the prompt is in, None while
    chunks remain (their keys and values are computed now, before the next chunk's is built)."""
    chunk, last = target.next_chunk(state.tokens)
    request = Forward(target, chunk, hook=hook)
    logits = yield request
    if features is not None:
        features.extend(request.features)
    if not last:
        target.evaluate()
        return None
    return logits[-1:]


def can_pipeline(state: RowState) -> bool:
    """Whether a row's plain step may queue the next one's forward before its token is read: not
    with log-probabilities asked for (each token's row is read with the token), nor for a
    constrained row (its next mask needs this step's token on the host first), nor where the
    sampler reads the host's history or a coin."""
    host_free = state.probs is None and state.constraint is None
    return not state.sampler.needs_context and not state.sampler.uses_coin and host_free


def decide_lazily(state: RowState, logits: mx.array, greedy: bool = False) -> Steps[mx.array]:
    """The token after the last of `logits`' rows, left on the device: the draw `sample_next`
    makes (the same key of the row's stream, its `Sample` served with the tick's others), without
    reading it; `greedy`: the adjusted row's argmax whatever the sampler, as `sample_next`'s."""
    if greedy:
        return state.sampler.greedy(logits[-1:])
    token, _ = yield from sampling(state.sampler, logits[-1:], None, state.rng)
    return token


@dataclass(frozen=True)
class Queued:
    """A plain step's forward sent a tick ahead: the step's token decided lazily on its logits, and
    the request, whose hook rows (a block drafter's) the tick that served it left in `features`."""

    token: mx.array
    request: Forward


def plain_step(
    target: ModelRunner,
    state: RowState,
    current: Queued | None,
    queue_next: bool,
    hook: FeatureHook | None = None,
    greedy: bool = False,
) -> Steps[tuple[int, mx.array | None, Queued | None]]:
    """One plain step of a row that `can_pipeline`: its forward, unless the step before queued it
    (`current`); `queue_next`: the next step's forward goes in this tick too, before this token is
    read, so it computes while the host reads and streams this one. Each forward carries `hook`
    (a block drafter's); `greedy`: each token is the adjusted row's argmax, as the biased block
    rule decides every position whatever the sampler. The token, the hook's rows of the position
    it was decided at (None without a hook: what the row's proposer is owed, as a verify of no
    drafts owes it), and the next step queued (None: not queued). Keys are drawn in the same order
    either way: the output does not depend on it."""
    if current is None:
        request = Forward(target, state.tokens[target.length :], hook=hook)
        current = Queued((yield from decide_lazily(state, (yield request), greedy)), request)
    ahead = None
    if queue_next:
        request = Forward(target, current.token, ahead=True, hook=hook)
        ahead = Queued((yield from decide_lazily(state, (yield request), greedy)), request)
    yield Evaluate((current.token,))  # every row's token of the tick in one wait
    token = int(current.token.item())
    state.decide([token])
    features = current.request.features
    return token, (features[0][:, :1] if features else None), ahead


class TargetLoop:
    """Target-only decoding: one forward and one sampler decision per step.

    When the sampler needs nothing from the host (no penalty windows, no XTC coin), each step
    also queues the next one before reading its own token (an `ahead` forward, whose input is
    this step's token still lazy), so the forward of token n+1 computes while the host reads and
    streams token n and builds the next tick: alone or in a batch, every pipelining row's next
    forward of a tick goes in one tick sent at once. Keys are drawn in the same order either
    way, so the output does not depend on it; the queued step is simply dropped when the row
    stops.
    """

    def __init__(self, target: ModelRunner) -> None:
        self.target = target
        self._ahead: Queued | None = None  # the next step, queued a tick ahead

    def prefill_chunk(self, state: RowState) -> int | None:
        return run_alone(self.prefilling(state))

    def prefilling(self, state: RowState) -> Steps[int | None]:
        logits = yield from prefill_target(self.target, state)
        return None if logits is None else (yield from sample_next(state, logits))

    def step(self, state: RowState, budget: int) -> RoundOutcome:
        return run_alone(self.steps(state, budget))

    def steps(self, state: RowState, budget: int, offer: WidthOffer = OWN_WIDTH) -> Steps[RoundOutcome]:
        forced = jump_forward(state, budget)
        if ends_here(state):
            return RoundOutcome(tuple(forced), jumped=len(forced))
        pipelined = can_pipeline(state)
        current, self._ahead = self._ahead, None
        if current is None and not pipelined:
            return RoundOutcome((*forced, *(yield from decode_one(self.target, state))), jumped=len(forced))
        token, _, self._ahead = yield from plain_step(self.target, state, current, pipelined and budget > 1)
        return RoundOutcome((token,))

    def positions(self, state: RowState) -> int:
        return positions(self.target, state, 0)


class SpeculativeLoop:
    """Propose the width policy's width, verify the proposals in one target forward, settle.

    Every drafter kind runs here; they differ only in their proposer and width source. A proposal
    shorter than the request's `n_min` is retracted: a proposer that reads nothing of the target
    then gets a plain decode step, one with a hook gets a verify of no proposals (its forward
    feeds the hook).

    A row the tick's choice holds at width 0, and expects to hold there next tick too
    (`WidthOffer.then_plain`), decodes as a target-only row does: its next step's forward is
    queued before this token is read (`plain_step`), so under load a drafting profile's plain
    rows lose nothing to target-only's. Only where that changes no token: load-free rows (their
    tokens are the target stream's at every width), a row that `can_pipeline`. A block drafter's
    rows queue their plain steps too: each forward carries the drafter's hook, and the row's
    proposer is owed the hook's row of each decided position, as a verify of no drafts owes it.
    The queued step is plain whatever the next tick offers (a release from the hold, or a probe,
    waits one tick).
    """

    def __init__(self, target: ModelRunner, drafting: Drafting, speculation: Speculation) -> None:
        target.require_rewindable("target")
        self.target = target
        self.proposer = drafting.proposer
        self.widths = drafting.widths
        self.speculation = speculation
        self._first: int | None = None  # the first token, decided before the proposer's prefill ends
        self._ahead: Queued | None = None  # the next plain step, queued a tick ahead
        self._prompt_features: list[mx.array] = []  # the hook's rows of the prefill chunks so far

    def prefill_chunk(self, state: RowState) -> int | None:
        return run_alone(self.prefilling(state))

    def prefilling(self, state: RowState) -> Steps[int | None]:
        """A chunk of the target's prefill, then (from the tick it decides) one of the proposer's."""
        if self._first is None:
            logits = yield from prefill_target(self.target, state, self.proposer.hook, self._prompt_features)
            if logits is None:
                return None
            # Under argmax-against-argmax every later token is the target's argmax, so the first
            # is too: the whole stream is the greedy one, not a sampled token and a greedy tail.
            greedy = self.speculation.rule is Rule.ARGMAX_AGAINST_ARGMAX
            self._first = yield from sample_next(state, logits, greedy=greedy)
        chunks = self._prompt_features
        if not (yield from self.proposer.prefilling(state, mx.concatenate(chunks, axis=1) if chunks else None)):
            return None
        self._prompt_features = []
        return self._first

    def step(self, state: RowState, budget: int) -> RoundOutcome:
        return run_alone(self.steps(state, budget))

    def steps(self, state: RowState, budget: int, offer: WidthOffer = OWN_WIDTH) -> Steps[RoundOutcome]:
        started = time.perf_counter()
        # Block drafters read the target's rows of every decided position: no jump-forward there.
        forced = jump_forward(state, budget) if self.proposer.hook is None else []
        if ends_here(state):
            self.proposer.settle(state, len(state.tokens), Proposal.empty(), None, None)
            notes = self.widths.observe(forced, 0, None, time.perf_counter() - started)
            return RoundOutcome(tuple(forced), jumped=len(forced), notes=notes)
        base = len(state.tokens)
        ahead, self._ahead = self._ahead, None  # queued by the step before: this one is plain
        width = self.widths.decide(budget - len(forced), 0 if ahead is not None else offer.limit, offer.price)
        queue_next = budget - len(forced) > 1 and self._pipelines(state, offer)
        if ahead is not None or (width == 0 and queue_next):
            greedy = self.speculation.rule is Rule.ARGMAX_AGAINST_ARGMAX  # its stream is the argmax one
            token, features, self._ahead = yield from plain_step(
                self.target, state, ahead, queue_next, self.proposer.hook, greedy
            )
            self.proposer.settle(state, base, Proposal.empty(), None, features)
            notes = self.widths.observe([*forced, token], 0, None, time.perf_counter() - started)
            return RoundOutcome((*forced, token), jumped=len(forced), width=0, notes=notes)
        proposal = (yield from self.proposer.proposing(state, width)) if width > 0 else Proposal.empty()
        masks = None
        if state.constraint is not None:
            renormalise = not self.proposer.draws_within_grammar
            proposal, masks = yield from within_grammar(state.constraint, proposal, renormalise)
        if self.widths.retracts(proposal.k):
            proposal, masks = Proposal.empty(), masks[:1] if masks is not None else None
            if self.proposer.hook is None:
                emitted = yield from decode_one(self.target, state)
                self.proposer.settle(state, base, proposal, None, None)
                notes = self.widths.observe(forced + emitted, 0, None, time.perf_counter() - started)
                return RoundOutcome((*forced, *emitted), jumped=len(forced), width=width, notes=notes)
        row = VerifyRow(state, self.target, self.proposer, proposal, self.speculation, masks)
        verified = yield from verifying(row)
        verdict, tokens = verified.verdict, forced + verified.verdict.tokens
        notes = self.widths.observe(tokens, proposal.k, verdict, time.perf_counter() - started)
        return RoundOutcome(
            tuple(tokens),
            jumped=len(forced),
            width=width,
            proposed=proposal.k,
            verdict=verdict,
            closed_forms=verified.closed_forms,
            notes=notes,
        )

    def positions(self, state: RowState) -> int:
        return positions(self.target, state, 0 if self._ahead is not None else self.widths.wanted())

    def _pipelines(self, state: RowState, offer: WidthOffer) -> bool:
        """Whether a plain round may queue the next one (the class docstring says when; the offer
        says `then_plain` to load-free rows only)."""
        return offer.then_plain and can_pipeline(state)
