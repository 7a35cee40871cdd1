"""OpenAI chat completions: /v1/chat/completions and /chat/completions."""

from __future__ import annotations

from collections.abc import AsyncIterator

from litestar import Controller, Request, Response, post
from litestar.di import NamedDependency
from litestar.params import JSONBody
from litestar.response import Stream

from app.server import conversation, shaping
from app.server.bodies import json_response
from app.server.engine_view import EngineView, require_ready
from app.server.errors import ApiError
from app.server.openapi import streamed_or
from app.server.responses import ChatCompletion
from app.server.schemas import ChatRequest
from app.server.service import Rows, start_rows
from app.server.streaming import frame, openai_frames, sse


class ChatController(Controller):
    tags = ("openai",)
    guards = (require_ready,)

    @post(
        ["/v1/chat/completions", "/chat/completions"],
        status_code=200,
        name="chat-completion",
        responses=streamed_or(ChatCompletion, "ChatCompletionChunk ones, usage on the last, then `[DONE]`"),
    )
    async def chat_completion(
        self, request: Request, engine: NamedDependency[EngineView], data: JSONBody[ChatRequest]
    ) -> Response | Stream:
        """Chat through the model's chat template; `timings` rides on the body or the finish chunk."""
        tokens, plan = await conversation.prompt_tokens(engine, data)
        if plan is not None and plan.callable and data.stream:
            raise ApiError(400, 'stream: streaming tool calls is not supported yet; stream false or tool_choice "none"')
        rows = await start_rows(request, engine, data, [tokens], data.n, request.url.path)
        head = shaping.openai_head("chatcmpl", rows.request_id, rows.settings[0].model)
        logprobs = shaping.logprobs_for(engine.tokenizer, rows.row_requests)
        if data.stream:
            return await sse(rows, chat_frames(rows, data.timings_per_token, head, data.n, logprobs))
        results = await rows.results()
        return await json_response(
            lambda: shaping.chat_completion(head, results, logprobs, plan),
            results,
            [],
            engine.settings.server.max_response_bytes,
            shaping.rule_header([r.rule for r in results]),
        )


async def chat_frames(
    rows: Rows, per_token: bool, head: shaping.OpenAIHead, n: int, logprobs: list[shaping.Logprobs | None]
) -> AsyncIterator[bytes]:
    """Each choice's role chunk first (no timings), then the OpenAI chunks; `timings` on each finish chunk."""
    for index in range(n):
        yield frame(shaping.chat_role_chunk(head, index))
    shapes = [shaper.chat if shaper is not None else None for shaper in logprobs]
    async for chunk in openai_frames(rows, per_token, head, shaping.chat_chunk, n, shapes):
        yield chunk
