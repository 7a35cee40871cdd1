"""The loop builder: made once from a profile (or CLI flags), it makes one round loop per request."""

from __future__ import annotations

from dataclasses import dataclass, field

from app.decoding.adaptive import FixedWidth
from app.decoding.block_builder import BlockLoops, Choice
from app.decoding.generation import Generation
from app.decoding.loop import Drafting, RoundLoop, SpeculativeLoop, TargetLoop
from app.decoding.outcome import RowStats
from app.decoding.plan import LoopPlan
from app.decoding.speculation import Speculation
from app.decoding.width import GovernedWidth, WidthPolicy, row_n_max
from app.drafters.block import DFlashDrafter, MtpDrafter
from app.drafters.draft_model import DraftModelDrafter
from app.drafters.governor import make_governor
from app.drafters.kinds import DrafterKind
from app.drafters.prompt_lookup import PromptLookupDrafter
from app.execution.model import LoadedModel
from app.execution.prompt_cache import PrefixRows, PromptCache, RowCaching
from app.execution.runner import ModelRunner, require_rewindable, restorable
from app.loading import ModelLoadError
from app.loading.pairing import require_pairing
from app.profiles.tenants import ANONYMOUS
from app.sampling import RowRng, SamplerPipeline, SamplingParams
from app.sampling.grammar import Grammar, GrammarVocabulary
from app.sampling.logprobs import ProbsRequest
from app.sampling.rng import random_seed
from app.sampling.state import RowState

DEFAULT_CONTEXT = 4096


@dataclass(frozen=True)
class RowRequest:
    """Per-request knobs the loop depends on, each as the request resolved it but the width cap,
    which the builder resolves from the plan (`n_max`: the request's cap, if any, on the plan's)."""

    prompt: list[int]
    sampling: SamplingParams
    max_tokens: int
    # the row's key seed, resolved where the request is made (app/sampling/rng.py resolve_seed); left out: a random one
    seed: int = field(default_factory=random_seed)
    stop: tuple[str, ...] = ()
    ignore_eos: bool = False
    n_indent: int = 0  # llama-server's: a new line indented less than this ends the text (0: off)
    t_max_predict_ms: int = 0  # llama-server's: past this after the first token, a new line ends the text
    n_max: int | None = None  # speculative.n_max: caps the plan's width (build resolves the row's cap); 0 opts out
    n_min: int = 0  # speculative.n_min: fewer proposals than this are retracted unverified
    p_min: float = 0.0  # speculative.p_min: the draft model stops below this probability
    probs: ProbsRequest | None = None  # log-probabilities to report per token (None: none, no cost)
    grammar: Grammar | None = None  # structured output: every decided token is within it
    cache_prompt: bool = True  # reuse and keep prompt prefixes in the prompt cache (where it runs)
    tenant: str = ANONYMOUS  # whose request (app/profiles/tenants.py): its prompt-cache partition, its /slots rows


