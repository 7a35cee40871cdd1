"""Anthropic's Messages API: /v1/messages and /v1/messages/count_tokens."""

from __future__ import annotations

from collections.abc import AsyncIterator

from litestar import Controller, Request, Response, post
from litestar.di import NamedDependency
from litestar.params import JSONBody
from litestar.response import Stream

from app.server.anthropic import shapes
from app.server.anthropic.requests import MessagesRequest, chat_request
from app.server.anthropic.shapes import MessageBody, TextBlock, TokenCount
from app.server.chat import conversation
from app.server.chat.conversation import Conversation
from app.server.core.bodies import json_response
from app.server.core.shaping import rule_header
from app.server.core.streaming import sse
from app.server.engine_view import Delta, EngineView, Finished, require_ready
from app.server.openapi import streamed_or


class MessagesController(Controller):
    tags = ("anthropic",)
    guards = (require_ready,)

    @post(
        "/v1/messages",
        status_code=200,
        name="messages",
        responses=streamed_or(MessageBody, "message_start, content blocks, message_delta, message_stop"),
    )
    async def messages(
        self, request: Request, engine: NamedDependency[EngineView], data: JSONBody[MessagesRequest]
    ) -> Response | Stream:
        """A Messages answer through the chat pipeline; `timings` ride on the body or on message_delta."""
        chat = await conversation.start(request, engine, chat_request(data), allow_empty=True)
        model = chat.rows.model
        if data.stream:
            return await sse(chat.rows, message_events(chat, model))
        (result,) = await chat.rows.results()
        return await json_response(
            lambda: shapes.message(chat.rows.request_id, model, result, chat.plan),
            [result],
            [],
            engine.settings.server.max_response_bytes,
            rule_header([result.rule]),
        )

    @post("/v1/messages/count_tokens", status_code=200, name="messages-count-tokens")
    async def count_tokens(
        self, request: Request, engine: NamedDependency[EngineView], data: JSONBody[MessagesRequest]
    ) -> TokenCount:
        """The prompt's tokens as the model's chat template renders the messages, system and tools."""
        tokens, _ = await conversation.prompt_tokens(request, engine, chat_request(data), allow_empty=True)
        return TokenCount(input_tokens=len(tokens))


async def message_events(chat: Conversation, model: str) -> AsyncIterator[bytes]:
    """message_start, the content block (text streamed as it comes; a possible tool call held
    back and sent whole), message_delta with the stop reason, usage and timings, message_stop."""
    yield shapes.message_start(chat.rows.request_id, model, chat.prompt_tokens)
    if not chat.may_call:
        yield shapes.block_start(0, TextBlock(text=""))
    yield shapes.event({"type": "ping"})
    async for event in conversation.events(chat):
        if isinstance(event, Delta):
            if event.text:
                yield shapes.text_delta(0, event.text)
        elif isinstance(event, Finished):
            blocks = shapes.content(event, chat.plan)
            if chat.may_call:
                for index, block in enumerate(blocks):
                    for frame in shapes.block_whole(index, block):
                        yield frame
            else:
                yield shapes.block_stop(0)
            for frame in shapes.message_end(event, blocks):
                yield frame
        else:
            yield shapes.error_event(event.kind, event.message)
