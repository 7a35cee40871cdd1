"""Block drafters: MTP heads and the DFlash family (DFlash, DSpark, the Muse Glimmer assistant).

They condition on the target's hidden states and borrow its embedding and lm_head, so they are
loaded against a target (`BlockDrafterModel`), and one `*Drafter` per row keeps the row's own
drafter cache in step with the tokens the target decided.

A row drafts through passes the tick serves for every row in one call (app/drafters/block_rows.py).
The target's rows of the positions a round decides are owed to the drafter's cache and added at
the head of the row's next drafting pass, not in the round that decided them: a row the width
policy keeps at width 0 (it decodes plainly) pays nothing for its drafter, and a drafting row's
context rows ride its first pass. The prompt's rows go in as the prompt is prefilled.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import mlx.core as mx
from mlx_lm.models.cache import KVCache

from app.drafters.base import Proposal
from app.drafters.block_model import DFlashModel, DraftShape, MtpHead
from app.drafters.block_rows import DFlashPass, MtpPass
from app.drafters.kinds import DETECTED, DrafterKind
from app.drafters.passes import DrafterPasses, PassShape
from app.execution.device import backend
from app.execution.model import LoadedModel
from app.execution.pool import Layers
from app.execution.prepare import prepare
from app.execution.runner import chunk_end, copy_rows, restore_rows
from app.execution.steps import Steps, run_alone
from app.execution.target_taps import FINAL, FeatureHook, TargetTaps
from app.loading import CheckpointKind, ModelLoadError, read_checkpoint
from app.loading.pairing import require_pairing
from app.sampling import Distribution
from app.sampling.draws import Sample
from app.sampling.streams import DraftKeys, draft_keys

if TYPE_CHECKING:
    from app.acceptance import Verdict
    from app.sampling.state import RowState

MUSE_DECLARED_DEPTH = 4
MTP_DEFAULT_DEPTH = 3
OWED_PIECES = 16  # owed context pieces joined into one (and evaluated) beyond this many


@dataclass
class BlockDrafterModel:
    """A block drafter checkpoint bound to a target: the modules, their shape, and the style.

    `declared_width` is the verify width the drafter is built for (bonus row included): the
    DFlash block size, DSpark's proposals + 1, the Muse assistant's four rows, MTP depth + 1.
    """

    kind: CheckpointKind
    module: DFlashModel | MtpHead
    shape: DraftShape
    taps: TargetTaps
    declared_width: int
    max_width: int
    load_seconds: float
    path: Path

    @property
    def draft_kind(self) -> DrafterKind:
        return DETECTED[self.kind]

    @property
    def tap_names(self) -> list[int | str]:
        return [FINAL] if self.kind is CheckpointKind.MTP else list(self.shape.target_layer_ids)

    @property
    def hook(self) -> FeatureHook:
        return FeatureHook(self.taps, tuple(self.tap_names))


def declared_widths(kind: CheckpointKind, config: dict) -> tuple[int, int]:
    """(declared verify width, widest it is built for) from a drafter's config.json."""
    shape = DraftShape.from_config(config)
    if kind is CheckpointKind.MTP:
        depth = int((config.get("mtp_config") or {}).get("depth", MTP_DEFAULT_DEPTH))
        return depth + 1, depth + 1
    if kind is CheckpointKind.DSPARK:
        return shape.block_size + 1, shape.block_size + 1  # every DSpark slot is a proposal
    if kind is CheckpointKind.MUSE:
        return MUSE_DECLARED_DEPTH, shape.block_size
    return shape.block_size, shape.block_size


