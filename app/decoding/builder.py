"""The loop builder: made once from a profile (or CLI flags), it makes one round loop per request."""

from __future__ import annotations

import os
from dataclasses import dataclass

from app.acceptance import Rule, select_rule, stochastic_requested
from app.decoding.block_builder import BlockChoice, BlockLoops
from app.decoding.generation import Generation
from app.decoding.loop import SpeculativeLoop, TargetLoop
from app.decoding.runner import ModelRunner
from app.decoding.state import RowState
from app.drafters.base import Drafter
from app.drafters.draft_model import DraftModelDrafter
from app.drafters.governor import DEFAULT_FLOOR, Listener, make_governor
from app.drafters.prompt_lookup import PromptLookupDrafter
from app.loading import LoadedModel, ModelLoadError, check_vocab_agreement
from app.runtime.env import truthy
from app.sampling import RowRng, SamplerPipeline, SamplingParams
from app.sampling.rng import resolve_seed

DIAG_ENV = "MLXCEL_SPECULATIVE_ACCEPT_DIAG"
DEFAULT_CONTEXT = 4096


@dataclass(frozen=True)
class LoopSpec:
    """What the profile (or command line) says the round loop is."""

    drafter_kind: str = "none"
    num_draft_tokens: int = 4
    stochastic: bool | None = None  # None: read MLXCEL_SPECULATIVE_STOCHASTIC_ACCEPT
    max_kv_size: int | None = None
    governor_policy: str = "gated"  # the CLI token loop's; the server's profiles default to break-even
    governor_adaptive: bool = True
    governor_floor: float = DEFAULT_FLOOR
    drafter_model: str | None = None  # block drafters (mtp, dflash) load lazily from here
    adaptive_enabled: bool = True
    adaptive_max_width: int = 16
    block_size: int | None = None


@dataclass(frozen=True)
class RowRequest:
    """Per-request knobs the loop depends on."""

    prompt: list[int]
    sampling: SamplingParams
    max_tokens: int
    seed: int | None = None  # None or -1: random; others are taken modulo 2**64 (resolve_seed)
    stop: tuple[str, ...] = ()
    ignore_eos: bool = False
    n_max: int | None = None  # speculative.n_max: caps the width; 0 opts the request out
    n_min: int = 0  # speculative.n_min: fewer proposals than this are retracted unverified
    p_min: float = 0.0  # speculative.p_min: the draft model stops below this probability


class LoopBuilder:
    def __init__(self, target: LoadedModel, drafter: LoadedModel | None, spec: LoopSpec) -> None:
        if spec.drafter_kind == "draft-model":
            if drafter is None:
                raise ModelLoadError("drafter kind draft-model needs a drafter model (--draft-model)")
            check_vocab_agreement(target, drafter)
            ModelRunner(drafter.model).require_rewindable("drafter")
            ModelRunner(target.model).require_rewindable("target")
        self.target = target
        self.drafter = drafter
        self.spec = spec
        self.block: BlockLoops | None = None
        if spec.drafter_kind in ("mtp", "dflash"):
            if spec.drafter_model is None:
                raise ModelLoadError(f"drafter kind {spec.drafter_kind} needs a drafter model")
            ModelRunner(target.model).require_rewindable("target")
            self.block = BlockLoops(
                target, spec.drafter_model, spec.adaptive_enabled, spec.adaptive_max_width, spec.block_size
            )

    @property
    def context_limit(self) -> int:
        return int(self.target.config.get("max_position_embeddings") or DEFAULT_CONTEXT)

    def stochastic(self) -> bool:
        return stochastic_requested(self.spec.stochastic)

    def make_drafter(self, request: RowRequest, width: int, listener: Listener | None) -> Drafter | None:
        spec = self.spec
        if spec.drafter_kind == "draft-model" and self.drafter is not None:
            return DraftModelDrafter(self.drafter, self.target.vocab_size, p_min=request.p_min)
        if spec.drafter_kind == "prompt-lookup":
            governor = make_governor(
                width, policy=spec.governor_policy, adaptive=spec.governor_adaptive, floor=spec.governor_floor
            )
            governor.listener = listener
            return PromptLookupDrafter(governor)
        return None

    def rule_for(self, sampling: SamplingParams, drafter: Drafter) -> Rule:
        return select_rule(
            sampling,
            stochastic=self.stochastic(),
            reports_distribution=drafter.reports_distribution,
            one_hot_proposals=drafter.one_hot_proposals,
        )

    def build(self, request: RowRequest, governor_listener: Listener | None = None) -> Generation:
        state = RowState(
            tokens=list(request.prompt),
            sampler=SamplerPipeline(request.sampling, self.target.vocab_size),
            rng=RowRng(resolve_seed(request.seed)),
        )
        target = ModelRunner(self.target.model, max_kv_size=self.spec.max_kv_size)
        width = self.spec.num_draft_tokens if request.n_max is None else min(request.n_max, self.spec.num_draft_tokens)
        choice = BlockChoice(TargetLoop(target))
        if self.block is not None and request.n_max != 0:
            choice = self.block.choose(target, request.sampling, request.n_max)
        drafter = self.make_drafter(request, width, governor_listener) if width > 0 and self.block is None else None
        loop: TargetLoop
        if drafter is None:
            loop = choice.loop
        else:
            rule = self.rule_for(request.sampling, drafter)
            loop = SpeculativeLoop(
                target, drafter, rule, width, diagnose=truthy(os.environ.get(DIAG_ENV)), n_min=request.n_min
            )
        return Generation(
            loop=loop,
            state=state,
            tokenizer=self.target.tokenizer,
            max_tokens=request.max_tokens,
            context_limit=self.context_limit,
            stop=list(request.stop),
            ignore_eos=request.ignore_eos,
            notes=choice.notes,
            excluded_s=choice.setup_seconds,
        )
