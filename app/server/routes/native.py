"""llama-server's native completion: /completion and /completions."""

from __future__ import annotations

import asyncio

from litestar import Controller, Request, Response, post
from litestar.di import NamedDependency
from litestar.params import JSONBody
from litestar.response import Stream

from app.server import requests, shaping
from app.server.engine_view import EngineView, require_ready
from app.server.openapi import streamed_or
from app.server.responses import NativeCompletion
from app.server.schemas import CompletionRequest
from app.server.service import start
from app.server.streaming import REQUEST_ID, native_frames, sse


class NativeCompletionController(Controller):
    tags = ("completion",)
    guards = (require_ready,)

    @post(
        ["/completion", "/completions"],
        status_code=200,
        name="completion",
        responses=streamed_or(NativeCompletion, "NativeChunk ones, then this object"),
    )
    async def completion(
        self, request: Request, engine: NamedDependency[EngineView], data: JSONBody[CompletionRequest]
    ) -> Response | Stream:
        """llama-server's native completion (stream: SSE frames ending with the full object)."""
        tokenizer = engine.tokenizer
        tokens = await asyncio.to_thread(requests.prompt_tokens, data.prompt, tokenizer, engine.vocab_size)
        submission, settings = start(request, engine, data, tokens, "/completion")
        prompt = data.prompt if isinstance(data.prompt, str) else tokenizer.decode(tokens)
        rid = submission.job.request_id
        logprobs = shaping.logprobs_for(tokenizer, submission.job.request.probs)
        shape = {"return_tokens": data.return_tokens, "response_fields": data.response_fields, "logprobs": logprobs}
        if data.stream:
            return sse(native_frames(submission, settings, prompt, **shape), rid)
        result = await submission.result()
        body = shaping.native_body(result, settings, prompt, streamed=False, **shape)
        return Response(body, headers={REQUEST_ID: rid})