def load_block_drafter(path: str | Path, target: LoadedModel) -> BlockDrafterModel:
    """Load a block drafter checkpoint and bind it to the target's embedding and lm_head."""
    started = time.perf_counter()
    checkpoint = read_checkpoint(path)
    if checkpoint.is_standalone:
        raise ModelLoadError(f"{checkpoint.path} is a standalone model, not an MTP or DFlash-family drafter")
    config = checkpoint.config
    shape = DraftShape.from_config(config)
    taps = prepare(target.model, taps=True).taps
    if any(not 0 <= i < taps.num_layers for i in shape.target_layer_ids):
        raise ModelLoadError(f"{checkpoint.path}: target_layer_ids {shape.target_layer_ids} exceed the target's layers")
    require_pairing(target.checkpoint, checkpoint)
    module: DFlashModel | MtpHead
    if checkpoint.kind is CheckpointKind.MTP:
        module = MtpHead(shape, target.vocab_size)
    else:
        module = DFlashModel(shape, target.vocab_size)
    declared, ceiling = declared_widths(checkpoint.kind, config)
    weights = {}
    for file in sorted(checkpoint.path.glob("*.safetensors")):
        weights |= mx.load(str(file))
    try:
        module.load_weights(list(weights.items()), strict=True)
    except ValueError as exc:
        raise ModelLoadError(f"{checkpoint.path}: weights do not match its config.json: {exc}") from exc
    module.set_dtype(backend().module_dtype)
    mx.eval(module.parameters())
    return BlockDrafterModel(
        kind=checkpoint.kind, module=module, shape=shape, taps=taps, declared_width=declared,
        max_width=ceiling, load_seconds=time.perf_counter() - started, path=checkpoint.path,
    )  # fmt: skip


def prompt_chunks(start: int, end: int) -> Iterator[tuple[int, int]]:
    """Prompt positions [start, end) cut where the target's prefill cuts them, so a context row is
    computed in the same product (the same bits) whether its prompt's prefix was restored from the
    prompt cache or prefilled."""
    while start < end:
        stop = min(chunk_end(start), end)
        yield start, stop
        start = stop


@dataclass
class ContextRows:
    """A block drafter row's context caches, as the prompt cache reads and restores them
    (app/execution/prompt_cache.py `PrefixRows`)."""

    cache: list[KVCache]
    lookahead: int  # tokens past a row that it depends on (an MTP row pairs position i with token i + 1)

    @property
    def length(self) -> int:
        return int(self.cache[0].offset)

    @property
    def can_restore(self) -> bool:
        return True

    def rows(self, n: int) -> Layers:
        return copy_rows(self.cache, n)

    def restore(self, layers: Sequence[tuple[mx.array, mx.array]], n: int) -> None:
        restore_rows(self.cache, layers, n)


class BlockProposer:
    """What one row of any block drafter shares: the bound drafter, and how a row becomes a draft.

    A `sampled` drafter draws a sampling request's proposals from its rows under the request's
    sampler and reports those rows as q, so a lossless rule can judge them (`drafter.block_rule =
    "lossless"`; the Muse assistant samples under either rule, as the contract says). q is the
    sampler on the drafter's row without penalty windows, with its position's XTC coin: the rules
    need q to be what the draft was drawn from, not equal to p. Otherwise, and for greedy requests,
    a draft is its row's argmax and no q is reported. `coupled`: each draft draws with its
    position's keys of the target's stream (app/sampling/streams.py). `shares`: the row's passes
    may share a call that is not row-stable (its rule's tokens do not read its drafts'
    distribution; app/drafters/block_rows.py).
    """

    reports_distribution = True
    one_hot_proposals = False
    draws_within_grammar = False  # the loop renormalises q over the grammar's masks

    def __init__(
        self, bound: BlockDrafterModel, sampled: bool = False, coupled: bool = False, shares: bool = True
    ) -> None:
        self.bound = bound
        self.kind = bound.draft_kind
        self.hook = bound.hook
        self.sampled = sampled
        self.coupled = coupled
        self.shares = shares
        shape = PassShape.CHAIN if bound.kind is CheckpointKind.MTP else PassShape.BLOCK
        self.passes = DrafterPasses(shape, bound.module)
        self._owed: list[mx.array] = []  # target rows of decided positions not yet in the drafter's cache

    def keys(self, state: RowState, width: int) -> DraftKeys:
        """The keys of a proposal's `width` positions.

        A block drafter draws its whole proposal before the grammar walks it, so it cannot tell
        which positions the grammar will force: it takes every position as sampled. On a
        constrained row that is the target's layout up to the first forced position; past it each
        draft gets the keys of the target's next sampled position rather than its own, so it is
        not coupled (its noise is independent of its own position's target draw, as a drafter
        stream draw's is). Acceptance is all it costs: the target draws with its own keys.
        """
        return draft_keys(state.rng, state.drafter_rng, width, state.sampler.uses_coin, self.coupled)

    def pick(self, logits: mx.array, state: RowState, keys: DraftKeys) -> Steps[tuple[mx.array, Distribution | None]]:
        """One draft per row of `logits` `[R, V]` (lazy), each with its position's keys, and the
        rows q they were drawn from (asked for as a `Sample`: the tick's rows of like samplers
        share one pass)."""
        if not self.sampled or state.sampler.is_greedy:
            return mx.argmax(logits, axis=-1), None
        taken = [keys.take() for _ in range(logits.shape[0])]
        coins = mx.concatenate([coin for coin, _ in taken]) if state.sampler.uses_coin else None
        return (yield Sample(logits, state.sampler, None, coins, tuple(key for _, key in taken)))

    def propose(self, state: RowState, width: int) -> Proposal:
        return run_alone(self.proposing(state, width))

    def prefilling(self, state: RowState, features: mx.array | None) -> Steps[bool]:
        """The prompt's context rows go in at once: they ask for no pass a batch shares."""
        yield from ()
        return self.prefill(state, features)

    def owe(self, features: mx.array | None) -> None:
        """A round's decided rows, for the next drafting pass; many rounds' are joined (and
        evaluated) so a row that long decodes plainly holds one array, not each round's."""
        if features is None:
            return
        self._owed.append(features)
        if len(self._owed) > OWED_PIECES:
            self._owed = [mx.concatenate(self._owed, axis=1)]
            mx.async_eval(self._owed[0])

    def draws(self, state: RowState) -> bool:
        """Whether this row's drafts are drawn through its sampler (not its rows' argmax)."""
        return self.sampled and not state.sampler.is_greedy

    def take_owed(self) -> mx.array | None:
        owed, self._owed = self._owed, []
        return None if not owed else owed[0] if len(owed) == 1 else mx.concatenate(owed, axis=1)


