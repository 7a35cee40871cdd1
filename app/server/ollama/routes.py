"""Ollama's API: /api/chat, /api/generate (NDJSON lines unless `stream: false`), /api/tags, /api/show,
/api/ps, /api/embed and /api/embeddings, /api/version; the model-management routes answer 501.

A chat or generate request runs the path every API runs: translated into the chat route's request
(app/server/ollama/requests.py), its prompt rendered by the chat template, its rows submitted and
awaited (app/server/core/service.py), so sampling, grammar, tools, thinking and speculation are
the chat route's. Every error is Ollama's `{"error": "..."}`, with the status the other APIs give
it (a stream's failure, a last line of that shape).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable
from functools import partial
from pathlib import Path
from typing import Any

import msgspec
from litestar import Controller, Request, Response, delete, get, post
from litestar.datastructures import State
from litestar.di import NamedDependency
from litestar.enums import MediaType
from litestar.openapi import ResponseSpec
from litestar.params import FromPath, JSONBody
from litestar.response import Stream
from msgspec import UNSET

from app.loading import chat_template
from app.loading.model_facts import ModelFacts, model_facts, parameter_size
from app.profiles.schema import Settings
from app.sampling.logprobs import TokenLogprob
from app.server import offload
from app.server.chat import conversation, reasoning, template
from app.server.chat.reasoning import Reasoning, ThinkingStream, split
from app.server.chat.request import ChatRequest
from app.server.chat.tools import CallStream, ToolPlan, forced_schema, tool_calls
from app.server.core import infill
from app.server.core import prompts as prompt_shapes
from app.server.core import requests as core_requests
from app.server.core.bodies import json_response
from app.server.core.logprobs import ChatTokenLogprob, Logprobs, logprobs_for
from app.server.core.service import Rows, start_rows
from app.server.core.shaping import model_alias, rule_header
from app.server.core.streaming import HEADERS
from app.server.embeddings import requests as embedding_requests
from app.server.embeddings.requests import EmbeddingRequest
from app.server.embeddings.routes import answer as embedding_answer
from app.server.engine_view import Delta, EngineView, Finished, Progress, listed, require_ready
from app.server.errors import HANDLERS, ApiError, quoted
from app.server.native.requests import CompletionRequest
from app.server.ollama import requests, shapes
from app.server.ollama.requests import (
    OllamaChatRequest,
    OllamaEmbedRequest,
    OllamaGenerateRequest,
    OllamaShowRequest,
    Options,
)
from app.server.ollama.shapes import (
    AssistantMessage,
    ChatAnswer,
    Details,
    Embed,
    Embedding,
    GenerateAnswer,
    OllamaError,
    Running,
    RunningEntry,
    Show,
    TagEntry,
    Tags,
    Version,
)

# The Ollama release whose API these routes follow (compat/ollama/): clients read it to know what they may send
OLLAMA_VERSION = "0.13.0"
NDJSON = "application/x-ndjson"
FOREVER = "9999-12-31T23:59:59Z"  # /api/ps `expires_at`: the model stays loaded while the server runs
NOT_MANAGED = (
    "models are chosen by the profile (target.model, or -m); this server serves that one model and pulls, "
    "pushes, creates, copies or deletes none"
)


def ollama_error(request: Request, exc: Exception) -> Response:
    """Any error of an Ollama route, answered as the other APIs answer it (status, headers, the
    message; a 500's error id logged) but in Ollama's shape, `{"error": "..."}`."""
    handler = next(handle for kind, handle in HANDLERS.items() if isinstance(exc, kind))
    answered = handler(request, exc)  # type: ignore[operator]  (each takes its own exception type)
    message = msgspec.json.decode(answered.content)["error"]["message"]
    return Response(
        msgspec.json.encode(OllamaError(error=message)),
        status_code=answered.status_code,
        media_type=MediaType.JSON,
        headers=dict(answered.headers),
    )


def streamed_lines(body: type) -> dict[int, ResponseSpec]:
    description = f"{body.__name__}; unless `stream: false`, {NDJSON} lines of it, the last with `done: true`"
    return {200: ResponseSpec(data_container=body, description=description, generate_examples=False)}


class OllamaController(Controller):
    """Ollama's routes that read the model: 503 while it loads, drains or failed (`require_ready`,
    every model route's guard), in Ollama's shape as every error here."""

    tags = ("ollama",)
    guards = (require_ready,)
    # every exception type the app answers (the most specific handler wins, whatever its layer)
    exception_handlers = dict.fromkeys(HANDLERS, ollama_error)
    error_body = OllamaError  # app.finish_handlers documents every error in this shape

    @get("/api/version", name="ollama-version", opt={"public": True})
    async def version(self) -> Version:
        """The Ollama release whose API this server answers."""
        return Version(version=OLLAMA_VERSION)

    @get("/api/tags", name="ollama-tags", opt={"public": True})
    async def list_models(self, state: State) -> Tags:
        """The models this server serves, loaded or not (public, as /v1/models)."""
        return Tags(models=[await tag_entry(model.settings) for model in listed(state)])

    @get("/api/ps", name="ollama-ps")
    async def running(self, state: State) -> Running:
        """The models in memory: the served one (with a router, those loaded)."""
        loaded = []
        for model in listed(state):
            if model.engine is not None:
                fields = msgspec.structs.asdict(await tag_entry(model.settings))
                context = model.engine.context_limit
                loaded.append(
                    RunningEntry(**fields, expires_at=FOREVER, size_vram=fields["size"], context_length=context)
                )
        return Running(models=loaded)

    @post("/api/show", status_code=200, name="ollama-show")
    async def show(self, engine: NamedDependency[EngineView], data: JSONBody[OllamaShowRequest]) -> Show:
        """The served model's details, template, defaults and capabilities; another name is a 404."""
        settings = engine.settings
        wanted = data.model or data.name or ""
        if not wanted:
            raise ApiError(400, "model is required")
        if wanted not in served_names(engine):
            raise ApiError(404, f"model {quoted(wanted)} not found; this server serves {model_alias(settings)!r}")
        facts = await asyncio.to_thread(model_facts, settings.target.model)
        arch = facts.architecture
        model_info = {
            "general.architecture": arch,
            "general.parameter_count": facts.parameters,
            f"{arch}.context_length": engine.context_limit,
            f"{arch}.embedding_length": facts.hidden_size,
            f"{arch}.block_count": facts.layers,
        }
        caps = engine.model.template_caps
        capabilities = ["completion"]
        capabilities += ["tools"] if caps is not None and caps.supports_tools else []
        capabilities += ["thinking"] if engine.writes_thinking else []
        capabilities += ["embedding"] if settings.server.embeddings else []
        source = chat_template.chosen_source(engine.tokenizer, settings.server.chat_template_file) or ""
        parameters = default_parameters(engine)
        return Show(
            modelfile=f"# served by mlxcel (profile {settings.profile})\nFROM {model_alias(settings)}\n"
            + "".join(f"PARAMETER {line}\n" for line in parameters),
            parameters="\n".join(parameters),
            template=source,
            details=details(facts),
            model_info=model_info,
            capabilities=capabilities,
            modified_at=facts.modified_at,
        )

    @post("/api/chat", status_code=200, name="ollama-chat", responses=streamed_lines(ChatAnswer))
    async def chat(
        self, request: Request, engine: NamedDependency[EngineView], data: JSONBody[OllamaChatRequest]
    ) -> Response | Stream:
        """A chat answer through the chat pipeline: NDJSON lines, or one body with `stream: false`."""
        started = time.perf_counter_ns()
        model = model_alias(engine.settings)
        if requests.loads_only(data):
            return loaded(data, ChatAnswer(model=model, created_at=shapes.created_at(), done=True,
                                           message=AssistantMessage(content="")))  # fmt: skip
        chat_data = requests.chat_request(data)
        tokens, plan = await conversation.prompt_tokens(request, engine, chat_data)
        chat_data = capped(chat_data, data.options, len(tokens), engine)
        thinking = thinking_of(engine, chat_data, tokens, data.think)
        rows = await start_rows(request, engine, chat_data, [tokens], 1, request.url.path, forced_schema(plan))
        (shaper,) = logprobs_for(engine.tokenizer, rows.row_requests)

        def piece(text: str, thought: str = "", calls: list[Any] | None = None, **end: Any) -> ChatAnswer:
            end.pop("tokens", None)  # a generate answer's `context`; a chat answer has none
            message = AssistantMessage(content=text, thinking=thought or UNSET, tool_calls=calls or UNSET)
            return ChatAnswer(model=model, created_at=shapes.created_at(), message=message, **(end or {"done": False}))

        if data.stream:
            return await ndjson(rows, answer_lines(rows, plan, thinking, shaper, piece, started))
        (result,) = await rows.results()
        return await body(rows, result, lambda: whole(result, plan, thinking, shaper, piece, started), engine)

    @post(
        "/api/generate",
        status_code=200,
        name="ollama-generate",
        responses=streamed_lines(GenerateAnswer),
    )
    async def generate(
        self, request: Request, engine: NamedDependency[EngineView], data: JSONBody[OllamaGenerateRequest]
    ) -> Response | Stream:
        """A completion of `prompt`, through the chat template unless `raw` (or filled in up to a
        `suffix`): NDJSON lines, or one body."""
        started = time.perf_counter_ns()
        model = model_alias(engine.settings)
        if requests.loads_only(data):
            return loaded(data, GenerateAnswer(model=model, created_at=shapes.created_at(), done=True, response=""))
        thinking = None
        fields: ChatRequest | CompletionRequest
        if data.raw or data.suffix:
            fields = requests.raw_request(data)
            shape = prompt_shapes.prompts
            if data.suffix:  # fill in the middle, from the prompt up to the suffix (app/server/core/infill.py)
                n_ctx, n_predict = engine.context_limit, engine.settings.sampling.n_predict
                shape = partial(infill.suffix_prompts, suffix=data.suffix, n_ctx=n_ctx, n_predict=n_predict)
            (prompt,) = await offload.run(request, shape, fields.prompt, tokenizer=engine.tokenizer,
                                          vocab=engine.vocab_size)  # fmt: skip
            tokens = prompt.tokens
        else:
            fields = requests.generate_chat_request(data)
            tokens, _ = await conversation.prompt_tokens(request, engine, fields)
        tokens = (data.context or []) + tokens
        core_requests.check_token_ids(tokens, engine.vocab_size)
        fields = capped(fields, data.options, len(tokens), engine)
        if isinstance(fields, ChatRequest):
            thinking = thinking_of(engine, fields, tokens, data.think)
        rows = await start_rows(request, engine, fields, [tokens], 1, request.url.path)
        (shaper,) = logprobs_for(engine.tokenizer, rows.row_requests)

        def piece(text: str, thought: str = "", calls: list[Any] | None = None, **end: Any) -> GenerateAnswer:
            if end:
                end["context"] = tokens + end.pop("tokens")
            return GenerateAnswer(model=model, created_at=shapes.created_at(), response=text,
                                  thinking=thought or UNSET, **(end or {"done": False}))  # fmt: skip

        if data.stream:
            return await ndjson(rows, answer_lines(rows, None, thinking, shaper, piece, started))
        (result,) = await rows.results()
        return await body(rows, result, lambda: whole(result, None, thinking, shaper, piece, started), engine)

    @post("/api/embed", status_code=200, name="ollama-embed")
    async def embed(
        self, request: Request, engine: NamedDependency[EngineView], data: JSONBody[OllamaEmbedRequest]
    ) -> Response[Embed]:
        """The inputs' embeddings (server.embeddings; off, a 404), one vector per input."""
        started = time.perf_counter_ns()
        embedding_requests.check_on(engine.settings, request.url.path)
        embedding_requests.check_pooled(engine.settings)
        inputs = data.input if data.input is not None else data.prompt
        wanted = EmbeddingRequest(input=[inputs] if isinstance(inputs, str) else inputs, dimensions=data.dimensions)
        model = model_alias(engine.settings)
        return await embedding_answer(
            request,
            engine,
            wanted,
            lambda prompts, found: Embed(
                model=model,
                embeddings=[rows[0] for rows in found],
                total_duration=time.perf_counter_ns() - started,
                prompt_eval_count=sum(map(len, prompts)),
            ),
        )

    @post("/api/embeddings", status_code=200, name="ollama-embeddings")
    async def embeddings(
        self, request: Request, engine: NamedDependency[EngineView], data: JSONBody[OllamaEmbedRequest]
    ) -> Response[Embedding]:
        """Ollama's older route: `prompt`'s one embedding."""
        embedding_requests.check_on(engine.settings, request.url.path)
        embedding_requests.check_pooled(engine.settings)
        if data.prompt is None:
            raise ApiError(400, "prompt: required (the text to embed)")
        wanted = EmbeddingRequest(input=[data.prompt])
        return await embedding_answer(request, engine, wanted, lambda _, found: Embedding(embedding=found[0][0]))


class OllamaManagementController(Controller):
    """Ollama's model management, not served: 501 whether or not the model is loaded."""

    tags = OllamaController.tags
    exception_handlers = OllamaController.exception_handlers
    error_body = OllamaError

    @post(["/api/pull", "/api/push", "/api/create", "/api/copy"], status_code=501, name="ollama-managed")
    async def manage(self) -> None:
        """Model management: not served (the profile chooses the one model)."""
        raise ApiError(501, NOT_MANAGED)

    @delete("/api/delete", status_code=501, name="ollama-delete")
    async def remove(self) -> None:
        """Deleting a model: not served."""
        raise ApiError(501, NOT_MANAGED)

    @post("/api/blobs/{digest:str}", status_code=501, name="ollama-blobs")
    async def blobs(self, digest: FromPath[str]) -> None:
        """Uploading a model's files: not served."""
        raise ApiError(501, NOT_MANAGED)


def served_names(engine: EngineView) -> set[str]:
    """The names /api/show answers for: the served alias and the directory's name, each also with
    Ollama's default `:latest` tag."""
    settings = engine.settings
    names = {model_alias(settings), Path(settings.target.model).name}
    return names | {f"{name}:latest" for name in names}


async def tag_entry(settings: Settings) -> TagEntry:
    facts = await asyncio.to_thread(model_facts, settings.target.model)
    name = model_alias(settings)
    return TagEntry(name=name, model=name, modified_at=facts.modified_at, size=facts.size,
                    digest=facts.digest, details=details(facts))  # fmt: skip


def details(facts: ModelFacts) -> Details:
    family = facts.architecture
    return Details(
        family=family,
        families=[family],
        parameter_size=parameter_size(facts.parameters),
        quantization_level=facts.quantization,
    )


def default_parameters(engine: EngineView) -> list[str]:
    """The profile's sampler defaults, as a Modelfile's PARAMETER lines write them."""
    sampling = engine.settings.sampling
    return [
        f"temperature {sampling.temperature}",
        f"top_k {sampling.top_k}",
        f"top_p {sampling.top_p}",
        f"min_p {sampling.min_p}",
        f"repeat_penalty {sampling.repeat_penalty}",
        f"num_predict {sampling.n_predict}",
        f"num_ctx {engine.context_limit}",
    ]


def loaded(data: OllamaChatRequest | OllamaGenerateRequest, answer: ChatAnswer | GenerateAnswer) -> Response:
    """Ollama's answer to a request that only loads (or, `keep_alive: 0`, unloads) the model: it
    is loaded while the server runs, and stays so."""
    reason = "unload" if requests.unloads(data.keep_alive) else "load"
    encoded = msgspec.json.encode(msgspec.structs.replace(answer, done_reason=reason))
    return Response(encoded + (b"\n" if data.stream else b""), media_type=NDJSON if data.stream else MediaType.JSON)


def capped(
    fields: ChatRequest | CompletionRequest, options: Options | None, prompt_tokens: int, engine: EngineView
) -> Any:
    """The request with its token limit under `options.num_ctx` (requests.context_cap)."""
    num_ctx = options.num_ctx if options is not None else None
    if num_ctx is None:
        return fields
    asked = fields.n_predict if fields.n_predict is not None else engine.settings.sampling.n_predict
    return msgspec.structs.replace(fields, n_predict=requests.context_cap(num_ctx, prompt_tokens, asked))


def thinking_of(engine: EngineView, data: ChatRequest, tokens: list[int], think: bool | str | None) -> Reasoning | None:
    """How the answer's thinking block is read (`think: false` asks for none), as on the chat route."""
    prefill = template.continues_final_message(data.messages, data.continue_final_message)
    writes = engine.writes_thinking and not prefill and think is not False
    chosen = engine.settings.server.reasoning_format
    return reasoning.reasoning_for(chosen, writes, engine.tokenizer.decode(tokens[-8:]))


Piece = Callable[..., ChatAnswer | GenerateAnswer]


def whole(
    result: Finished,
    plan: ToolPlan | None,
    thinking: Reasoning | None,
    shaper: Logprobs | None,
    piece: Piece,
    started: int,
) -> ChatAnswer | GenerateAnswer:
    """The unstreamed answer: its thinking, its text or the calls it is (a cut call too), the totals."""
    thought, text = split(thinking, result.text) if thinking is not None else (None, result.text)
    calls = tool_calls(plan, text, result.stop_type == "limit") if plan is not None else None
    entries = shaper.chat(result.logprobs).content if shaper is not None else None
    end = shapes.final(result, started, entries) | {"tokens": result.tokens}
    if calls:
        return piece("", thought or "", shapes.ollama_calls(calls), **end)
    return piece(text, thought or "", None, **end)


async def body(rows: Rows, result: Finished, build: Callable[[], Any], engine: EngineView) -> Response:
    limit = engine.settings.server.max_response_bytes
    return await json_response(build, [result], [], limit, rule_header([result.rule]))


async def ndjson(rows: Rows, lines: AsyncIterator[bytes]) -> Stream:
    """The NDJSON stream, once its row is built: its headers name the rule it runs."""
    rules = await rows.started()
    return Stream(lines, media_type=NDJSON, headers={**HEADERS, **rule_header(rules)})


async def answer_lines(
    rows: Rows,
    plan: ToolPlan | None,
    thinking: Reasoning | None,
    shaper: Logprobs | None,
    piece: Piece,
    started: int,
) -> AsyncIterator[bytes]:
    """One line per piece of text (thinking as `thinking`), held back while it may become a tool
    call (then one line of the calls); the last line `done: true` with the totals; a failure as
    `{"error": ...}`."""
    calls = CallStream(plan) if plan is not None and plan.callable else None
    stream = ThinkingStream(thinking) if thinking is not None else None

    def shaped(entries: list[TokenLogprob]) -> list[ChatTokenLogprob] | None:
        return shaper.chat(entries).content if shaper is not None and entries else None

    def text_line(text: str, thought: str, entries: list[TokenLogprob]) -> bytes:
        found = shaped(entries)
        line = piece(text, thought)
        return shapes.line(line if found is None else msgspec.structs.replace(line, logprobs=found))

    async for _, event in rows.stream():
        if isinstance(event, Progress):
            continue
        if isinstance(event, Delta):
            text, entries, thought = event.text, event.logprobs, ""
            if stream is not None:
                thought, text = stream.feed(text)
            if calls is not None:
                text, entries = calls.feed(text, entries)
            if text or thought:
                yield text_line(text, thought, entries)
        elif isinstance(event, Finished):
            if stream is not None:
                thought, rest = stream.finish()
                rest, held = calls.feed(rest, []) if calls is not None and rest else (rest, [])
                if thought or rest:
                    yield text_line(rest, thought, held)
            if calls is not None:
                found = calls.calls(event.stop_type == "limit")
                text, entries = calls.release()
                if found:
                    yield shapes.line(piece("", "", shapes.ollama_calls(found)))
                elif text:
                    yield text_line(text, "", entries)
            end = shapes.final(event, started) | {"tokens": event.tokens}
            yield shapes.line(piece("", "", None, **end))
        else:
            yield shapes.line(OllamaError(error=event.message))
