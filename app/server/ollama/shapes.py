"""Ollama's answers: chat and generate bodies and their NDJSON lines, the model listings, embeddings
and the `{"error": "..."}` body.

Durations are nanoseconds from the same `timings` every API reports: `prompt_eval_duration` is
`prompt_ms` (queue wait and prefill), `eval_duration` is `predicted_ms`; `total_duration` runs
from the request's arrival to its answer; `load_duration` is 0 (the model loaded at startup).
`prompt_eval_count` is the whole prompt (its cached tokens included, as OpenAI's `prompt_tokens`
here), `eval_count` the tokens generated. `timings` (with the draft block and, when asked,
`timings.speculative`) and `speculative_biased` follow, as on the other APIs.
"""

from __future__ import annotations

import time
from datetime import UTC, datetime
from typing import Any, Literal

import msgspec
from msgspec import UNSET, UnsetType

from app.server.chat.tools import ToolCall, arguments_object
from app.server.core.logprobs import ChatTokenLogprob
from app.server.core.shaping import speculative_biased
from app.server.engine_view import Finished, Timings


class OllamaError(msgspec.Struct, kw_only=True):
    """Every error an Ollama route answers, as Ollama words them: `{"error": "..."}`."""

    error: str


class ToolFunction(msgspec.Struct, kw_only=True):
    index: int
    name: str
    arguments: dict[str, Any]


class OllamaToolCall(msgspec.Struct, kw_only=True):
    id: str
    function: ToolFunction


class AssistantMessage(msgspec.Struct, kw_only=True):
    role: Literal["assistant"] = "assistant"
    content: str
    thinking: str | UnsetType = UNSET
    tool_calls: list[OllamaToolCall] | UnsetType = UNSET


class Answer(msgspec.Struct, kw_only=True):
    """What both routes' lines (and bodies) hold: the model, the time, and on the last line why it
    ended, the durations and counts (then the route's message or response)."""

    model: str
    created_at: str
    done: bool
    done_reason: str | UnsetType = UNSET
    total_duration: int | UnsetType = UNSET
    load_duration: int | UnsetType = UNSET
    prompt_eval_count: int | UnsetType = UNSET
    prompt_eval_duration: int | UnsetType = UNSET
    eval_count: int | UnsetType = UNSET
    eval_duration: int | UnsetType = UNSET
    logprobs: list[ChatTokenLogprob] | UnsetType = UNSET
    timings: Timings | UnsetType = UNSET  # this server's own, as on the other APIs
    speculative_biased: bool | UnsetType = UNSET


class ChatAnswer(Answer, kw_only=True):
    message: AssistantMessage


class GenerateAnswer(Answer, kw_only=True):
    response: str
    thinking: str | UnsetType = UNSET
    context: list[int] | UnsetType = UNSET  # the prompt's and the answer's tokens: a later request's `context`


class Details(msgspec.Struct, kw_only=True):
    parent_model: str = ""
    format: str = "safetensors"
    family: str
    families: list[str]
    parameter_size: str
    quantization_level: str


class TagEntry(msgspec.Struct, kw_only=True):
    name: str
    model: str
    modified_at: str
    size: int
    digest: str
    details: Details


class Tags(msgspec.Struct, kw_only=True):
    models: list[TagEntry]


class RunningEntry(TagEntry, kw_only=True):
    expires_at: str  # far ahead: the model stays loaded while the server runs
    size_vram: int
    context_length: int


class Running(msgspec.Struct, kw_only=True):
    models: list[RunningEntry]


class Show(msgspec.Struct, kw_only=True):
    modelfile: str
    parameters: str
    template: str
    details: Details
    model_info: dict[str, Any]
    capabilities: list[str]
    modified_at: str


class Version(msgspec.Struct, kw_only=True):
    version: str


class Embed(msgspec.Struct, kw_only=True):
    model: str
    embeddings: list[list[float]]
    total_duration: int
    load_duration: int = 0
    prompt_eval_count: int


class Embedding(msgspec.Struct, kw_only=True):
    embedding: list[float]


def created_at() -> str:
    return datetime.now(UTC).isoformat().replace("+00:00", "Z")


def ollama_calls(calls: list[ToolCall]) -> list[OllamaToolCall]:
    """OpenAI's calls in Ollama's shape: arguments as an object (a cut call's as far as they got)."""
    return [
        OllamaToolCall(id=call.id, function=ToolFunction(index=i, name=call.function.name,
                                                         arguments=arguments_object(call)))
        for i, call in enumerate(calls)
    ]  # fmt: skip


def done_reason(result: Finished) -> str:
    return "length" if result.stop_type == "limit" else "stop"


def final(result: Finished, started_ns: int, logprobs: list[ChatTokenLogprob] | None = None) -> dict[str, Any]:
    """The ending fields of `result`'s answer (Answer's), its durations from the row's timings."""
    timings = result.timings
    return {
        "done": True,
        "done_reason": done_reason(result),
        "total_duration": time.perf_counter_ns() - started_ns,
        "load_duration": 0,
        "prompt_eval_count": result.prompt_n,
        "prompt_eval_duration": round(timings.prompt_ms * 1e6),
        "eval_count": len(result.tokens),
        "eval_duration": round(timings.predicted_ms * 1e6),
        "logprobs": UNSET if logprobs is None else logprobs,
        "timings": timings,
        "speculative_biased": speculative_biased([result]),
    }


def line(payload: Any) -> bytes:
    """One NDJSON line."""
    return msgspec.json.encode(payload) + b"\n"