def proposal_of(drafts: list[mx.array], rows: list[Distribution | None]) -> Proposal:
    q = Distribution.stack(rows) if rows and rows[0] is not None else None
    return Proposal(tokens=mx.concatenate(drafts).astype(mx.int32), q=q)


class DFlashDrafter(BlockProposer):
    """One row of a DFlash-family drafter: a context cache of target features, one masked forward
    per round over [anchor, mask x (width - 1)] with the context rows it owes.

    DFlash and the Muse assistant propose from rows 1.. (row k fills the token at anchor + k);
    DSpark proposes from every row (row j predicts anchor + j + 1) through its Markov chain, each
    row corrected by the previous draft.
    """

    def __init__(
        self, bound: BlockDrafterModel, sampled: bool = False, coupled: bool = False, shares: bool = True
    ) -> None:
        super().__init__(bound, sampled, coupled, shares)
        self.model: DFlashModel = bound.module
        self.caches = [KVCache() for _ in self.model.layers]
        self.context = ContextRows(self.caches, lookahead=0)

    def add_context(self, features: mx.array) -> None:
        self.model.add_context(features, self.caches)
        mx.async_eval([(cache.keys, cache.values) for cache in self.caches])  # cuts the graph, no wait

    def prefill(self, state: RowState, features: mx.array | None) -> bool:
        """The prompt positions past the rows the context holds (restored ones), chunk by chunk."""
        start = self.context.length
        for a, b in prompt_chunks(start, start + features.shape[1]):
            self.add_context(features[:, a - start : b - start])
        return True

    def proposing(self, state: RowState, width: int) -> Steps[Proposal]:
        """One masked forward anchored at the last decided token, the owed context rows first."""
        bound, shape = self.bound, self.bound.shape
        anchor, position = state.last, len(state.tokens) - 1
        dspark = bound.kind is CheckpointKind.DSPARK
        rows = width if dspark else width + 1
        block = mx.array([[anchor] + [shape.mask_token_id] * (rows - 1)])
        owed = self.take_owed()
        logits = yield DFlashPass(
            self.model, bound.taps, owed, block, self.caches, position, self.shares, self.draws(state)
        )
        keys = self.keys(state, width)
        if not dspark:
            drafts, q = yield from self.pick(logits[1:], state, keys)
            return proposal_of([drafts], [q])
        drafts, qs, previous = [], [], mx.array([anchor])
        for j in range(width):
            previous, q = yield from self.pick(logits[j : j + 1] + self.model.markov_bias(previous), state, keys)
            drafts.append(previous)
            qs.append(q)
        return proposal_of(drafts, qs)

    def settle(
        self, state: RowState, base: int, proposal: Proposal, verdict: Verdict | None, features: mx.array | None
    ) -> None:
        """The verify rows now decided (the anchor and the accepted drafts) are owed to the context."""
        self.owe(features)


