"""Response shaping: every answer body and stream frame is built here from engine facts."""

from __future__ import annotations

import time
from dataclasses import dataclass
from importlib.metadata import version
from pathlib import Path
from typing import Any

import msgspec
from msgspec import UNSET, UnsetType

from app import __version__
from app.decoding.builder import RowRequest
from app.decoding.plan import LoopPlan, SamplerClass
from app.drafters.kinds import DrafterKind
from app.profiles.schema import Settings
from app.sampling import SamplingParams
from app.server.engine_view import EngineView, Finished, RowView, Timings
from app.server.responses import (
    AssistantMessage,
    ChatChoice,
    ChatChunkChoice,
    ChatCompletion,
    ChatCompletionChunk,
    ChatDelta,
    DefaultGenerationSettings,
    DrafterInfo,
    DrafterSummary,
    GenerationSettings,
    ModelEntry,
    ModelList,
    ModelMeta,
    ModelName,
    NativeChunk,
    NativeCompletion,
    NextToken,
    Props,
    Slot,
    SlotDraft,
    SlotParams,
    TextChoice,
    TextCompletion,
    Usage,
)
from app.server.tools import ToolPlan, tool_calls

BUILD_INFO = f"mlxcel {__version__} (mlx {version('mlx')}, mlx-lm {version('mlx-lm')})"
SAMPLER_KNOBS = tuple(f for f in SamplingParams.__struct_fields__ if f != "logit_bias")


def model_alias(settings: Settings) -> str:
    return settings.server.model_alias or Path(settings.target).name


def sampler_knobs(source: msgspec.Struct) -> dict[str, Any]:
    """The sampler's knobs of a SamplingParams or the profile's sampling defaults."""
    return {name: getattr(source, name) for name in SAMPLER_KNOBS}


# --- introspection ----------------------------------------------------------------------------


def model_list(engine: EngineView) -> ModelList:
    settings = engine.settings
    meta = ModelMeta(path=settings.target)
    if engine.unavailable is None:
        meta = ModelMeta(path=settings.target, n_vocab=engine.vocab_size, n_ctx_train=engine.context_limit)
    alias = model_alias(settings)
    entry = ModelEntry(id=alias, created=int(time.time()), meta=meta)
    return ModelList(data=[entry], models=[ModelName(name=alias, model=alias)])


def drafter_info(settings: Settings, plan: LoopPlan) -> DrafterInfo:
    return DrafterInfo(
        profile=settings.profile,
        profile_file=settings.source,
        drafter=DrafterSummary(
            kind=settings.drafter.kind, model=settings.drafter.model, width=plan.width, p_min=settings.drafter.p_min
        ),
        rule_at_temperature_0=plan.rules[SamplerClass.ARGMAX],
        rule_at_temperature_above_0=plan.rules[SamplerClass.SAMPLED],
        adaptive=settings.adaptive,
        block_widths=list(plan.block_widths) if plan.block_widths else None,
        governor=settings.governor if plan.drafter_kind is DrafterKind.PROMPT_LOOKUP else None,
        env_overrides=dict(settings.env),
    )


def props(engine: EngineView) -> Props:
    settings = engine.settings
    ready = engine.unavailable is None
    defaults = DefaultGenerationSettings(
        **sampler_knobs(settings.sampling),
        n_predict=settings.sampling.n_predict,
        n_ctx=engine.context_limit if ready else None,
        speculative_n_max=engine.plan.width,
        speculative_n_min=0,
        speculative_p_min=settings.drafter.p_min,
    )
    return Props(
        default_generation_settings=defaults,
        total_slots=settings.server.max_rows,
        model_path=settings.target,
        model_alias=model_alias(settings),
        build_info=BUILD_INFO,
        chat_template=getattr(engine.tokenizer, "chat_template", None) if ready else None,
        mlxcel=drafter_info(settings, engine.plan),
    )


def slots(engine: EngineView) -> list[Slot]:
    rows, n_ctx = engine.rows(), engine.context_limit
    return [slot(index, rows.get(index), n_ctx, engine.plan.width) for index in range(engine.settings.server.max_rows)]


def slot(index: int, row: RowView | None, n_ctx: int, width: int) -> Slot:
    if row is None:
        return Slot(id=index, id_task=-1, is_processing=False, n_ctx=n_ctx)
    request = row.request
    params = SlotParams(
        **sampler_knobs(request.sampling),
        logit_bias=dict(request.sampling.logit_bias),
        n_predict=request.max_tokens,
        speculative_n_max=width if request.n_max is None else request.n_max,
        speculative_n_min=request.n_min,
        speculative_p_min=request.p_min,
    )
    draft = row.draft and SlotDraft(
        draft_n=row.draft.proposed, draft_n_accepted=row.draft.accepted, draft_rounds=row.draft.rounds
    )
    return Slot(
        id=index,
        id_task=row.request_id,
        is_processing=True,
        n_ctx=n_ctx,
        params=params,
        next_token=NextToken(n_decoded=row.decided, has_next_token=not row.finished),
        draft=draft,
    )


# --- completions ------------------------------------------------------------------------------


