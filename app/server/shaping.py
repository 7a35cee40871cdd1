"""Response shaping: every answer body and stream frame is built here from engine facts."""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Sequence
from dataclasses import dataclass
from importlib.metadata import version
from pathlib import Path
from typing import Any

import msgspec
from mlx_lm.tokenizer_utils import TokenizerWrapper
from msgspec import UNSET, UnsetType

from app import __version__
from app.decoding.builder import RowRequest
from app.decoding.plan import LoopPlan, SamplerClass
from app.decoding.width import row_n_max
from app.drafters.kinds import DrafterKind
from app.loading import chat_template
from app.loading.token_bytes import token_bytes, token_text
from app.profiles.schema import Settings
from app.sampling import SamplingParams
from app.sampling.logprobs import TokenLogprob
from app.server.engine_view import EngineView, Finished, Progress, RowView, Timings
from app.server.reasoning import Reasoning, split
from app.server.responses import (
    AssistantMessage,
    ChatChoice,
    ChatChunkChoice,
    ChatCompletion,
    ChatCompletionChunk,
    ChatDelta,
    ChatLogprobs,
    ChatTokenLogprob,
    CompletionProbability,
    DefaultGenerationSettings,
    DefaultParams,
    DrafterInfo,
    DrafterSummary,
    FunctionCallDelta,
    GenerationSettings,
    LogitBiasEntry,
    ModelEntry,
    ModelList,
    ModelMeta,
    ModelName,
    NativeChunk,
    NativeCompletion,
    NextToken,
    PromptProgress,
    PromptTokensDetails,
    Props,
    Reloaded,
    Slot,
    SlotDraft,
    SlotParams,
    TemplateCaps,
    TextChoice,
    TextCompletion,
    TextLogprobs,
    TokenProbability,
    ToolCall,
    ToolCallDelta,
    TopLogprob,
    Usage,
)
from app.server.tools import ToolPlan, tool_calls

BUILD_INFO = f"mlxcel {__version__} (mlx {version('mlx')}, mlx-lm {version('mlx-lm')})"
SAMPLER_KNOBS = tuple(f for f in SamplingParams.__struct_fields__ if f not in ("logit_bias", "dry_breakers"))


def model_alias(settings: Settings) -> str:
    return settings.server.model_alias or Path(settings.target.model).name


def shown_path(settings: Settings, path: str) -> str:
    """A filesystem path as /props and /v1/models show it: its last part (the model's directory
    name, the profile's file name) unless `server.props_show_paths`, because anyone who may read
    them learns the machine's layout (user names, mount points) otherwise."""
    return path if settings.server.props_show_paths else Path(path).name


def logit_bias_entries(params: SamplingParams) -> list[LogitBiasEntry]:
    banned = float("-inf")
    return [LogitBiasEntry(bias=None if b == banned else b, token=t) for t, b in params.logit_bias.items()]


def sampler_knobs(source: msgspec.Struct) -> dict[str, Any]:
    """The sampler's knobs of a SamplingParams or the profile's sampling defaults."""
    return {name: getattr(source, name) for name in SAMPLER_KNOBS}


# --- introspection ----------------------------------------------------------------------------


def model_list(engine: EngineView) -> ModelList:
    entry = model_entry(engine)
    return ModelList(data=[entry], models=[ModelName(name=entry.id, model=entry.id)])


def model_entry(engine: EngineView) -> ModelEntry:
    """The one model served, as OpenAI's model object (its size facts once it is loaded)."""
    settings = engine.settings
    path = shown_path(settings, settings.target.model)
    meta = ModelMeta(path=path)
    if engine.unavailable is None:
        meta = ModelMeta(path=path, n_vocab=engine.vocab_size, n_ctx_train=engine.context_limit)
    return ModelEntry(id=model_alias(settings), created=int(time.time()), meta=meta)


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
    )


def reloaded(engine: EngineView) -> Reloaded:
    return Reloaded(mlxcel=drafter_info(engine.settings, engine.plan))