class MtpDrafter(BlockProposer):
    """One row of an MTP head: its KV cache holds one entry per decided position; drafting
    chains the head on its own output and the embedding of its last proposal."""

    def __init__(
        self, bound: BlockDrafterModel, sampled: bool = False, coupled: bool = False, shares: bool = True
    ) -> None:
        super().__init__(bound, sampled, coupled, shares)
        self.head: MtpHead = bound.module
        self.cache = KVCache()
        self.context = ContextRows([self.cache], lookahead=1)
        self.last: mx.array | None = None  # head output at the last position the cache holds: predicts d0
        self.last_logits: mx.array | None = None  # the target's logits of it (the first draft's while nothing is owed)
        self._owed_tokens: list[int] = []  # the token after each owed row
        self.chained = 0

    def _pass(self, hidden: mx.array, embedded: mx.array, sampled: bool = False) -> MtpPass:
        return MtpPass(self.head, self.bound.taps, hidden, embedded, self.cache, self.shares, sampled)

    def _context(self, hidden: mx.array, next_tokens: list[int], sampled: bool = False) -> MtpPass:
        """Rows of (target hidden at i, token at i + 1) for decided positions."""
        return self._pass(hidden, self.bound.taps.embed_tokens(mx.array([next_tokens])), sampled)

    def prefill(self, state: RowState, features: mx.array | None) -> bool:
        """(hidden at i, token at i + 1) for the prompt positions past the rows the cache holds
        (restored ones), chunk by chunk; the first decided token pairs with the last position."""
        start = self.context.length
        for a, b in prompt_chunks(start, start + features.shape[1]):
            rows = self._context(features[:, a - start : b - start], state.tokens[a + 1 : b + 1])
            ((self.last, self.last_logits),) = MtpPass.serve([rows])
            mx.async_eval(self.last)  # each chunk's computed as the next is built, no wait
        return True

    def proposing(self, state: RowState, width: int) -> Steps[Proposal]:
        """Chain the head `width` times from its output at the last decided position (the owed
        rows' call gives it), each step on the embedding of the draft before it."""
        owed = self.take_owed()
        if owed is not None:
            tokens, self._owed_tokens = self._owed_tokens, []
            self.last, self.last_logits = yield self._context(owed, tokens, self.draws(state))
        out, logits = self.last, self.last_logits
        drafts, qs = [], []
        keys = self.keys(state, width)
        for step in range(width):
            if step:
                out, logits = yield self._pass(out, self.bound.taps.embed_tokens(drafts[-1][None]), self.draws(state))
            draft, q = yield from self.pick(logits, state, keys)
            drafts.append(draft)
            qs.append(q)
        self.chained = width - 1
        return proposal_of(drafts, qs)

    def settle(
        self, state: RowState, base: int, proposal: Proposal, verdict: Verdict | None, features: mx.array | None
    ) -> None:
        """Drop the chain's entries; (verify hidden, emitted token) of each decided row is owed."""
        if self.chained:
            self.cache.trim(self.chained)
            self.chained = 0
        if features is not None:
            self.owe(features)
            self._owed_tokens += state.tokens[base:]


def block_proposer(
    bound: BlockDrafterModel, lossless: bool = False, coupled: bool = False, shares: bool = True
) -> DFlashDrafter | MtpDrafter:
    """One row's proposer over a loaded block drafter; `lossless`: the plan runs the lossless
    rules, so sampled requests draw their proposals from q (the Muse assistant always does);
    `coupled`: with the target's keys of their positions; `shares`: as BlockProposer says."""
    sampled = lossless or bound.kind is CheckpointKind.MUSE
    drafter = MtpDrafter if bound.kind is CheckpointKind.MTP else DFlashDrafter
    return drafter(bound, sampled, coupled, shares)
