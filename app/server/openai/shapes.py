"""OpenAI's answers: the model list, what every body and chunk repeats (id, model, usage), and
the text completion's body and stream chunks (the chat's: chat_shapes.py)."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Literal

import msgspec
from msgspec import UNSET, UnsetType

from app import __version__
from app.server.core.logprobs import Logprobs, TextLogprobs
from app.server.core.shaping import PromptProgress, model_alias, prompt_progress, shown_path, speculative_biased
from app.server.engine_view import Finished, Listed, Progress, Timings

# --- models -----------------------------------------------------------------------------------


class ModelMeta(msgspec.Struct, kw_only=True):
    path: str
    n_vocab: int | UnsetType = UNSET  # known once the model is loaded
    n_ctx_train: int | UnsetType = UNSET


class ModelStatus(msgspec.Struct, kw_only=True):
    value: str  # loaded, loading, unloaded (llama-server's router mode)


class ModelEntry(msgspec.Struct, kw_only=True):
    id: str
    object: Literal["model"] = "model"
    created: int
    owned_by: str = "mlxcel"
    meta: ModelMeta
    status: ModelStatus | UnsetType = UNSET  # with a router only


class ModelName(msgspec.Struct, kw_only=True):
    name: str
    model: str


class ModelList(msgspec.Struct, kw_only=True):
    """OpenAI's list (`data`) and llama-server's (`models`) in one body."""

    object: Literal["list"] = "list"
    data: list[ModelEntry]
    models: list[ModelName]


def model_list(models: list[Listed]) -> ModelList:
    entries = [model_entry(model) for model in models]
    return ModelList(data=entries, models=[ModelName(name=entry.id, model=entry.id) for entry in entries])


def model_entry(model: Listed) -> ModelEntry:
    """A served model as OpenAI's model object (its size facts while it is loaded; with a
    router, its status as llama-server's router mode gives it)."""
    settings, engine = model.settings, model.engine
    path = shown_path(settings, settings.target.model)
    meta = ModelMeta(path=path)
    if engine is not None:
        meta = ModelMeta(path=path, n_vocab=engine.vocab_size, n_ctx_train=engine.context_limit)
    status = UNSET if model.status is None else ModelStatus(value=str(model.status))
    return ModelEntry(id=model_alias(settings), created=int(time.time()), meta=meta, status=status)


# --- what every body and chunk repeats --------------------------------------------------------


class PromptTokensDetails(msgspec.Struct, kw_only=True):
    cached_tokens: int  # prompt tokens restored from the prompt cache


class Usage(msgspec.Struct, kw_only=True):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    prompt_tokens_details: PromptTokensDetails


SYSTEM_FINGERPRINT = f"mlxcel-{__version__}"


class OpenAIObject(msgspec.Struct, kw_only=True):
    """What every OpenAI body and chunk starts with (subclasses fix `object`, keeping its place)."""

    id: str
    object: str
    created: int
    model: str
    # the server build that answered, as llama-server sends its build (OpenAI: the backend configuration)
    system_fingerprint: str = SYSTEM_FINGERPRINT


class OpenAIChunk(OpenAIObject, kw_only=True):
    """A text completion (its body and its stream's chunks) or a chat stream's chunk: what rides
    beside the choices is each sometimes absent (usage on the finish chunk, prompt_progress on a
    prefill progress chunk); subclasses name their choices' type, keeping the field's place."""

    choices: list[Any]
    usage: Usage | UnsetType = UNSET
    timings: Timings | UnsetType = UNSET
    speculative_biased: bool | UnsetType = UNSET  # a drafter ran: did the stream follow the argmax at T > 0?
    prompt_progress: PromptProgress | UnsetType = UNSET  # a stream's prefill progress chunk


@dataclass(frozen=True)
class OpenAIHead:
    """What every OpenAI body and chunk of one request repeats."""

    id: str
    created: int
    model: str


def openai_head(prefix: str, request_id: str, model: str) -> OpenAIHead:
    return OpenAIHead(id=f"{prefix}-{request_id}", created=int(time.time()), model=model)


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


@dataclass(frozen=True)
class ChoiceUpdate:
    """What one stream chunk says of one choice, in either API's stream: new text (None: none),
    or the finish reason, and the text's tokens' log-probabilities in the route's shape."""

    index: int
    text: str | None
    reason: str | None = None
    logprobs: Any = None


# --- text completions -------------------------------------------------------------------------


class TextChoice(msgspec.Struct, kw_only=True):
    text: str
    index: int = 0
    logprobs: TextLogprobs | None = None
    finish_reason: str | None


class TextCompletion(OpenAIChunk, kw_only=True):
    """OpenAI's text completion; as a stream chunk, usage only on the finish chunk."""

    object: Literal["text_completion"] = "text_completion"
    choices: list[TextChoice]


def text_completion(
    head: OpenAIHead, update: ChoiceUpdate, usage: Usage | UnsetType = UNSET, timings: Timings | UnsetType = UNSET
) -> TextCompletion:
    """An update chunk (text, and its tokens' log-probabilities) or the finish chunk (reason) of one choice."""
    choice = TextChoice(
        text=update.text or "", index=update.index, logprobs=update.logprobs, finish_reason=update.reason
    )
    return TextCompletion(
        id=head.id, created=head.created, model=head.model, choices=[choice], usage=usage, timings=timings
    )


def text_progress_chunk(head: OpenAIHead, index: int, progress: Progress) -> TextCompletion:
    """A prefill progress chunk of choice `index`, as llama-server sends one: no text yet, `prompt_progress`."""
    chunk = text_completion(head, ChoiceUpdate(index, ""))
    return msgspec.structs.replace(chunk, prompt_progress=prompt_progress(progress))


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