class LoopBuilder:
    """Builds each request's loop as the plan says; it decides nothing the plan has decided."""

    def __init__(
        self,
        target: LoadedModel,
        drafter: LoadedModel | None,
        plan: LoopPlan,
        prompt_cache: PromptCache | None = None,
    ) -> None:
        if plan.drafter_kind is DrafterKind.DRAFT_MODEL:
            if drafter is None:
                raise ModelLoadError("drafter kind draft-model needs a drafter model (--draft-model)")
            require_pairing(target.checkpoint, drafter.checkpoint)
            require_rewindable(drafter.model, "drafter")
            require_rewindable(target.model, "target")
        self.target = target
        self.drafter = drafter
        self.plan = plan
        self.block: BlockLoops | None = None
        self._grammar_vocabulary: GrammarVocabulary | None = None  # built on the first constrained request
        if plan.drafter_kind.is_block_loop:
            if plan.drafter_model is None:
                raise ModelLoadError(f"drafter kind {plan.drafter_kind} needs a drafter model")
            require_rewindable(target.model, "target")
            self.block = BlockLoops(target, plan)
        # A target cache that is not plain KV rows (max_kv_size, recurrent layers) runs without it.
        self.prompt_cache = prompt_cache if restorable(target.model, plan.max_kv_size) else None

    @property
    def context_limit(self) -> int:
        return int(self.target.config.get("max_position_embeddings") or DEFAULT_CONTEXT)

    @property
    def grammar_vocabulary(self) -> GrammarVocabulary:
        if self._grammar_vocabulary is None:
            tokenizer = self.target.tokenizer
            self._grammar_vocabulary = GrammarVocabulary(
                tokenizer._tokenizer, self.target.vocab_size, list(tokenizer.eos_token_ids)
            )
        return self._grammar_vocabulary

    def choose(self, request: RowRequest, n_max: int) -> Choice:
        """This request's drafting (the block loops', or the draft model's or prompt lookup's) at
        most `n_max` proposals a round (the row's cap)."""
        plan = self.plan
        if n_max <= 0:
            return Choice(None)
        # only rows whose tokens are the same at every width follow the tick's choice (app/decoding/goodput.py)
        rule = plan.rule(request.sampling)
        load_free = plan.under_load and rule is not None and rule.width_independent
        if self.block is not None:
            return self.block.choose(request.sampling, n_max, request.n_min, load_free)
        sampled = not request.sampling.is_greedy  # its positions cost the sampler's work (the policy's prices)
        if plan.drafter_kind is DrafterKind.DRAFT_MODEL:
            proposer = DraftModelDrafter(
                self.drafter, self.target.vocab_size, p_min=request.p_min, coupled=plan.couples(request.sampling)
            )
            widths = WidthPolicy(FixedWidth(n_max), n_max, request.n_min, load_free, proposer.passes, sampled)
            return Choice(Drafting(proposer, widths))
        if plan.drafter_kind is DrafterKind.PROMPT_LOOKUP:
            governor = make_governor(
                n_max, policy=plan.governor_policy, adaptive=plan.governor_adaptive, floor=plan.governor_floor
            )
            proposer = PromptLookupDrafter()
            source = GovernedWidth(governor, proposer.lookup)
            widths = WidthPolicy(source, n_max, request.n_min, load_free, proposer.passes, sampled)
            return Choice(Drafting(proposer, widths))
        return Choice(None)

    def build(self, request: RowRequest) -> Generation:
        state = RowState(
            tokens=list(request.prompt),
            sampler=SamplerPipeline(request.sampling, self.target.vocab_size),
            rng=RowRng(request.seed),
            constraint=None if request.grammar is None else self.grammar_vocabulary.constraint(request.grammar),
            probs=request.probs,
        )
        target = ModelRunner(self.target.model, max_kv_size=self.plan.max_kv_size)
        n_max = row_n_max(self.plan.n_max, request.n_max)  # the row's cap, which all its reports read
        choice = self.choose(request, n_max)
        rule = self.plan.rule(request.sampling)
        loop: RoundLoop = TargetLoop(target)
        speculation, widths = Speculation(), None
        if choice.drafting is not None and rule is not None:
            proposer, widths = choice.drafting.proposer, choice.drafting.widths
            speculation = Speculation(
                rule=rule,
                draft_kind=proposer.kind,
                one_hot_proposals=proposer.one_hot_proposals,
                diagnose=self.plan.switches.accept_diag,
                coupled=self.plan.couples(request.sampling),
            )
            loop = SpeculativeLoop(target, choice.drafting, speculation)
        return Generation(
            loop=loop,
            state=state,
            tokenizer=self.target.tokenizer,
            max_tokens=request.max_tokens,
            context_limit=self.context_limit,
            stop=list(request.stop),
            ignore_eos=request.ignore_eos,
            n_indent=request.n_indent,
            t_max_predict_ms=request.t_max_predict_ms,
            speculation=speculation,
            widths=widths,
            n_max=n_max,
            stats=RowStats(notes=list(choice.notes)),
            excluded_s=choice.setup_seconds,
            caching=self._caching(request, loop),
            exact=self.plan.exact,
        )

    def _caching(self, request: RowRequest, loop: RoundLoop) -> RowCaching | None:
        """The row's prefixes restored from the prompt cache (when it runs and the request wants it)."""
        if self.prompt_cache is None or not request.cache_prompt:
            return None
        models: dict[str, PrefixRows] = {"target": loop.target}
        proposer = loop.proposer if isinstance(loop, SpeculativeLoop) else None
        if isinstance(proposer, DraftModelDrafter):
            models["drafter"] = proposer.runner
        elif isinstance(proposer, DFlashDrafter | MtpDrafter):  # their context rows of the prompt
            models["drafter"] = proposer.context
        caching = RowCaching(self.prompt_cache, tuple(request.prompt), models, request.tenant)
        caching.restore()
        return caching