def props(engine: EngineView) -> Props:
    settings = engine.settings
    ready = engine.unavailable is None
    speculative = {
        "speculative_n_max": row_n_max(engine.plan.n_max, None),  # a request that sets no n_max
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
        chat_template=getattr(engine.tokenizer, "chat_template", None) if ready else None,
        chat_template_caps=template_caps(engine.model.template_caps) if ready else None,
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


# --- log-probabilities ------------------------------------------------------------------------


@dataclass
class Logprobs:
    """One row's token log-probabilities in each route's shape (app/sampling/logprobs.py
    computes them). OpenAI completions' `text_offset` runs on from chunk to chunk of the row."""

    tokenizer: TokenizerWrapper
    post_sampling: bool
    offset: int = 0  # characters of completion text before the next entry

    def _piece(self, token: int) -> tuple[str, list[int]]:
        raw = token_bytes(self.tokenizer, token)
        return token_text(raw), list(raw)

    def _candidate(self, token: int, logprob: float) -> TokenProbability:
        text, raw = self._piece(token)
        if self.post_sampling:
            return TokenProbability(id=token, token=text, bytes=raw, prob=math.exp(logprob))
        return TokenProbability(id=token, token=text, bytes=raw, logprob=logprob)

    def native(self, entries: Sequence[TokenLogprob]) -> list[CompletionProbability]:
        """llama-server's `completion_probabilities`: probabilities with post_sampling_probs."""
        shaped = []
        for entry in entries:
            top = [self._candidate(token, logprob) for token, logprob in entry.top]
            chosen = msgspec.structs.asdict(self._candidate(entry.token, entry.logprob))
            listed = {"top_probs": top} if self.post_sampling else {"top_logprobs": top}
            shaped.append(CompletionProbability(**chosen, **listed))
        return shaped

    def chat(self, entries: Sequence[TokenLogprob]) -> ChatLogprobs:
        """OpenAI chat's `logprobs`."""
        return ChatLogprobs(content=[self._chat_entry(entry) for entry in entries])

    def _chat_entry(self, entry: TokenLogprob) -> ChatTokenLogprob:
        top = [self._alternative(token, logprob) for token, logprob in entry.top]
        chosen = msgspec.structs.asdict(self._alternative(entry.token, entry.logprob))
        return ChatTokenLogprob(**chosen, top_logprobs=top)

    def _alternative(self, token: int, logprob: float) -> TopLogprob:
        text, raw = self._piece(token)
        return TopLogprob(token=text, logprob=logprob, bytes=raw)

    def text(self, entries: Sequence[TokenLogprob]) -> TextLogprobs:
        """OpenAI completions' `logprobs`; each token's alternatives include it (OpenAI's "up to n + 1")."""
        tokens, offsets, tops = [], [], []
        for entry in entries:
            text = self._piece(entry.token)[0]
            tokens.append(text)
            offsets.append(self.offset)
            self.offset += len(text)
            tops.append({self._piece(t)[0]: lp for t, lp in entry.top} | {text: entry.logprob})
        return TextLogprobs(
            tokens=tokens, token_logprobs=[e.logprob for e in entries], top_logprobs=tops, text_offset=offsets
        )


def logprobs_for(tokenizer: TokenizerWrapper, rows: Sequence[RowRequest]) -> list[Logprobs | None]:
    """One shaper per row (each choice's `text_offset` runs on in its own text); None for a row
    whose request asked for no log-probabilities."""
    return [None if row.probs is None else Logprobs(tokenizer, row.probs.post_sampling) for row in rows]


# --- completions ------------------------------------------------------------------------------


def generation_settings(request: RowRequest, model: str, plan_n_max: int) -> GenerationSettings:
    params = request.sampling
    return GenerationSettings(
        **sampler_knobs(params),
        logit_bias=logit_bias_entries(params),
        model=model,
        n_predict=request.max_tokens,
        seed=request.seed if request.seed is not None else -1,
        stop=list(request.stop),
        ignore_eos=request.ignore_eos,
        speculative_n_max=row_n_max(plan_n_max, request.n_max),  # what the row's builder resolves
        speculative_n_min=request.n_min,
        speculative_p_min=request.p_min,
    )


RULE_HEADER = "x-mlxcel-acceptance-rule"


def rule_header(rules: list[str | None]) -> dict[str, str]:
    """The acceptance rule the request's rows ran, as their loops reported it (`none`: no
    drafter); rows that ran different rules are each named once, in row order."""
    return {RULE_HEADER: ", ".join(dict.fromkeys(rule or "none" for rule in rules))}


def speculative_biased(results: list[Finished]) -> bool | UnsetType:
    """Whether a row's stream followed the target's argmax although the request sampled
    (argmax-against-argmax at T > 0); absent where no drafter ran."""
    drafted = [result for result in results if result.rule is not None]
    return any(result.biased for result in drafted) if drafted else UNSET


def finish_reason(result: Finished) -> str:
    return "length" if result.stop_type == "limit" else "stop"


def usage(results: list[Finished], n: int = 1) -> Usage:
    """Over all rows; as OpenAI bills, a prompt counts once however many (`n`) choices it has.

    Rows are in choice order, so row i is choice i % n of prompt i // n.
    """
    prompt = sum(result.prompt_n for result in results[::n])
    cached = sum(result.timings.cache_n for result in results[::n])
    completion = sum(len(result.tokens) for result in results)
    return Usage(
        prompt_tokens=prompt,
        completion_tokens=completion,
        total_tokens=prompt + completion,
        prompt_tokens_details=PromptTokensDetails(cached_tokens=cached),
    )


def body_timings(results: list[Finished]) -> Timings | UnsetType:
    """A body's top-level `timings`: its one row's; a body of several rows has none (whose would it be?)."""
    return results[0].timings if len(results) == 1 else UNSET


def native_completion(
    result: Finished,
    settings: GenerationSettings,
    prompt: str,
    *,
    return_tokens: bool,
    streamed: bool,
    index: int = 0,
    logprobs: Logprobs | None = None,
) -> NativeCompletion:
    """The body, or the stream's last frame (its text and probabilities went out in the frames
    before); `index`: the prompt's."""
    probabilities = logprobs.native(result.logprobs) if logprobs is not None and not streamed else UNSET
    return NativeCompletion(
        index=index,
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
        completion_probabilities=probabilities,
        speculative_biased=speculative_biased([result]),
    )


def native_body(
    result: Finished,
    settings: GenerationSettings,
    prompt: str,
    *,
    return_tokens: bool,
    streamed: bool,
    response_fields: list[str] | None,
    index: int = 0,
    logprobs: Logprobs | None = None,
) -> NativeCompletion | dict[str, Any]:
    """The whole object, or the `response_fields` of it when the request names some."""
    body = native_completion(
        result, settings, prompt, return_tokens=return_tokens, streamed=streamed, index=index, logprobs=logprobs
    )
    return select_fields(msgspec.to_builtins(body), response_fields) if response_fields else body


def native_chunk(
    text: str,
    tokens: list[int],
    timings: Timings | None,
    counts: tuple[int, int],
    index: int = 0,
    probabilities: list[CompletionProbability] | UnsetType = UNSET,
) -> NativeChunk:
    """A stream frame of prompt `index`: its text and tokens, the row's `counts` so far (tokens
    predicted, prompt tokens evaluated), per-token timings when `timings` is given, and with
    n_probs its tokens' probabilities."""
    predicted, evaluated = counts
    return NativeChunk(
        index=index,
        content=text,
        tokens=tokens,
        tokens_predicted=predicted,
        tokens_evaluated=evaluated,
        timings=UNSET if timings is None else timings,
        completion_probabilities=probabilities,
    )


def prompt_progress(progress: Progress) -> PromptProgress:
    return PromptProgress(
        total=progress.total, cache=progress.cache, processed=progress.processed, time_ms=progress.time_ms
    )


def native_progress_chunk(progress: Progress, counts: tuple[int, int], index: int = 0) -> NativeChunk:
    """A prefill progress frame of prompt `index`, as llama-server sends one: no content, the
    row's `counts`, and `prompt_progress`."""
    return msgspec.structs.replace(native_chunk("", [], None, counts, index), prompt_progress=prompt_progress(progress))


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
    index: int,
    text: str | None,
    reason: str | None,
    usage: Usage | UnsetType = UNSET,
    timings: Timings | UnsetType = UNSET,
    logprobs: TextLogprobs | None = None,
) -> TextCompletion:
    """An update chunk (text, and its tokens' log-probabilities) or the finish chunk (reason) of choice `index`."""
    choice = TextChoice(text=text or "", index=index, logprobs=logprobs, finish_reason=reason)
    return TextCompletion(
        id=head.id, created=head.created, model=head.model, choices=[choice], usage=usage, timings=timings
    )


