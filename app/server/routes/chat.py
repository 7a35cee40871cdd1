"""OpenAI chat completions: /v1/chat/completions and /chat/completions."""

from __future__ import annotations

from collections.abc import AsyncIterator

from litestar import Controller, Request, Response, post
from litestar.di import NamedDependency
from litestar.params import JSONBody
from litestar.response import Stream

from app.server import conversation, reasoning, requests, shaping, tools
from app.server.bodies import json_response
from app.server.engine_view import EngineView, require_ready
from app.server.openapi import streamed_or
from app.server.responses import ChatCompletion, InputTokens
from app.server.schemas import ChatRequest
from app.server.service import Rows, start_rows
from app.server.streaming import frame, include_usage, openai_frames, sse


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
        tokens, plan = await conversation.prompt_tokens(request, engine, data)
        prompt_tail = engine.tokenizer.decode(tokens[-8:])
        # a continued message is the answer's text as is: llama-server parses no thinking in it
        prefill = requests.continues_final_message(data.messages, data.continue_final_message)
        writes_thinking = engine.writes_thinking and not prefill
        chosen = data.reasoning_format or engine.settings.server.reasoning_format
        thinking = reasoning.reasoning_for(chosen, writes_thinking, prompt_tail)
        rows = await start_rows(request, engine, data, [tokens], data.n, request.url.path)
        head = shaping.openai_head("chatcmpl", rows.request_id, rows.settings[0].model)
        logprobs = shaping.logprobs_for(engine.tokenizer, rows.row_requests)
        if data.stream:
            return await sse(rows, chat_frames(rows, data, head, logprobs, plan, thinking))
        results = await rows.results()
        return await json_response(
            lambda: shaping.chat_completion(head, results, logprobs, plan, thinking),
            results,
            [],
            engine.settings.server.max_response_bytes,
            shaping.rule_header([r.rule for r in results]),
        )

    @post(
        ["/v1/chat/completions/input_tokens", "/chat/completions/input_tokens"],
        status_code=200,
        name="chat-input-tokens",
    )
    async def input_tokens(
        self, request: Request, engine: NamedDependency[EngineView], data: JSONBody[ChatRequest]
    ) -> InputTokens:
        """The prompt's tokens as the chat template renders the messages and tools (llama-server's)."""
        tokens, _ = await conversation.prompt_tokens(request, engine, data)
        return InputTokens(input_tokens=len(tokens))


async def chat_frames(
    rows: Rows,
    data: ChatRequest,
    head: shaping.OpenAIHead,
    logprobs: list[shaping.Logprobs | None],
    plan: tools.ToolPlan | None,
    thinking: reasoning.Reasoning | None,
) -> AsyncIterator[bytes]:
    """Each choice's role chunk first (no timings), then the OpenAI chunks; `timings` on each
    finish chunk; a choice that may call tools streams its calls as `delta.tool_calls`."""
    for index in range(data.n):
        yield frame(shaping.chat_role_chunk(head, index))
    shapes = [shaper.chat if shaper is not None else None for shaper in logprobs]
    calls = [tools.CallStream(plan) for _ in rows.submissions] if plan is not None and plan.callable else None
    frames = openai_frames(
        rows,
        data.timings_per_token,
        head,
        shaping.chat_chunk,
        shaping.chat_progress_chunk,
        data.n,
        shapes,
        usage_chunk=include_usage(data.stream_options),
        calls=calls,
        thinking=[reasoning.ThinkingStream(thinking) for _ in rows.submissions] if thinking is not None else None,
    )
    async for chunk in frames:
        yield chunk
