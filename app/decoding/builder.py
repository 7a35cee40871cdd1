"""The loop builder: made once from a profile (or CLI flags), it makes one round loop per request."""

from __future__ import annotations

from dataclasses import dataclass

from app.decoding.block_builder import BlockChoice, BlockLoops
from app.decoding.generation import Generation
from app.decoding.loop import SpeculativeLoop, TargetLoop
from app.decoding.plan import LoopPlan
from app.decoding.state import RowState
from app.drafters.base import Drafter
from app.drafters.draft_model import DraftModelDrafter
from app.drafters.governor import Listener, make_governor
from app.drafters.prompt_lookup import PromptLookupDrafter
from app.loading import LoadedModel, ModelLoadError, check_vocab_agreement
from app.loading.runner import ModelRunner
from app.sampling import RowRng, SamplerPipeline, SamplingParams
from app.sampling.rng import resolve_seed

DEFAULT_CONTEXT = 4096


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
    """Builds each request's loop as the plan says; it decides nothing the plan has decided."""

    def __init__(self, target: LoadedModel, drafter: LoadedModel | None, plan: LoopPlan) -> None:
        if plan.drafter_kind == "draft-model":
            if drafter is None:
                raise ModelLoadError("drafter kind draft-model needs a drafter model (--draft-model)")
            check_vocab_agreement(target, drafter)
            ModelRunner(drafter.model).require_rewindable("drafter")
            ModelRunner(target.model).require_rewindable("target")
        self.target = target
        self.drafter = drafter
        self.plan = plan
        self.block: BlockLoops | None = None
        if plan.drafter_kind.is_block_loop:
            if plan.drafter_model is None:
                raise ModelLoadError(f"drafter kind {plan.drafter_kind} needs a drafter model")
            ModelRunner(target.model).require_rewindable("target")
            self.block = BlockLoops(target, plan)

    @property
    def context_limit(self) -> int:
        return int(self.target.config.get("max_position_embeddings") or DEFAULT_CONTEXT)

    def make_drafter(self, request: RowRequest, width: int, listener: Listener | None) -> Drafter | None:
        plan = self.plan
        if plan.drafter_kind == "draft-model" and self.drafter is not None:
            return DraftModelDrafter(self.drafter, self.target.vocab_size, p_min=request.p_min)
        if plan.drafter_kind == "prompt-lookup":
            governor = make_governor(
                width, policy=plan.governor_policy, adaptive=plan.governor_adaptive, floor=plan.governor_floor
            )
            governor.listener = listener
            return PromptLookupDrafter(governor)
        return None

    def build(self, request: RowRequest, governor_listener: Listener | None = None) -> Generation:
        state = RowState(
            tokens=list(request.prompt),
            sampler=SamplerPipeline(request.sampling, self.target.vocab_size),
            rng=RowRng(resolve_seed(request.seed)),
        )
        target = ModelRunner(self.target.model, max_kv_size=self.plan.max_kv_size)
        width = self.plan.num_draft_tokens if request.n_max is None else min(request.n_max, self.plan.num_draft_tokens)
        choice = BlockChoice(TargetLoop(target))
        if self.block is not None and request.n_max != 0:
            choice = self.block.choose(target, request.sampling, request.n_max)
        drafter = self.make_drafter(request, width, governor_listener) if width > 0 and self.block is None else None
        loop: TargetLoop
        if drafter is None:
            loop = choice.loop
        else:
            rule = self.plan.rule(request.sampling)
            loop = SpeculativeLoop(
                target, drafter, rule, width, diagnose=self.plan.switches.accept_diag, n_min=request.n_min
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