def generation_settings(request: RowRequest, model: str, width: int) -> GenerationSettings:
    params = request.sampling
    return GenerationSettings(
        **sampler_knobs(params),
        logit_bias=list(params.logit_bias.items()),
        model=model,
        n_predict=request.max_tokens,
        seed=request.seed if request.seed is not None else -1,
        stop=list(request.stop),
        ignore_eos=request.ignore_eos,
        speculative_n_max=width if request.n_max is None else min(width, request.n_max),
        speculative_n_min=request.n_min,
        speculative_p_min=request.p_min,
    )


def finish_reason(result: Finished) -> str:
    return "length" if result.stop_type == "limit" else "stop"


def usage(result: Finished) -> Usage:
    completion = len(result.tokens)
    return Usage(prompt_tokens=result.prompt_n, completion_tokens=completion, total_tokens=result.prompt_n + completion)


def native_completion(
    result: Finished, settings: GenerationSettings, prompt: str, *, return_tokens: bool, streamed: bool
) -> NativeCompletion:
    """The body, or the stream's last frame (its text went out in the frames before)."""
    return NativeCompletion(
        content="" if streamed else result.text,
        tokens=result.tokens if return_tokens else [],
        model=settings.model,
        tokens_predicted=len(result.tokens),
        tokens_evaluated=result.prompt_n,
        generation_settings=settings,
        prompt=prompt,
        has_new_line="\n" in result.text,
        stop_type=result.stop_type,
        stopping_word=result.stopping_word,
        tokens_cached=result.prompt_n + len(result.tokens),
        timings=result.timings,
    )


def native_body(
    result: Finished,
    settings: GenerationSettings,
    prompt: str,
    *,
    return_tokens: bool,
    streamed: bool,
    response_fields: list[str] | None,
) -> NativeCompletion | dict[str, Any]:
    """The whole object, or the `response_fields` of it when the request names some."""
    body = native_completion(result, settings, prompt, return_tokens=return_tokens, streamed=streamed)
    return select_fields(msgspec.to_builtins(body), response_fields) if response_fields else body


def native_chunk(text: str, tokens: list[int], timings: Timings | None) -> NativeChunk:
    """A stream frame; with per-token timings (`timings` given) it also counts the tokens so far."""
    if timings is None:
        return NativeChunk(content=text, tokens=tokens)
    return NativeChunk(
        content=text,
        tokens=tokens,
        tokens_predicted=timings.predicted_n,
        tokens_evaluated=timings.prompt_n,
        timings=timings,
    )


def select_fields(body: dict[str, Any], fields: list[str]) -> dict[str, Any]:
    """llama-server's `response_fields`: keep the named keys; `a/b` reaches into nested objects.

    Works on the encoded body, so the paths are wire names (`generation_settings/speculative.n_max`).
    """
    out: dict[str, Any] = {}
    for path in fields:
        value: Any = body
        for part in path.split("/"):
            value = value.get(part) if isinstance(value, dict) else None
        if value is not None:
            out[path] = value
    return out


@dataclass(frozen=True)
class OpenAIHead:
    """What every OpenAI body and chunk of one request repeats."""

    id: str
    created: int
    model: str


def openai_head(prefix: str, request_id: str, model: str) -> OpenAIHead:
    return OpenAIHead(id=f"{prefix}-{request_id}", created=int(time.time()), model=model)


def text_completion(
    head: OpenAIHead,
    text: str | None,
    reason: str | None,
    usage: Usage | UnsetType = UNSET,
    timings: Timings | UnsetType = UNSET,
) -> TextCompletion:
    """The body (text and reason), an update chunk (text) or the finish chunk (reason)."""
    choice = TextChoice(text=text or "", finish_reason=reason)
    return TextCompletion(
        id=head.id, created=head.created, model=head.model, choices=[choice], usage=usage, timings=timings
    )


def chat_chunk(
    head: OpenAIHead,
    text: str | None,
    reason: str | None,
    usage: Usage | UnsetType = UNSET,
    timings: Timings | UnsetType = UNSET,
) -> ChatCompletionChunk:
    """An update chunk (text) or the finish chunk (reason, an empty delta)."""
    delta = ChatDelta() if text is None else ChatDelta(content=text)
    return _chat_chunk(head, ChatChunkChoice(delta=delta, finish_reason=reason), usage, timings)


def chat_role_chunk(head: OpenAIHead) -> ChatCompletionChunk:
    """The first chunk: the assistant's role, no text yet."""
    return _chat_chunk(head, ChatChunkChoice(delta=ChatDelta(role="assistant", content=""), finish_reason=None))


def _chat_chunk(
    head: OpenAIHead,
    choice: ChatChunkChoice,
    usage: Usage | UnsetType = UNSET,
    timings: Timings | UnsetType = UNSET,
) -> ChatCompletionChunk:
    return ChatCompletionChunk(
        id=head.id, created=head.created, model=head.model, choices=[choice], usage=usage, timings=timings
    )


def chat_completion(head: OpenAIHead, result: Finished, plan: ToolPlan | None = None) -> ChatCompletion:
    calls = tool_calls(plan, result.text) if plan is not None else None
    if calls:
        message = AssistantMessage(content=None, tool_calls=calls)
        choice = ChatChoice(message=message, finish_reason="tool_calls")
    else:
        choice = ChatChoice(message=AssistantMessage(content=result.text), finish_reason=finish_reason(result))
    return ChatCompletion(
        id=head.id,
        created=head.created,
        model=head.model,
        choices=[choice],
        usage=usage(result),
        timings=result.timings,
    )
