"""What the server is and runs, as llama-server answers it: /health, /props (the profile, its
drafter, the plan's rules, the sampling defaults) and /slots (each row's settings and drafting so
far, as its tenant may see them); POST /admin/reload answers /props' `mlxcel` block."""

from __future__ import annotations

import dataclasses
from importlib.metadata import version
from typing import Literal

import msgspec
from msgspec import UNSET, UnsetType

from app import __version__
from app.decoding.plan import LoopPlan, SamplerClass
from app.drafters.kinds import DrafterKind
from app.loading import chat_template
from app.profiles.schema import AdaptiveSettings, GovernorSettings, Settings
from app.server.core import adapters
from app.server.core.adapters import LoraAdapter
from app.server.core.shaping import model_alias, shown_path
from app.server.engine_view import EngineView, RowView
from app.server.native.settings import (
    DefaultGenerationSettings,
    DefaultParams,
    SlotParams,
    logit_bias_entries,
    sampler_knobs,
)

BUILD_INFO = f"mlxcel {__version__} (mlx {version('mlx')}, mlx-lm {version('mlx-lm')})"


class Health(msgspec.Struct, kw_only=True):
    status: Literal["ok"] = "ok"


class DrafterSummary(msgspec.Struct, kw_only=True):
    kind: str
    model: str | None
    width: int
    p_min: float


class DrafterInfo(msgspec.Struct, kw_only=True):
    """mlxcel's own /props block: the profile, its drafter and the rules the plan decided."""

    profile: str
    profile_file: str
    drafter: DrafterSummary
    rule_at_temperature_0: str | None
    rule_at_temperature_above_0: str | None
    coupled_at_temperature_above_0: bool  # sampled requests' drafts draw with the target's keys
    adaptive: AdaptiveSettings
    block_widths: list[int] | None
    governor: GovernorSettings | None  # prompt lookup only
    env_overrides: dict[str, str]
    exact: bool  # execution.exact: batch-invariant kernels (false: MLX's own, a row may depend on its batch-mates)
    lora_adapters: list[LoraAdapter]  # fused into the target at load, as GET /lora-adapters lists them


class Modalities(msgspec.Struct, kw_only=True):
    vision: bool = False
    audio: bool = False


class TemplateCaps(msgspec.Struct, kw_only=True):
    """What the chat template renders (llama-server's /props `chat_template_caps`); a template
    without `supports_tools` never shows a request's tools to the model, so it never calls one."""

    supports_system_role: bool
    supports_tools: bool
    supports_tool_calls: bool
    supports_parallel_tool_calls: bool


class Props(msgspec.Struct, kw_only=True):
    default_generation_settings: DefaultGenerationSettings
    total_slots: int
    model_path: str
    model_alias: str
    build_info: str
    chat_template: str | None
    chat_template_caps: TemplateCaps | None  # null until the model is loaded, and for a model with no template
    # mlxcel's: the model answered the load-time tool probe with a call (app/engine/tool_probe.py);
    # null until loaded, and where the template shows no tools
    model_calls_tools: bool | None
    modalities: Modalities = msgspec.field(default_factory=Modalities)
    is_sleeping: bool = False
    mlxcel: DrafterInfo


class Reloaded(msgspec.Struct, kw_only=True):
    """POST /admin/reload's answer: the profile now serving new requests (as /props's `mlxcel`)."""

    status: Literal["reloaded"] = "reloaded"
    mlxcel: DrafterInfo


class NextToken(msgspec.Struct, kw_only=True):
    n_decoded: int
    has_next_token: bool


class SlotDraft(msgspec.Struct, kw_only=True):
    draft_n: int
    draft_n_accepted: int
    draft_rounds: int
    # mlxcel's: the proposals of the row's latest step as its width policy decided them (0: a plain
    # step; null: the row has not stepped yet)
    width: int | None


class Slot(msgspec.Struct, kw_only=True):
    """One of /slots; the request fields only while the slot is processing."""

    id: int
    id_task: int | str  # the request id; -1 when idle or another tenant's (is_processing tells them apart)
    is_processing: bool
    n_ctx: int
    # while processing, as llama-server names them: the prompt, its tokens prefilled, and restored from the prompt cache
    n_prompt_tokens: int | UnsetType = UNSET
    n_prompt_tokens_processed: int | UnsetType = UNSET
    n_prompt_tokens_cache: int | UnsetType = UNSET
    params: SlotParams | UnsetType = UNSET
    next_token: NextToken | UnsetType = UNSET
    draft: SlotDraft | UnsetType | None = UNSET  # null: the row runs no drafter


