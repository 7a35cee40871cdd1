"""The block round loop of MTP and DFlash-family drafters, and its exactness probe.

Each round the drafter proposes width - 1 tokens after the bonus token; the target verifies
[bonus, d0 ...] in one forward; the longest prefix where the target's argmax equals the draft
is accepted and the target's argmax at the divergence is emitted (argmax-against-argmax at every
temperature: exact greedy decoding at T = 0, the target's greedy stream, not a sample of p, above
it). The rejected rows are rewound from the target cache and the decided rows' hidden states join
the drafter's context.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import mlx.core as mx
import numpy as np

from app.acceptance import AcceptanceStats, Rule, argmax_against_argmax
from app.decoding.adaptive import WidthController
from app.decoding.loop import TargetLoop
from app.decoding.state import RowState
from app.drafters.block import BlockDrafterModel, DFlashDrafter, MtpDrafter
from app.drafters.target_taps import TargetTaps
from app.loading.runner import ModelRunner

PROBE_PROMPTS = ([11, 42, 7, 300, 19, 5, 88, 1024, 3, 64], [901, 17, 17, 4, 250, 6, 2047, 33, 512, 9, 12, 70])


@dataclass(frozen=True)
class ProbeVerdict:
    width: int
    exact: bool
    position: int | None = None  # first row (of the width-w forward) whose logits differ
    max_difference: float = 0.0


def probe_width(model: object, width: int) -> ProbeVerdict:
    """Logits of one width-w forward against w single-token steps from the same state, bit for bit."""
    for prompt in PROBE_PROMPTS:
        block, steps = ModelRunner(model), ModelRunner(model)
        mx.eval(block.prefill(prompt[:-1]), steps.prefill(prompt[:-1]))
        tokens = [prompt[-1], *((prompt[i % len(prompt)] + 1) for i in range(width - 1))]
        wide = np.array(block.forward(tokens))
        single = np.concatenate([np.array(steps.forward([t])) for t in tokens])
        if not np.array_equal(wide, single):
            differing = np.flatnonzero((wide != single).any(axis=-1))
            return ProbeVerdict(width, False, int(differing[0]), float(np.abs(wide - single).max()))
    return ProbeVerdict(width, True)


@dataclass
class ProbeCache:
    """Verdicts per (model, width), kept for the life of the process."""

    verdicts: dict[tuple[int, int], ProbeVerdict] = field(default_factory=dict)

    def check(self, model: object, width: int) -> ProbeVerdict:
        key = (id(model), width)
        if key not in self.verdicts:
            self.verdicts[key] = probe_width(model, width)
        return self.verdicts[key]


class BlockLoop(TargetLoop):
    """Verify rounds over an MTP or DFlash-family drafter's block of proposals."""

    rule = Rule.ARGMAX_AGAINST_ARGMAX

    def __init__(
        self, target: ModelRunner, bound: BlockDrafterModel, controller: WidthController, cap: int | None = None
    ) -> None:
        super().__init__(target)
        self.cap = cap  # speculative.n_max + 1: this request's widest verify
        self.target.require_rewindable("target")
        self.bound = bound
        self.taps: TargetTaps = bound.taps
        self.drafter = MtpDrafter(bound) if bound.draft_kind == "mtp" else DFlashDrafter(bound)
        self.draft_kind = bound.draft_kind
        self.controller = controller
        self.stats = AcceptanceStats()
        self.names = bound.tap_names
        self._prompt_features: dict[int | str, list[mx.array]] = {}  # captured by earlier prefill chunks

    def _forward(self, tokens: list[int] | mx.array) -> tuple[mx.array, mx.array]:
        """Target logits and the drafter's features for the same rows."""
        with self.taps.capture(self.names) as seen:
            logits = self.target.forward(tokens)
        return logits, TargetTaps.rows(seen, self.names)

    def prefill_chunk(self, state: RowState) -> int | None:
        """One chunk of the target's prefill; the drafter takes the whole prompt's features at
        once after the last chunk, as it would from an unchunked prefill."""
        prompt = list(state.tokens)
        with self.taps.capture(self.names) as seen:
            logits = self.target.prefill_chunk(prompt)
        for name, values in seen.items():
            self._prompt_features.setdefault(name, []).extend(values)
        if logits is None:
            return None
        features = TargetTaps.rows(self._prompt_features, self.names)
        self._prompt_features = {}
        token, _ = state.sampler.sample(logits, state.contexts([len(prompt)]), state.rng)
        state.decide([token])
        self._commit(features, [*prompt[1:], token])
        return token

    def _commit(self, features: mx.array, emitted: list[int]) -> None:
        self.drafter.commit(features, emitted)

    def step(self, state: RowState, budget: int) -> list[int]:
        started = time.perf_counter()
        width = min(self.controller.width(), budget, self.cap or budget)
        base = len(state.tokens)
        if width < 2:
            return self._plain(state)
        proposal = self.drafter.propose(state.last, base - 1, width - 1, state.sampler, state.rng)
        verify = mx.concatenate([mx.array([state.last]), proposal.tokens])
        logits, features = self._forward(verify)
        if state.sampler.needs_context:  # penalise each row as if the drafts before it were decided
            state.history.rewind(base)
            state.history.extend(proposal.tokens.tolist())
        argmax = state.sampler.greedy(logits, state.contexts(range(base, base + width)))
        mx.eval(proposal.tokens, argmax)
        verdict = argmax_against_argmax(proposal.tokens.tolist(), argmax.tolist())
        self.target.rewind(self.target.length - (base + verdict.accepted))
        state.settle(verdict.tokens, verdict.accepted)
        self._commit(features[:, : verdict.accepted + 1], verdict.tokens)
        self.stats.observe(proposal.k, verdict)
        self.controller.observe(len(verdict.tokens), time.perf_counter() - started)
        return verdict.tokens

    def _plain(self, state: RowState) -> list[int]:
        """A single-row verify (no proposals), keeping the drafter's context complete."""
        logits, features = self._forward([state.last])
        token = int(state.sampler.greedy(logits, state.contexts([len(state.tokens)]))[0].item())
        state.decide([token])
        self._commit(features, [token])
        return [token]
