"""OpenAI text completions: /v1/completions."""

from __future__ import annotations

from collections.abc import AsyncIterator

from litestar import Controller, Request, Response, post
from litestar.di import NamedDependency
from litestar.params import JSONBody
from litestar.response import Stream

from app.server import offload, shaping
from app.server import prompts as prompt_shapes
from app.server.bodies import json_response
from app.server.engine_view import EngineView, require_ready
from app.server.openapi import streamed_or
from app.server.responses import TextCompletion
from app.server.schemas import OpenAICompletionRequest
from app.server.service import Rows, start_rows
from app.server.streaming import frame, include_usage, openai_frames, sse


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
        """OpenAI text completion (stream: SSE chunks ending with `data: [DONE]`).

        `n` choices per prompt, choice index = prompt index x n + choice; `echo` puts each
        prompt's text before its choices' text (in a stream, as each choice's first chunk);
        `logprobs` gives each choice its own (never with `echo`: requests.probs_request).
        """
        prompts = await offload.run(request, prompt_shapes.prompts, data.prompt, engine.tokenizer, engine.vocab_size)
        rows = await start_rows(request, engine, data, [p.tokens for p in prompts], data.n, "/v1/completions")
        echoes = [prompt.text if data.echo else "" for prompt in prompts for _ in range(data.n)]
        head = shaping.openai_head("cmpl", rows.request_id, rows.settings[0].model)
        logprobs = shaping.logprobs_for(engine.tokenizer, rows.row_requests)
        if data.stream:
            return await sse(rows, echoed_frames(rows, data, head, echoes, logprobs))
        results = await rows.results()
        return await json_response(
            lambda: shaping.text_completion_body(head, results, data.n, echoes, logprobs),
            results,
            echoes,
            engine.settings.server.max_response_bytes,
            shaping.rule_header([r.rule for r in results]),
        )


async def echoed_frames(
    rows: Rows,
    data: OpenAICompletionRequest,
    head: shaping.OpenAIHead,
    echoes: list[str],
    logprobs: list[shaping.Logprobs | None],
) -> AsyncIterator[bytes]:
    """With echo, each choice's prompt text first; then the OpenAI chunks."""
    for index, echo in enumerate(echoes):
        if echo:
            yield frame(shaping.text_completion(head, index, echo, None))
    shapes = [shaper.text if shaper is not None else None for shaper in logprobs]
    usage_chunk = include_usage(data.stream_options)
    frames = openai_frames(
        rows,
        data.timings_per_token,
        head,
        shaping.text_completion,
        shaping.text_progress_chunk,
        data.n,
        shapes,
        usage_chunk=usage_chunk,
    )
    async for chunk in frames:
        yield chunk