def drafter_info(settings: Settings, plan: LoopPlan) -> DrafterInfo:
    return DrafterInfo(
        profile=settings.profile,
        profile_file=shown_path(settings, settings.source),
        drafter=DrafterSummary(
            kind=settings.drafter.kind,
            model=settings.drafter.model and shown_path(settings, settings.drafter.model),
            width=plan.width,
            p_min=settings.drafter.p_min,
        ),
        rule_at_temperature_0=plan.rules[SamplerClass.ARGMAX],
        rule_at_temperature_above_0=plan.rules[SamplerClass.SAMPLED],
        coupled_at_temperature_above_0=plan.couplings[SamplerClass.SAMPLED],
        adaptive=settings.adaptive,
        block_widths=list(plan.block_widths) if plan.block_widths else None,
        governor=settings.governor if plan.drafter_kind is DrafterKind.PROMPT_LOOKUP else None,
        env_overrides=dict(settings.env),
        exact=settings.execution.exact,
        lora_adapters=adapters.listing(settings),
    )


def reloaded(engine: EngineView) -> Reloaded:
    return Reloaded(mlxcel=drafter_info(engine.settings, engine.plan))


def props(engine: EngineView) -> Props:
    settings = engine.settings
    ready = engine.unavailable is None
    speculative = {
        "speculative_n_max": engine.plan.n_max,  # a request that sets no n_max runs at the plan's cap
        "speculative_n_min": settings.drafter.min_draft_tokens,
        "speculative_p_min": settings.drafter.p_min,
    }
    params = DefaultParams(
        **sampler_knobs(settings.sampling),
        logit_bias=[],
        n_predict=settings.sampling.n_predict,
        seed=settings.sampling.seed,
        **speculative,
    )
    defaults = DefaultGenerationSettings(
        **sampler_knobs(settings.sampling),
        n_predict=settings.sampling.n_predict,
        n_ctx=engine.context_limit if ready else None,
        **speculative,
        params=params,
    )
    return Props(
        default_generation_settings=defaults,
        total_slots=settings.server.max_rows,
        model_path=shown_path(settings, settings.target.model),
        model_alias=model_alias(settings),
        build_info=BUILD_INFO,
        # the template in use: the profile's (a file, or a built-in one) before the model's own
        chat_template=chat_template.chosen_source(
            engine.tokenizer, settings.server.chat_template_file, settings.server.chat_template
        )
        if ready
        else None,
        chat_template_caps=template_caps(engine.model.template_caps) if ready else None,
        model_calls_tools=engine.model.calls_tools if ready else None,
        mlxcel=drafter_info(settings, engine.plan),
    )


def template_caps(caps: chat_template.TemplateCaps | None) -> TemplateCaps | None:
    return None if caps is None else TemplateCaps(**dataclasses.asdict(caps))


def slots(engine: EngineView, tenant: str) -> list[Slot]:
    """The slots as `tenant` may see them: another tenant's row is only busy, with no request id,
    settings (its seed, its logit biases) or counts (its prompt's length, its cache hits)."""
    rows, n_ctx = engine.rows(), engine.context_limit
    return [
        slot(index, row, n_ctx)
        if (row := rows.get(index)) is None or row.request.tenant == tenant
        else Slot(id=index, id_task=-1, is_processing=True, n_ctx=n_ctx)
        for index in range(engine.settings.server.max_rows)
    ]


def slot(index: int, row: RowView | None, n_ctx: int) -> Slot:
    if row is None:
        return Slot(id=index, id_task=-1, is_processing=False, n_ctx=n_ctx)
    request = row.request
    params = SlotParams(
        **sampler_knobs(request.sampling),
        logit_bias=logit_bias_entries(request.sampling),
        n_predict=request.max_tokens,
        speculative_n_max=row.n_max,  # the row's resolved cap, as its response reports it
        speculative_n_min=request.n_min,
        speculative_p_min=request.p_min,
    )
    draft = row.draft and SlotDraft(
        draft_n=row.draft.proposed,
        draft_n_accepted=row.draft.accepted,
        draft_rounds=row.draft.rounds,
        width=row.draft.width,
    )
    return Slot(
        id=index,
        id_task=row.request_id,
        is_processing=True,
        n_ctx=n_ctx,
        n_prompt_tokens=row.prompt_n,
        n_prompt_tokens_processed=row.prompt_n - row.cache_n,
        n_prompt_tokens_cache=row.cache_n,
        params=params,
        next_token=NextToken(n_decoded=row.decided, has_next_token=not row.finished),
        draft=draft,
    )
