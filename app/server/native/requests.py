"""llama-server's native requests: /completion, /tokenize, /detokenize and /apply-template."""

from __future__ import annotations

from app.server.chat.request import ChatMessage
from app.server.core import field_policy
from app.server.core.schemas import PromptInput, SamplingFields, WireStruct, with_unhonoured


class CompletionRequest(with_unhonoured("NativeFields", field_policy.NATIVE, SamplingFields), kw_only=True):
    """POST /completion and /completions (native)."""

    prompt: PromptInput
    response_fields: list[str] | None = None


class TokenizeRequest(WireStruct, kw_only=True):
    content: str
    add_special: bool = False
    with_pieces: bool = False


class DetokenizeRequest(WireStruct, kw_only=True):
    tokens: list[int]


class ApplyTemplateRequest(WireStruct, kw_only=True):
    messages: list[ChatMessage]
