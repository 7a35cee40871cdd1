"""llama-server's /completion answers (the body, a list of them for a list of prompts, the
stream's frames) and the answers of /tokenize, /detokenize and /apply-template."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import msgspec
from msgspec import UNSET, UnsetType

from app.server.core.logprobs import CompletionProbability, Logprobs
from app.server.core.service import Rows
from app.server.core.shaping import PromptProgress, prompt_progress, speculative_biased
from app.server.core.streaming import error_frame, frame
from app.server.engine_view import Delta, Finished, Progress, Timings
from app.server.native.settings import GenerationSettings, generation_settings


class TokenIds(msgspec.Struct, kw_only=True):
    tokens: list[int]


class TokenPiece(msgspec.Struct, kw_only=True):
    id: int
    piece: str


class TokenPieces(msgspec.Struct, kw_only=True):
    tokens: list[TokenPiece]


class Detokenized(msgspec.Struct, kw_only=True):
    content: str


class TemplatePrompt(msgspec.Struct, kw_only=True):
    prompt: str


class NativeCompletion(msgspec.Struct, kw_only=True):
    """llama-server's /completion body, and the last frame of its stream."""

    index: int = 0
    content: str
    tokens: list[int]
    id_slot: int = 0
    stop: bool = True
    model: str
    tokens_predicted: int
    tokens_evaluated: int
    generation_settings: GenerationSettings
    prompt: str
    has_new_line: bool
    truncated: bool = False
    stop_type: str
    stopping_word: str
    tokens_cached: int
    timings: Timings
    completion_probabilities: list[CompletionProbability] | UnsetType = UNSET  # with n_probs, unstreamed
    speculative_biased: bool | UnsetType = UNSET  # a drafter ran: did the stream follow the argmax at T > 0?


class NativeChunk(msgspec.Struct, kw_only=True):
    """One /completion stream frame before the last; timings with `timings_per_token`; a
    prefill progress frame (no content, no tokens) carries `prompt_progress`."""

    index: int = 0
    content: str
    tokens: list[int]
    stop: bool = False
    id_slot: int = 0
    tokens_predicted: int = 0
    tokens_evaluated: int = 0
    timings: Timings | UnsetType = UNSET
    completion_probabilities: list[CompletionProbability] | UnsetType = UNSET  # this frame's tokens'
    prompt_progress: PromptProgress | UnsetType = UNSET


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


async def native_frames(
    rows: Rows,
    prompts: list[str],
    *,
    return_tokens: bool,
    response_fields: list[str] | None,
    logprobs: list[Logprobs | None],
) -> AsyncIterator[bytes]:
    """One frame per update (with its tokens' probabilities), then each row's whole object
    (without the text and probabilities already sent); every frame carries its prompt's `index`,
    and `logprobs` has one shaper per row. Each frame counts its row's tokens so far, as llama-server's do.
    With return_progress, a row's prefill progress frames come before its first token."""
    predicted = [0] * len(rows.submissions)
    prompt_n = [len(request.prompt) for request in rows.row_requests]
    async for index, event in rows.stream():
        if isinstance(event, Progress):
            yield frame(native_progress_chunk(event, (predicted[index], prompt_n[index]), index))
        elif isinstance(event, Delta):
            shaper = logprobs[index]
            probabilities = shaper.native(event.logprobs) if shaper is not None and event.logprobs else UNSET
            predicted[index] += len(event.tokens)
            counts = (predicted[index], prompt_n[index])
            yield frame(native_chunk(event.text, event.tokens, event.timings, counts, index, probabilities))
        elif isinstance(event, Finished):
            yield frame(
                native_body(
                    event,
                    generation_settings(rows.row_requests[index], rows.model, event.n_max),
                    prompts[index],
                    return_tokens=return_tokens,
                    streamed=True,
                    response_fields=response_fields,
                    index=index,
                )
            )
        else:
            yield error_frame(event.code, event.message, event.kind)
