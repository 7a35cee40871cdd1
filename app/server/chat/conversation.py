"""One conversation through the chat pipeline: the routes that speak another API's chat shape
(Anthropic's Messages, OpenAI's Responses) translate their request into a ChatRequest and run it
here, so the chat template, tools, grammar, sampling and speculation are the chat route's own."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any, Literal

import msgspec
from litestar import Request

from app.server import offload
from app.server.chat import template, tools
from app.server.chat.request import ChatRequest
from app.server.chat.tools import ToolPlan
from app.server.core import requests
from app.server.core.service import Rows, start_rows
from app.server.engine_view import Delta, EngineView, Failed, Finished
from app.server.errors import ApiError


class InputTokens(msgspec.Struct, kw_only=True):
    """POST .../input_tokens: the prompt's tokens as the request would render them (OpenAI's shape)."""

    object: Literal["response.input_tokens"] = "response.input_tokens"
    input_tokens: int


def translated(body: dict[str, Any], api: str) -> ChatRequest:
    """Another API's request, translated to `body`, as the chat route's request. The translations
    check the fields they read; anything else the chat request cannot hold is still the client's
    error (400, naming the chat field), never a 500."""
    try:
        return msgspec.convert(body, ChatRequest)
    except msgspec.ValidationError as exc:
        raise ApiError(400, f"this {api} request does not make a chat request: {exc}") from exc


@dataclass
class Conversation:
    """The one row of a chat request in flight, the tools its output may call, its prompt's length."""

    rows: Rows
    plan: ToolPlan | None
    prompt_tokens: int

    @property
    def may_call(self) -> bool:
        """Whether the output may turn out to be a tool call (only the whole output tells)."""
        return self.plan is not None and bool(self.plan.callable)


async def prompt_tokens(
    request: Request, engine: EngineView, data: ChatRequest, allow_empty: bool = False
) -> tuple[list[int], ToolPlan | None]:
    """The chat template applied to the request's messages and tools, off the event loop
    (app/server/offload.py; a final assistant message continued: template.continues_final_message);
    `allow_empty`: no messages is a conversation too (Anthropic's Messages, as llama-server serves
    them)."""
    tools.check_count(data, engine.settings.grammar.max_tools)
    if data.add_generation_prompt and data.continue_final_message:  # a new turn and the last one continued
        raise ApiError(400, "Cannot set both add_generation_prompt and continue_final_message to true.")
    plan = tools.tool_plan(data)
    template_tools = plan.template_tools() if plan else None

    def render() -> list[int]:
        tokens = template.chat_prompt(
            data.messages,
            engine.tokenizer,
            template.template_kwargs(data),
            engine.settings,
            tools=template_tools,
            prefill=template.continues_final_message(data.messages, data.continue_final_message),
            generation_prompt=data.add_generation_prompt is not False,
            allow_empty=allow_empty,
        )
        requests.check_token_ids(tokens, engine.vocab_size)
        return tokens

    return await offload.run(request, render), plan


async def start(request: Request, engine: EngineView, data: ChatRequest, allow_empty: bool = False) -> Conversation:
    tokens, plan = await prompt_tokens(request, engine, data, allow_empty)
    rows = await start_rows(request, engine, data, [tokens], 1, request.url.path, tools.forced_schema(plan))
    return Conversation(rows, plan, len(tokens))


async def events(conversation: Conversation) -> AsyncIterator[Delta | Finished | Failed]:
    """The row's events; when the output may be a tool call its text is held back and arrives
    whole on the Finished event (a call is known only once the output ends), so a route never
    streams the raw call as text."""
    async for _, event in conversation.rows.stream():
        if isinstance(event, Delta) and conversation.may_call:
            continue
        yield event
