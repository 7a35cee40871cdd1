"""The model host: the plan, the loaded models, and the loop builder that makes each row's loop.

It is touched by the engine thread only (loading, building); HTTP handlers see what it loaded
through `ModelInfo`, a frozen record made once the models are in.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from mlx_lm.tokenizer_utils import TokenizerWrapper

from app.decoding.builder import LoopBuilder, RowRequest
from app.decoding.generation import Generation
from app.decoding.outcome import Note
from app.decoding.plan import LoopPlan, SamplerClass, plan_from_settings
from app.decoding.warmup import warm, warm_shapes, warms
from app.drafters.kinds import DrafterKind
from app.engine import tool_probe
from app.events import engine as events
from app.events.speculation import Startup
from app.execution.cost import HOST, TARGET_ROWS, ForwardCost, PlaneCost, cost_of, forget, plane_of
from app.execution.forward import batching
from app.execution.lockstep import Lockstep
from app.execution.model import LoadedModel, load_model
from app.execution.prompt_cache import CacheCounters, PromptCache
from app.execution.runner import reserve_rows
from app.loading import chat_template
from app.loading.builtin_templates import BUILTIN_TEMPLATES
from app.profiles.schema import Settings


@dataclass(frozen=True)
class ModelInfo:
    """What HTTP handlers may know of the loaded target: read-only, made once at load."""

    path: str
    context_limit: int
    vocab_size: int
    tokenizer: TokenizerWrapper  # HTTP tokenizes and renders templates with it, off the event loop
    batching: str  # whether the target's rows share forwards: "rows" or "per-row (why)" (app/execution/forward.py)
    writes_thinking: bool  # the chat template in use has thinking tags (reasoning_format parses them)
    template_caps: chat_template.TemplateCaps | None  # what the chat template in use renders (None: no template)
    calls_tools: bool | None  # the model answered the load-time tool probe with a call (None: not probed)

    @classmethod
    def of(cls, builder: LoopBuilder, settings: Settings, probe_tools: bool = True) -> ModelInfo:
        """What the builder's target is, with the profile's chat template; where the template
        renders tools and `probe_tools` (a server's load, not `mlxcel generate`'s one request),
        whether the model calls them (app/engine/tool_probe.py: a short greedy row)."""
        target, template_file = builder.target, settings.server.chat_template_file
        named = settings.server.chat_template
        template = chat_template.chosen(target.tokenizer, template_file, named)
        limits = chat_template.Limits(settings.server.template_timeout_s, settings.server.template_max_chars)
        variables = dict(getattr(target.tokenizer, "special_tokens_map", {}))
        caps = None if template is None else chat_template.capabilities(template, limits, variables)
        calls = None
        if probe_tools and template is not None and caps is not None and caps.supports_tools:
            calls = tool_probe.calls_tools(builder, template, limits, variables)
            forget(target.model)  # the probe's forwards were compiling: the width policy prices what serving measures
        return cls(
            path=str(target.path),
            context_limit=builder.context_limit,
            vocab_size=target.vocab_size,
            tokenizer=target.tokenizer,
            batching=batching(target.model),
            writes_thinking=chat_template.writes_thinking(
                chat_template.chosen_source(target.tokenizer, template_file, named)
            ),
            template_caps=caps,
            calls_tools=calls,
        )


def startup(settings: Settings, plan: LoopPlan, info: ModelInfo | None, address: tuple[str, int] | None) -> Startup:
    """The loop built from `settings`, its target (`info`, None until loaded) and where it listens
    (None: nowhere, `mlxcel generate`): the startup events' fields."""
    drafter = settings.drafter
    widths = plan.block_widths
    lookup = plan.drafter_kind is DrafterKind.PROMPT_LOOKUP
    caps = info.template_caps if info is not None else None
    return Startup(
        profile=settings.profile,
        profile_file=settings.source,
        target=settings.target.model,
        drafter_kind=drafter.kind,
        drafter_model=drafter.model,
        rule=plan.rules[SamplerClass.SAMPLED],
        rule_at_temperature_0=plan.rules[SamplerClass.ARGMAX],
        coupled=plan.couplings[SamplerClass.SAMPLED],
        width=(widths[0] if widths else plan.width) or None,
        adaptive_max_width=widths[1] if widths and plan.adaptive else None,
        governor_floor=plan.governor_floor if lookup else None,
        governor_policy=plan.governor_policy if lookup else None,
        env_overrides=dict(settings.env),
        batching=info.batching if info is not None else None,
        # false: the chat template drops a request's tools, so `auto` never answers a call
        template_renders_tools=caps.supports_tools if caps is not None else None,
        model_calls_tools=info.calls_tools if info is not None else None,
        exact=settings.execution.exact,
        host=address[0] if address is not None else None,
        port=address[1] if address is not None else None,
    )


