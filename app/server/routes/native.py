"""llama-server's native completion: /completion and /completions."""

from __future__ import annotations

from typing import Any

from litestar import Controller, Request, Response, post
from litestar.di import NamedDependency
from litestar.params import JSONBody
from litestar.response import Stream

from app.server import offload, shaping
from app.server import prompts as prompt_shapes
from app.server.bodies import json_response
from app.server.engine_view import EngineView, require_ready
from app.server.openapi import streamed_or
from app.server.responses import NativeCompletion
from app.server.schemas import CompletionRequest
from app.server.service import start_rows
from app.server.streaming import native_frames, sse


class NativeCompletionController(Controller):
    tags = ("completion",)
    guards = (require_ready,)

    @post(
        ["/completion", "/completions"],
        status_code=200,
        name="completion",
        responses=streamed_or(
            NativeCompletion, "NativeChunk ones, then this object; a list of prompts answers a list of these"
        ),
    )
    async def completion(
        self, request: Request, engine: NamedDependency[EngineView], data: JSONBody[CompletionRequest]
    ) -> Response | Stream:
        """llama-server's native completion (stream: SSE frames ending with the full object).

        A list of prompts (app/server/prompts.py) answers a list of objects, one per prompt in
        order, each with its `index`; its stream interleaves the prompts' frames.
        """
        prompts = await offload.run(request, prompt_shapes.prompts, data.prompt, engine.tokenizer, engine.vocab_size)
        rows = await start_rows(request, engine, data, [p.tokens for p in prompts], 1, "/completion")
        texts = [p.text for p in prompts]
        logprobs = shaping.logprobs_for(engine.tokenizer, rows.row_requests)
        shape = {"return_tokens": data.return_tokens, "response_fields": data.response_fields}
        if data.stream:
            return await sse(rows, native_frames(rows, texts, logprobs=logprobs, **shape))
        results = await rows.results()

        def body() -> Any:
            shaped = [
                shaping.native_body(result, settings, text, streamed=False, index=index, logprobs=shaper, **shape)
                for index, (result, settings, text, shaper) in enumerate(
                    zip(results, rows.settings, texts, logprobs, strict=True)
                )
            ]
            return shaped[0] if len(shaped) == 1 else shaped

        headers = shaping.rule_header([result.rule for result in results])
        return await json_response(body, results, texts, engine.settings.server.max_response_bytes, headers)
