"""llama-server's native requests: /completion, /infill, /tokenize, /detokenize and /apply-template."""

from __future__ import annotations

from typing import Any

from msgspec import UNSET

from app.server.chat.request import ChatMessage
from app.server.core import field_policy
from app.server.core.schemas import PromptInput, SamplingFields, WireStruct, with_unhonoured


class CompletionRequest(with_unhonoured("NativeFields", field_policy.NATIVE, SamplingFields), kw_only=True):
    """POST /completion and /completions (native)."""

    prompt: PromptInput
    response_fields: list[str] | None = None


class InfillRequest(with_unhonoured("InfillFields", field_policy.NATIVE, SamplingFields), kw_only=True):
    """POST /infill: the text before and after the gap, other files' text, and the middle's start.

    Typed loosely, so each shape llama-server refuses gets its words (app/server/core/infill.py).
    """

    input_prefix: Any = UNSET
    input_suffix: Any = UNSET
    input_extra: Any = UNSET  # [{"filename": str, "text": str}]
    prompt: Any = ""
    response_fields: list[str] | None = None


class TokenizeRequest(WireStruct, kw_only=True):
    content: str
    add_special: bool = False
    with_pieces: bool = False


class DetokenizeRequest(WireStruct, kw_only=True):
    tokens: list[int]


class ApplyTemplateRequest(WireStruct, kw_only=True):
    messages: list[ChatMessage]