class ModelHost:
    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.plan: LoopPlan = plan_from_settings(settings)  # decided once: the rules, widths and switches
        self.builder: LoopBuilder | None = None
        self.info: ModelInfo | None = None
        self.lockstep: Lockstep | None = None  # rank 0's orders to the followers of a tensor-parallel target
        self.warms = warms(settings.server.warmup)  # the forwards run once before the engine is ready

    def load(self) -> ModelInfo:
        """Load the target (and a classic drafter); block drafters load on their first request."""
        settings = self.settings
        started = time.perf_counter()
        target = self._load_one(settings.target.model, "target")
        drafter = None
        if self.plan.drafter_kind is DrafterKind.DRAFT_MODEL:
            drafter = self._load_one(settings.drafter.model, "drafter")
        server = settings.server
        prompt_cache = PromptCache(
            server.prompt_cache_mb << 20,
            server.prompt_cache_entries,
            per_tenant=server.prompt_cache_scope == "tenant",
        )
        for loaded in (target, drafter):  # every row at once, and the warm-up's and the probes' beside them
            if loaded is not None:
                reserve_rows(loaded.model, 2 * server.max_rows + 2)
        self.builder = LoopBuilder(target, drafter, self.plan, prompt_cache if server.prompt_cache_mb else None)
        events.models_loaded(target=str(target.path), seconds=time.perf_counter() - started)
        self.info = ModelInfo.of(self.builder, settings)
        if self.info.template_caps is not None and not self.info.template_caps.supports_tools:
            # the model never sees a request's tools, so `auto` answers text, never a call
            named = server.chat_template
            if named and named not in BUILTIN_TEMPLATES:
                named = "server.chat_template (its text)"
            template = server.chat_template_file or named or "the model's own"
            events.chat_template_ignores_tools(template=template)
        elif self.info.calls_tools is False:  # the tools reach the model, which answers in text all the same
            events.model_ignores_tools(probe=tool_probe.NAME)
        return self.info

    def prepare(self) -> list[Note]:
        """A block drafter's load and exactness probes, run now (see BlockLoops.prepare); what they noted."""
        assert self.builder is not None
        return self.builder.block.prepare() if self.builder.block is not None else []

    def warm(self) -> None:
        """Compile what requests will run (app/decoding/warmup.py), with `model_warming` before and
        `model_warmed` after."""
        assert self.builder is not None
        shapes = warm_shapes(self.plan, self.settings.server.max_rows)
        events.model_warming(batch_sizes=list(shapes.batch_sizes), widths=list(shapes.widths))
        started = time.perf_counter()
        rows = warm(self.builder, shapes)
        # the warm-up's timings were kernels compiling: the width policy prices what serving measures
        block = self.builder.block
        for model in (self.builder.target, self.builder.drafter):
            if model is not None:
                forget(model.model)
        if block is not None and block.bound is not None:
            forget(block.bound.module)
        events.model_warmed(rows=rows, seconds=time.perf_counter() - started)

    def _load_one(self, path: str, role: str) -> LoadedModel:
        """One checkpoint, with `model_loading` before and `model_loaded` after (load progress)."""
        events.model_loading(role=role, path=path)
        started = time.perf_counter()
        model = self._load_target() if role == "target" else load_model(path, role=role, exact=self.plan.exact)
        events.model_loaded(role=role, path=str(model.path), seconds=time.perf_counter() - started)
        return model

    def _load_target(self) -> LoadedModel:
        """The target, sharded over the ranks when the profile says tensor."""
        target = self.settings.target
        if target.parallel != "tensor":
            return load_model(
                target.model, exact=self.plan.exact, adapter=target.adapter_path, adapter_scale=target.adapter_scale
            )
        from app.execution.tensor_parallel import load_leader

        loaded, self.lockstep = load_leader(target.model, target.world_size)
        return loaded

    def stop_followers(self) -> None:
        """A tensor-parallel target's follower ranks return (once the engine thread has stopped)."""
        if self.lockstep is not None:
            self.lockstep.stop()

    @property
    def target(self) -> LoadedModel:
        assert self.builder is not None
        return self.builder.target

    @property
    def prompt_cache_counters(self) -> CacheCounters | None:
        """The prompt cache's counters (None until loaded, or where no cache runs)."""
        cache = self.builder.prompt_cache if self.builder is not None else None
        return cache.counters if cache is not None else None

    def build(self, request: RowRequest) -> Generation:
        """A request's generation; may take seconds (a block drafter's first load and probes)."""
        assert self.builder is not None
        return self.builder.build(request)

    def forward_cost(self) -> ForwardCost | None:
        """The target's measured forward costs (None until it is loaded)."""
        return cost_of(self.builder.target.model) if self.builder is not None else None

    def target_cost(self) -> PlaneCost | None:
        """The target's measured forwards against their rows and positions (None until it is loaded)."""
        return plane_of(self.builder.target.model, TARGET_ROWS) if self.builder is not None else None

    def host_cost(self) -> PlaneCost | None:
        """The rows' measured host work of a tick (None until the target is loaded)."""
        return plane_of(self.builder.target.model, HOST) if self.builder is not None else None
