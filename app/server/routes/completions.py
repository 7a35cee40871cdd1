"""OpenAI text completions: /v1/completions."""

from __future__ import annotations

import asyncio

from litestar import Controller, Request, Response, post
from litestar.di import NamedDependency
from litestar.params import JSONBody
from litestar.response import Stream

from app.server import requests, shaping
from app.server.engine_view import EngineView, require_ready
from app.server.errors import ApiError
from app.server.openapi import streamed_or
from app.server.responses import TextCompletion
from app.server.schemas import OpenAICompletionRequest, PromptInput
from app.server.service import start
from app.server.streaming import REQUEST_ID, openai_frames, sse


class OpenAICompletionController(Controller):
    tags = ("openai",)
    guards = (require_ready,)

    @post(
        "/v1/completions",
        status_code=200,
        name="openai-completion",
        responses=streamed_or(TextCompletion, "TextCompletion chunks, usage on the last, then `[DONE]`"),
    )
    async def openai_completion(
        self, request: Request, engine: NamedDependency[EngineView], data: JSONBody[OpenAICompletionRequest]
    ) -> Response | Stream:
        """OpenAI text completion (stream: SSE chunks ending with `data: [DONE]`)."""
        tokens = await asyncio.to_thread(requests.prompt_tokens, one_prompt(data), engine.tokenizer, engine.vocab_size)
        submission, settings = start(request, engine, data, tokens, "/v1/completions")
        rid = submission.job.request_id
        head = shaping.openai_head("cmpl", rid, settings.model)
        logprobs = shaping.logprobs_for(engine.tokenizer, submission.job.request.probs)
        if data.stream:
            shape = logprobs.text if logprobs is not None else None
            return sse(openai_frames(submission, data.timings_per_token, head, shaping.text_completion, shape), rid)
        result = await submission.result()
        body = shaping.text_completion(
            head,
            result.text,
            shaping.finish_reason(result),
            shaping.usage(result),
            result.timings,
            logprobs.text(result.logprobs) if logprobs is not None else None,
        )
        return Response(body, headers={REQUEST_ID: rid})


def one_prompt(data: OpenAICompletionRequest) -> PromptInput:
    """The one prompt of the request (OpenAI's list of strings may hold only one here)."""
    if data.n != 1:
        raise ApiError(400, "only n = 1 is supported")
    if data.echo:
        raise ApiError(400, "echo is not supported")
    if isinstance(data.prompt, list) and data.prompt and all(isinstance(p, str) for p in data.prompt):
        if len(data.prompt) != 1:
            raise ApiError(400, "one prompt per request is supported")
        return data.prompt[0]
    return data.prompt
