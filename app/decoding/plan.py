"""The loop plan: what every request of this server runs, decided once at startup.

Built from `Settings` and the drafter checkpoint's config.json (read, not loaded), before any
model loads. It fixes the drafter kind, the widths, the rule for each sampler class and whether
its drafts are coupled, the governor, and the contract's environment switches (read once here:
the profile's `[env]` table wins over the process environment, and nothing is written back).
The loop builder, /props, /slots, the startup event and each response's `generation_settings`
read this one object.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum

from app.acceptance import Rule, select_rule
from app.drafters.block import BlockProposer, declared_widths
from app.drafters.draft_model import DraftModelDrafter
from app.drafters.governor import DEFAULT_FLOOR
from app.drafters.kinds import DrafterKind
from app.drafters.prompt_lookup import PROMPT_LOOKUP_WIDTH, PromptLookupDrafter
from app.loading import CheckpointKind, read_checkpoint
from app.profiles.schema import (
    ACCEPT_DIAG_ENV,
    ALLOW_INEXACT_ENV,
    DEFAULT_DRAFT_TOKENS,
    LOSSLESS_BLOCK_RULE,
    STOCHASTIC_ACCEPT_ENV,
    Settings,
)
from app.runtime.env import truthy
from app.sampling import SamplingParams

CLASSIC_DRAFTERS = {DrafterKind.DRAFT_MODEL: DraftModelDrafter, DrafterKind.PROMPT_LOOKUP: PromptLookupDrafter}


class SamplerClass(StrEnum):
    """What the rule depends on in a request's sampler: whether it draws at all."""

    ARGMAX = "argmax"  # temperature 0 or top_k 1
    SAMPLED = "sampled"

    @classmethod
    def of(cls, sampling: SamplingParams) -> SamplerClass:
        return cls.ARGMAX if sampling.is_greedy else cls.SAMPLED


@dataclass(frozen=True)
class Switches:
    """The contract's MLXCEL_* acceptance switches, as explicit values."""

    stochastic_accept: bool = False  # MLXCEL_SPECULATIVE_STOCHASTIC_ACCEPT: the stochastic rule when sampling
    accept_diag: bool = False  # MLXCEL_SPECULATIVE_ACCEPT_DIAG: per-position diagnostics in summaries
    allow_inexact: bool = False  # MLXCEL_MTP_ALLOW_INEXACT: serve block widths the exactness probe failed

    @classmethod
    def read(cls, overrides: Mapping[str, str] | None = None, environ: Mapping[str, str] | None = None) -> Switches:
        """The switches from the environment, a profile's `[env]` table (`overrides`) winning."""
        merged = {**(os.environ if environ is None else environ), **(overrides or {})}
        return cls(
            stochastic_accept=truthy(merged.get(STOCHASTIC_ACCEPT_ENV)),
            accept_diag=truthy(merged.get(ACCEPT_DIAG_ENV)),
            allow_inexact=truthy(merged.get(ALLOW_INEXACT_ENV)),
        )


