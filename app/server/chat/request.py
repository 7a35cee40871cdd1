"""OpenAI's chat request: the one every chat-shaped API runs as (Anthropic's Messages and OpenAI's
Responses are translated into it, app/server/chat/conversation.py), and the messages
llama-server's /apply-template renders."""

from __future__ import annotations

from typing import Any

from app.sampling.logprobs import MAX_TOP
from app.server.core import field_policy
from app.server.core.schemas import ContentPart, ResponseFormat, SamplingFields, WireStruct, with_unhonoured
from app.server.errors import ApiError


class ChatMessage(WireStruct, kw_only=True):
    role: str
    content: str | list[ContentPart] | None = None
    tool_calls: list[dict[str, Any]] | None = None  # an assistant's calls, for the template
    tool_call_id: str | None = None  # a tool message: the call it answers
    reasoning_content: str | None = None  # an assistant's past thinking, for templates that show it
    name: str | None = None


class ToolFunction(WireStruct, kw_only=True):
    name: str
    description: str | None = None
    parameters: dict[str, Any] | None = None  # a JSON schema; the call's arguments follow it


class Tool(WireStruct, kw_only=True):
    type: str = "function"
    function: ToolFunction


class ChatRequest(with_unhonoured("ChatFields", field_policy.CHAT, SamplingFields), kw_only=True):
    """POST /v1/chat/completions and /chat/completions."""

    messages: list[ChatMessage]
    model: str | None = None
    n: int = 1
    logprobs: bool | None = None
    top_logprobs: int | None = None  # OpenAI: 0..20, with logprobs
    stream_options: dict[str, Any] | None = None
    chat_template_kwargs: dict[str, Any] | None = None
    # false: the template ends after the last message, with no assistant turn opened (llama-server's);
    # left out: true (explicitly true beside continue_final_message: true is a 400, conversation.prompt_tokens)
    add_generation_prompt: bool | None = None
    continue_final_message: bool | None = None  # template.continues_final_message (assistant prefill)
    reasoning_effort: str | None = None  # OpenAI's: a chat-template variable (template.template_kwargs)
    reasoning_format: str | None = None  # llama-server's: thinking parsed into reasoning_content (reasoning.py)
    response_format: ResponseFormat | None = None
    tools: list[Tool] | None = None  # app/server/chat/tools.py
    tool_choice: str | dict[str, Any] | None = None
    parallel_tool_calls: bool | None = None  # left out: OpenAI's true (app/server/chat/tools.py)

    def asked_logprobs(self) -> tuple[int, bool]:
        """OpenAI chat's spelling: `logprobs` with `top_logprobs`; without `logprobs`, llama-server's."""
        if self.top_logprobs is not None and not self.logprobs:
            raise ApiError(400, "top_logprobs requires logprobs to be set to true")
        if not self.logprobs:
            return super().asked_logprobs()
        top = self.top_logprobs or 0
        if not 0 <= top <= MAX_TOP:
            raise ApiError(400, f"top_logprobs must be within [0, {MAX_TOP}], got {top}")
        return top, True
