"""Wire types: llama-server's native request, the OpenAI completion and chat requests.

Unknown fields are ignored, as llama-server ignores them. A field left out takes the profile's
sampling default. `n_predict`, `max_tokens` and `max_completion_tokens` are one setting.
"""

from __future__ import annotations

from typing import Any

import msgspec

LogitBias = dict[str, float | bool] | list[list[int | str | float | bool]]
PromptInput = str | list[int | str]


class SamplingFields(msgspec.Struct, kw_only=True):
    """Fields every completion route accepts (llama-server names)."""

    n_predict: int | None = None
    max_tokens: int | None = None
    max_completion_tokens: int | None = None
    stream: bool = False
    stop: str | list[str] | None = None
    temperature: float | None = None
    top_k: int | None = None
    top_p: float | None = None
    min_p: float | None = None
    repeat_penalty: float | None = None
    repeat_last_n: int | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    xtc_probability: float | None = None
    xtc_threshold: float | None = None
    seed: int | None = None
    ignore_eos: bool = False
    logit_bias: LogitBias | None = None
    n_probs: int = 0
    cache_prompt: bool = True
    timings_per_token: bool = False
    return_tokens: bool = False
    speculative_n_max: int | None = msgspec.field(default=None, name="speculative.n_max")
    speculative_n_min: int | None = msgspec.field(default=None, name="speculative.n_min")
    speculative_p_min: float | None = msgspec.field(default=None, name="speculative.p_min")


class CompletionRequest(SamplingFields, kw_only=True):
    """POST /completion and /completions (native)."""

    prompt: PromptInput
    response_fields: list[str] | None = None


class OpenAICompletionRequest(SamplingFields, kw_only=True):
    """POST /v1/completions."""

    prompt: PromptInput
    model: str | None = None
    n: int = 1
    echo: bool = False
    stream_options: dict[str, Any] | None = None


class ContentPart(msgspec.Struct, kw_only=True):
    type: str
    text: str | None = None


class ChatMessage(msgspec.Struct, kw_only=True):
    role: str
    content: str | list[ContentPart] | None = None


class ChatRequest(SamplingFields, kw_only=True):
    """POST /v1/chat/completions and /chat/completions."""

    messages: list[ChatMessage]
    model: str | None = None
    n: int = 1
    stream_options: dict[str, Any] | None = None
    chat_template_kwargs: dict[str, Any] | None = None


class TokenizeRequest(msgspec.Struct, kw_only=True):
    content: str
    add_special: bool = False
    with_pieces: bool = False


class DetokenizeRequest(msgspec.Struct, kw_only=True):
    tokens: list[int]


class ApplyTemplateRequest(msgspec.Struct, kw_only=True):
    messages: list[ChatMessage]