def text_progress_chunk(head: OpenAIHead, index: int, progress: Progress) -> TextCompletion:
    """A prefill progress chunk of choice `index`, as llama-server sends one: no text yet, `prompt_progress`."""
    return msgspec.structs.replace(text_completion(head, index, "", None), prompt_progress=prompt_progress(progress))


def text_completion_body(
    head: OpenAIHead, results: list[Finished], n: int, echoes: list[str], logprobs: list[Logprobs | None]
) -> TextCompletion:
    """The body: one choice per row, each text after its prompt's `echoes` entry ("" without echo),
    with its row's `logprobs` (never with an echo: requests.probs_request refuses the pair)."""
    choices = [
        TextChoice(
            text=echo + result.text,
            index=index,
            logprobs=shaper.text(result.logprobs) if shaper is not None else None,
            finish_reason=finish_reason(result),
        )
        for index, (result, echo, shaper) in enumerate(zip(results, echoes, logprobs, strict=True))
    ]
    return TextCompletion(
        id=head.id,
        created=head.created,
        model=head.model,
        choices=choices,
        usage=usage(results, n),
        timings=body_timings(results),
        speculative_biased=speculative_biased(results),
    )


def chat_chunk(
    head: OpenAIHead,
    index: int,
    text: str | None,
    reason: str | None,
    usage: Usage | UnsetType = UNSET,
    timings: Timings | UnsetType = UNSET,
    logprobs: ChatLogprobs | None = None,
) -> ChatCompletionChunk:
    """An update chunk (text, and its tokens' log-probabilities) or the finish chunk (reason, an
    empty delta) of choice `index`."""
    delta = ChatDelta() if text is None else ChatDelta(content=text)
    choice = ChatChunkChoice(index=index, delta=delta, logprobs=logprobs, finish_reason=reason)
    return _chat_chunk(head, choice, usage, timings)


