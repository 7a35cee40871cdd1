"""OpenAI's routes: /v1/chat/completions, /v1/completions and /v1/models (each also at
llama-server's spelling without /v1 where it serves one)."""

from __future__ import annotations

from litestar import Controller, Request, Response, get, post
from litestar.datastructures import State
from litestar.di import NamedDependency
from litestar.params import FromPath, JSONBody
from litestar.response import Stream

from app.server import offload
from app.server.chat import conversation, reasoning, template, tools
from app.server.chat.conversation import InputTokens
from app.server.chat.request import ChatRequest
from app.server.core import infill
from app.server.core import prompts as prompt_shapes
from app.server.core.bodies import json_response
from app.server.core.logprobs import logprobs_for
from app.server.core.service import start_rows
from app.server.core.shaping import rule_header
from app.server.core.streaming import sse
from app.server.engine_view import EngineView, listed, require_ready
from app.server.errors import ApiError, quoted
from app.server.openai import chat_shapes, shapes
from app.server.openai.chat_shapes import ChatCompletion
from app.server.openai.frames import chat_frames, echoed_frames
from app.server.openai.requests import OpenAICompletionRequest
from app.server.openai.shapes import ModelEntry, ModelList, TextCompletion
from app.server.openapi import error, streamed_or


class ModelsController(Controller):
    tags = ("introspection",)

    # public, as in llama-server: a client may list the model before it has the key
    @get(["/v1/models", "/models"], name="models", opt={"public": True})
    async def models(self, state: State) -> ModelList:
        """The models this server serves, loaded or not (their size facts while loaded)."""
        return shapes.model_list(listed(state))

    @get(
        "/v1/models/{model_id:path}",
        name="model",
        opt={"public": True},
        responses={404: error("an id other than a served model's")},
    )
    async def model(self, state: State, model_id: FromPath[str]) -> ModelEntry:
        """OpenAI's models.retrieve: a served model by its id; any other id is a 404."""
        entries = [shapes.model_entry(model) for model in listed(state)]
        wanted = model_id.removeprefix("/")
        found = next((entry for entry in entries if entry.id == wanted), None)
        if found is None:
            served = ", ".join(repr(entry.id) for entry in entries)
            raise ApiError(404, f"The model {quoted(wanted)} does not exist; this server serves {served}")
        return found


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

        `n` choices per prompt, choice index = prompt index x n + choice; a non-empty `suffix`
        fills in the middle between each prompt and it (400 where the model has no FIM tokens); `echo` puts each
        prompt's text before its choices' text (in a stream, as each choice's first chunk);
        `logprobs` gives each choice its own (never with `echo`: requests.probs_request).
        """
        if data.suffix:  # fill in the middle, from each prompt up to the suffix (app/server/core/infill.py)
            prompts = await offload.run(
                request,
                infill.suffix_prompts,
                data.prompt,
                data.suffix,
                engine.tokenizer,
                engine.vocab_size,
                engine.context_limit,
                engine.settings.sampling.n_predict,
            )
        else:
            prompts = await offload.run(
                request, prompt_shapes.prompts, data.prompt, engine.tokenizer, engine.vocab_size
            )
        rows = await start_rows(request, engine, data, [p.tokens for p in prompts], data.n, "/v1/completions")
        echoes = [prompt.text if data.echo else "" for prompt in prompts for _ in range(data.n)]
        head = shapes.openai_head("cmpl", rows.request_id, rows.model)
        logprobs = logprobs_for(engine.tokenizer, rows.row_requests)
        if data.stream:
            return await sse(rows, echoed_frames(rows, data, head, echoes, logprobs))
        results = await rows.results()
        return await json_response(
            lambda: shapes.text_completion_body(head, results, data.n, echoes, logprobs),
            results,
            echoes,
            engine.settings.server.max_response_bytes,
            rule_header([r.rule for r in results]),
        )


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
        prefill = template.continues_final_message(data.messages, data.continue_final_message)
        writes_thinking = engine.writes_thinking and not prefill
        chosen = data.reasoning_format or engine.settings.server.reasoning_format
        thinking = reasoning.reasoning_for(chosen, writes_thinking, prompt_tail)
        rows = await start_rows(request, engine, data, [tokens], data.n, request.url.path, tools.forced_schema(plan))
        head = shapes.openai_head("chatcmpl", rows.request_id, rows.model)
        logprobs = logprobs_for(engine.tokenizer, rows.row_requests)
        if data.stream:
            return await sse(rows, chat_frames(rows, data, head, logprobs, plan, thinking))
        results = await rows.results()
        return await json_response(
            lambda: chat_shapes.chat_completion(head, results, logprobs, plan, thinking),
            results,
            [],
            engine.settings.server.max_response_bytes,
            rule_header([r.rule for r in results]),
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