@dataclass(frozen=True)
class LoopPlan:
    """One server's (or one CLI run's) round loop. `LoopPlan()` is target-only decoding."""

    drafter_kind: DrafterKind = DrafterKind.NONE
    num_draft_tokens: int = DEFAULT_DRAFT_TOKENS  # proposals per round of the classic kinds
    drafter_model: str | None = None  # block drafters load lazily from here
    block_widths: tuple[int, int] | None = None  # block loops: (declared, ceiling) verify width, bonus row included
    greedy_only: bool = False  # a block drafter that declines sampled requests (DSpark, biased rule only)
    block_lossless: bool = False  # block loops: the lossless rules (drafter.block_rule = "lossless")
    adaptive: bool = True  # block loops: the width controller may widen up to the ceiling
    under_load: bool = True  # the goodput choice may narrow the widths of rows that cannot depend on them
    governor_policy: str = "break-even"  # `governor.policy`: every profile's default (the CLI's too)
    governor_adaptive: bool = True
    governor_floor: float = DEFAULT_FLOOR
    max_kv_size: int | None = None
    exact: bool = True  # execution.exact: the batch-invariant kernels (False: MLX's own, the fast path)
    switches: Switches = Switches()
    coupled: bool = True  # speculative.coupled: sampler-match drafts draw with the target's keys
    rules: Mapping[SamplerClass, Rule | None] = field(init=False)
    couplings: Mapping[SamplerClass, bool] = field(init=False)

    def __post_init__(self) -> None:
        kind = DrafterKind(self.drafter_kind)
        object.__setattr__(self, "drafter_kind", kind)
        if kind.is_block_loop and self.block_widths is None:
            raise ValueError(f"a {kind} plan needs its block widths (use plan_from_settings)")
        object.__setattr__(self, "rules", {c: self._decide(c) for c in SamplerClass})
        object.__setattr__(self, "couplings", {c: self._couples(c) for c in SamplerClass})

    def _decide(self, sampler: SamplerClass) -> Rule | None:
        """The one place the rule is chosen (None: no drafter runs for this sampler class)."""
        kind = self.drafter_kind
        if kind is DrafterKind.NONE:
            return None
        if self.greedy_only and sampler is SamplerClass.SAMPLED:
            return None
        if kind.is_block_loop and not self.block_lossless:
            return Rule.ARGMAX_AGAINST_ARGMAX
        drafter = self._drafter
        return select_rule(
            sampler is SamplerClass.ARGMAX,
            stochastic=self.switches.stochastic_accept,
            reports_distribution=drafter.reports_distribution,
            one_hot_proposals=drafter.one_hot_proposals,
        )

    @property
    def _drafter(self) -> type:
        """The proposer class of a drafting plan; block drafters draw sampled proposals from their
        rows q and report them (app/drafters/block.py)."""
        kind = self.drafter_kind
        return BlockProposer if kind.is_block_loop else CLASSIC_DRAFTERS[kind]

    def _couples(self, sampler: SamplerClass) -> bool:
        """The one place coupling is decided: whether this class's drafts draw with the target's
        keys of their positions (app/sampling/streams.py). Only under sampler-match, where the
        target's own draw decides every emitted token: the stochastic rule needs drafts independent
        of its uniforms, argmax rules draw nothing on the target's side, and prompt lookup draws
        nothing at all."""
        sampler_match = self.rules[sampler] in (Rule.SAMPLER_MATCH, Rule.SAMPLER_MATCH_NO_Q)
        return self.coupled and sampler_match and not self._drafter.one_hot_proposals

    def rule(self, sampling: SamplingParams) -> Rule | None:
        return self.rules[SamplerClass.of(sampling)]

    def couples(self, sampling: SamplingParams) -> bool:
        return self.couplings[SamplerClass.of(sampling)]

    @property
    def width(self) -> int:
        """Proposals per round at the declared width (what llama-server calls speculative.n_max)."""
        if self.drafter_kind is DrafterKind.NONE:
            return 0
        if self.block_widths is not None:
            return self.block_widths[0] - 1
        return self.num_draft_tokens

    @property
    def n_max(self) -> int:
        """The most proposals a round may carry (a block loop's ceiling less its bonus row): the
        width cap of a request that sets no speculative.n_max (app/decoding/width.py row_n_max)."""
        if self.block_widths is not None and self.drafter_kind.is_block_loop:
            return self.block_widths[1] - 1
        return self.width


def block_plan(settings: Settings) -> tuple[tuple[int, int], bool]:
    """(declared, ceiling) verify widths, and whether the plan declines sampled requests (a DSpark
    drafter under argmax-against-argmax), from the drafter's config.json."""
    checkpoint = read_checkpoint(settings.drafter.model)
    declared, widest = declared_widths(checkpoint.kind, checkpoint.config)
    declared = settings.drafter.block_size or declared
    adaptive = settings.adaptive
    ceiling = max(declared, min(widest, adaptive.max_width)) if adaptive.enabled else declared
    lossless = settings.drafter.block_rule == LOSSLESS_BLOCK_RULE
    return (declared, ceiling), checkpoint.kind is CheckpointKind.DSPARK and not lossless


def plan_from_settings(settings: Settings, environ: Mapping[str, str] | None = None) -> LoopPlan:
    """The server's plan: read the environment once, the checkpoint's config, never a weight."""
    kind = DrafterKind(settings.drafter.kind)
    widths, greedy_only = block_plan(settings) if kind.is_block_loop else (None, False)
    return LoopPlan(
        drafter_kind=kind,
        num_draft_tokens=PROMPT_LOOKUP_WIDTH
        if kind is DrafterKind.PROMPT_LOOKUP
        else settings.drafter.num_draft_tokens,
        drafter_model=settings.drafter.model,
        block_widths=widths,
        greedy_only=greedy_only,
        block_lossless=settings.drafter.block_rule == LOSSLESS_BLOCK_RULE,
        adaptive=settings.adaptive.enabled,
        under_load=settings.adaptive.under_load,
        governor_policy=settings.governor.policy,
        governor_adaptive=settings.governor.adaptive,
        governor_floor=settings.governor.floor,
        exact=settings.execution.exact,
        switches=Switches.read(settings.env, environ),
        coupled=settings.speculative.coupled,
    )