# A streamed call's arguments go out in pieces of this many characters, as OpenAI streams them
ARGUMENT_PIECE = 32


def tool_call_chunks(
    head: OpenAIHead, index: int, calls: list[ToolCall], logprobs: ChatLogprobs | None
) -> list[ChatCompletionChunk]:
    """Choice `index`'s calls as `delta.tool_calls` chunks: each call's id, type and name (with
    the calls' tokens' log-probabilities on the first), then its arguments in pieces."""
    chunks = []
    for number, call in enumerate(calls):
        head_piece = ToolCallDelta(
            index=number, id=call.id, type="function", function=FunctionCallDelta(name=call.function.name, arguments="")
        )
        pieces = [head_piece] + [
            ToolCallDelta(
                index=number, function=FunctionCallDelta(arguments=call.function.arguments[at : at + ARGUMENT_PIECE])
            )
            for at in range(0, len(call.function.arguments), ARGUMENT_PIECE)
        ]
        for piece in pieces:
            choice = ChatChunkChoice(
                index=index,
                delta=ChatDelta(tool_calls=[piece]),
                logprobs=None if chunks else logprobs,
                finish_reason=None,
            )
            chunks.append(_chat_chunk(head, choice))
    return chunks


def chat_reasoning_chunk(head: OpenAIHead, index: int, text: str, logprobs: ChatLogprobs | None) -> ChatCompletionChunk:
    """A piece of choice `index`'s thinking, as llama-server streams it: `delta.reasoning_content`."""
    choice = ChatChunkChoice(
        index=index, delta=ChatDelta(reasoning_content=text), logprobs=logprobs, finish_reason=None
    )
    return _chat_chunk(head, choice)


def chat_role_chunk(head: OpenAIHead, index: int = 0) -> ChatCompletionChunk:
    """The first chunk of choice `index`: the assistant's role, no text yet (null)."""
    delta = ChatDelta(role="assistant", content=None)
    return _chat_chunk(head, ChatChunkChoice(index=index, delta=delta, finish_reason=None))


def chat_progress_chunk(head: OpenAIHead, index: int, progress: Progress) -> ChatCompletionChunk:
    """A prefill progress chunk of choice `index`, as llama-server sends one: the role delta (no
    content yet) with `prompt_progress`."""
    return msgspec.structs.replace(chat_role_chunk(head, index), prompt_progress=prompt_progress(progress))


def _chat_chunk(
    head: OpenAIHead,
    choice: ChatChunkChoice,
    usage: Usage | UnsetType = UNSET,
    timings: Timings | UnsetType = UNSET,
) -> ChatCompletionChunk:
    return ChatCompletionChunk(
        id=head.id, created=head.created, model=head.model, choices=[choice], usage=usage, timings=timings
    )


def chat_choice(
    index: int, result: Finished, logprobs: ChatLogprobs | None, plan: ToolPlan | None, reasoning: Reasoning | None
) -> ChatChoice:
    """One choice: its thinking (with `reasoning`) and its text, or (content null, finish_reason
    tool_calls) the calls its text is."""
    thought, text = split(reasoning, result.text) if reasoning is not None else (None, result.text)
    shown = UNSET if thought is None else thought
    calls = tool_calls(plan, text) if plan is not None else None
    if calls:
        message = AssistantMessage(content=None, reasoning_content=shown, tool_calls=calls)
        return ChatChoice(index=index, message=message, logprobs=logprobs, finish_reason="tool_calls")
    message = AssistantMessage(content=text, reasoning_content=shown)
    return ChatChoice(index=index, message=message, logprobs=logprobs, finish_reason=finish_reason(result))


def chat_completion(
    head: OpenAIHead,
    results: list[Finished],
    logprobs: list[Logprobs | None],
    plan: ToolPlan | None = None,
    reasoning: Reasoning | None = None,
) -> ChatCompletion:
    """The body: one choice per row (the `n` choices of the one conversation), each with its row's
    `logprobs`; a choice whose output is a call of the `plan`'s tools answers it as `tool_calls`."""
    choices = [
        chat_choice(index, result, shaper.chat(result.logprobs) if shaper is not None else None, plan, reasoning)
        for index, (result, shaper) in enumerate(zip(results, logprobs, strict=True))
    ]
    return ChatCompletion(
        id=head.id,
        created=head.created,
        model=head.model,
        choices=choices,
        usage=usage(results, len(results)),
        timings=body_timings(results),
        speculative_biased=speculative_biased(results),
    )
