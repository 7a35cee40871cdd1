"""OpenAI chat completions: /v1/chat/completions and /chat/completions."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from typing import Any

from litestar import Request, Response, post
from litestar.params import JSONBody
from litestar.response import Stream

from app.server import requests
from app.server.errors import ApiError
from app.server.routes.completions import finish_reason, openai_frames, start, usage
from app.server.schemas import ChatRequest
from app.server.service import Submission, ready_engine
from app.server.streaming import REQUEST_ID, frame, sse


def choice(text: str | None, reason: str | None) -> dict[str, Any]:
    delta = {"content": text} if text is not None else {}
    return {"index": 0, "delta": delta, "logprobs": None, "finish_reason": reason}


async def chat_frames(submission: Submission, data: ChatRequest, head: dict[str, Any]) -> AsyncIterator[bytes]:
    """The role chunk first (no timings), then the OpenAI chunks; `timings` on the finish chunk."""
    role = {"index": 0, "delta": {"role": "assistant", "content": ""}, "logprobs": None, "finish_reason": None}
    yield frame({**head, "choices": [role]})
    async for chunk in openai_frames(submission, data.timings_per_token, head, choice):
        yield chunk


@post(["/v1/chat/completions", "/chat/completions"], status_code=200, name="chat-completion")
async def chat_completion(request: Request, data: JSONBody[ChatRequest]) -> Response | Stream:
    """Chat through the model's chat template; `timings` rides on the body or the finish chunk."""
    engine = ready_engine(request)
    if data.n != 1:
        raise ApiError(400, "only n = 1 is supported")
    tokens = await asyncio.to_thread(
        requests.chat_prompt, data.messages, engine.model.tokenizer, data.chat_template_kwargs, engine.settings
    )
    requests.check_token_ids(tokens, engine.model.vocab_size)
    submission, settings = start(request, data, tokens, request.url.path)
    rid = submission.job.request_id
    head = {
        "id": f"chatcmpl-{rid}",
        "object": "chat.completion.chunk",
        "created": int(time.time()),
        "model": settings["model"],
    }
    if data.stream:
        return sse(chat_frames(submission, data, head), rid)
    result = await submission.result()
    message = {"role": "assistant", "content": result.text}
    body = {
        **head,
        "object": "chat.completion",
        "choices": [{"index": 0, "message": message, "logprobs": None, "finish_reason": finish_reason(result)}],
        "usage": usage(result),
        "timings": result.timings,
    }
    return Response(body, headers={REQUEST_ID: rid})


ROUTES = [chat_completion]
