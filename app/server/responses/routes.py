"""OpenAI's Responses API: /v1/responses and /responses, and their input_tokens."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass

from litestar import Controller, Request, Response, post
from litestar.di import NamedDependency
from litestar.params import JSONBody
from litestar.response import Stream

from app.server.auth import tenant_of
from app.server.chat import conversation
from app.server.chat.conversation import Conversation, InputTokens
from app.server.chat.request import ChatRequest
from app.server.core.bodies import json_response
from app.server.core.shaping import rule_header
from app.server.core.streaming import sse
from app.server.engine_view import Delta, EngineView, Finished, require_ready
from app.server.openapi import streamed_or
from app.server.responses import requests, shapes
from app.server.responses.requests import ResponsesRequest
from app.server.responses.shapes import MessageItem, ResponseBody
from app.server.responses.store import ResponseStore, stored_conversation


@dataclass
class Answer:
    """One response being made: its request, its chat form, its row, and where it is stored."""

    request: ResponsesRequest
    chat_request: ChatRequest
    chat: Conversation
    store: ResponseStore
    tenant: str
    id: str
    created: int

    @property
    def item_id(self) -> str:
        return self.chat.rows.request_id

    def body(self, result: Finished | None, items: list[shapes.OutputItem]) -> ResponseBody:
        rows = self.chat.rows
        ran = rows.row_requests[0].sampling
        return shapes.body(self.id, self.request, rows.model, ran, self.created, result, items)

    def finish(self, result: Finished) -> list[shapes.OutputItem]:
        """The output items of the finished row; a stored response keeps its conversation."""
        items = shapes.output(result, self.chat.plan, self.item_id)
        if self.request.store:
            self.store.keep(self.tenant, self.id, stored_conversation(self.chat_request, items))
        return items


class ResponsesController(Controller):
    tags = ("openai",)
    guards = (require_ready,)

    @post(
        ["/v1/responses", "/responses"],
        status_code=200,
        name="responses",
        responses=streamed_or(ResponseBody, "response.created … response.completed (or response.incomplete)"),
    )
    async def create(
        self, request: Request, engine: NamedDependency[EngineView], data: JSONBody[ResponsesRequest]
    ) -> Response | Stream:
        """A response through the chat pipeline; `timings` ride on the response object."""
        store: ResponseStore = request.app.state.responses
        tenant = tenant_of(request)
        chat_request = requests.chat_request(data, store.history(tenant, data.previous_response_id))
        chat = await conversation.start(request, engine, chat_request)
        answer = Answer(data, chat_request, chat, store, tenant, shapes.response_id(), shapes.now())
        if data.stream:
            return await sse(chat.rows, response_events(answer))
        (result,) = await chat.rows.results()
        items = answer.finish(result)
        return await json_response(
            lambda: answer.body(result, items),
            [result],
            [],
            engine.settings.server.max_response_bytes,
            rule_header([result.rule]),
        )

    @post(["/v1/responses/input_tokens", "/responses/input_tokens"], status_code=200, name="responses-input-tokens")
    async def input_tokens(
        self, request: Request, engine: NamedDependency[EngineView], data: JSONBody[ResponsesRequest]
    ) -> InputTokens:
        """The prompt's tokens the response would start from: instructions, the stored conversation
        `previous_response_id` continues, the input and the tools, as the chat template renders them."""
        store: ResponseStore = request.app.state.responses
        history = store.history(tenant_of(request), data.previous_response_id)
        tokens, _ = await conversation.prompt_tokens(request, engine, requests.chat_request(data, history))
        return InputTokens(input_tokens=len(tokens))


async def response_events(answer: Answer) -> AsyncIterator[bytes]:
    """response.created and .in_progress; the output item (text streamed as it comes, a possible
    function call held back and sent whole); response.completed, or .incomplete at the token limit."""
    events = shapes.Events()
    yield events.event("response.created", response=answer.body(None, []))
    yield events.event("response.in_progress", response=answer.body(None, []))
    if not answer.chat.may_call:
        for frame in events.text_start(answer.item_id):
            yield frame
    async for event in conversation.events(answer.chat):
        if isinstance(event, Delta):
            if event.text:
                yield events.text_delta(answer.item_id, event.text)
        elif isinstance(event, Finished):
            items = answer.finish(event)
            if answer.chat.may_call and isinstance(items[0], MessageItem):  # held back, and no call after all
                text = items[0].content[0].text  # the item's text (none for a forced call's cut output)
                for frame in [*events.text_start(answer.item_id), events.text_delta(answer.item_id, text)]:
                    yield frame
            for index, item in enumerate(items):
                for frame in events.item_done(item, index):
                    yield frame
            done = answer.body(event, items)
            kind = "response.incomplete" if done.status == "incomplete" else "response.completed"
            yield events.event(kind, response=done)
        else:
            yield events.error(event.code, event.message, event.kind)
