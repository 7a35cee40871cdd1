"""llama-server's native routes: /completion, /infill, /health, /props, /slots, /lora-adapters,
/metrics, /tokenize, /detokenize and /apply-template; mlxcel's POST /admin/reload; and the
llama-server routes answered with a clear 501 (compat/ records why)."""

from __future__ import annotations

from typing import Any

from litestar import Controller, Request, Response, get, post, route
from litestar.datastructures import State
from litestar.di import NamedDependency
from litestar.enums import MediaType
from litestar.params import JSONBody
from litestar.response import Stream
from mlx_lm.tokenizer_utils import TokenizerWrapper

from app.server import offload
from app.server.auth import require_server_key, tenant_of
from app.server.chat import template
from app.server.core import adapters, infill, requests
from app.server.core import prompts as prompt_shapes
from app.server.core.adapters import LoraAdapter, LoraApplied
from app.server.core.bodies import encoded, json_response, too_large
from app.server.core.logprobs import logprobs_for
from app.server.core.service import start_rows
from app.server.core.shaping import rule_header
from app.server.core.streaming import sse
from app.server.engine_view import EngineView, ReloadRefusedError, reload_model, require_ready, served_metrics
from app.server.errors import ApiError
from app.server.metrics import CONTENT_TYPE, exposition
from app.server.native import props
from app.server.native.props import Health, Props, Reloaded, Slot
from app.server.native.requests import (
    ApplyTemplateRequest,
    CompletionRequest,
    DetokenizeRequest,
    InfillRequest,
    TokenizeRequest,
)
from app.server.native.settings import generation_settings
from app.server.native.shapes import (
    Detokenized,
    NativeCompletion,
    TemplatePrompt,
    TokenIds,
    TokenPiece,
    TokenPieces,
    native_body,
    native_frames,
)
from app.server.openapi import error, streamed_or

# --- the native completion: /completion and /completions --------------------------------------


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
        return await completed(request, engine, data, prompts, "/completion")

    @post(
        "/infill",
        status_code=200,
        name="infill",
        responses=streamed_or(NativeCompletion, "NativeChunk ones, then this object"),
    )
    async def infill(
        self, request: Request, engine: NamedDependency[EngineView], data: JSONBody[InfillRequest]
    ) -> Response | Stream:
        """llama-server's fill-in-the-middle, answered as /completion answers (app/server/core/infill.py):
        400 naming the missing tokens where the model's tokenizer has no FIM tokens."""
        prompt = await offload.run(
            request,
            infill.infill_prompt,
            data.input_prefix,
            data.input_suffix,
            data.input_extra,
            data.prompt,
            engine.tokenizer,
            engine.vocab_size,
            engine.context_limit,
            engine.settings.sampling.n_predict,
        )
        return await completed(request, engine, data, [prompt], "/infill")


async def completed(
    request: Request,
    engine: EngineView,
    data: CompletionRequest | InfillRequest,
    prompts: list[prompt_shapes.Prompt],
    route: str,
) -> Response | Stream:
    """The native answer to these prompts: SSE frames ending with the full object, or the body
    (a list of them for several prompts)."""
    rows = await start_rows(request, engine, data, [p.tokens for p in prompts], 1, route)
    texts = [p.text for p in prompts]
    logprobs = logprobs_for(engine.tokenizer, rows.row_requests)
    shape = {"return_tokens": data.return_tokens, "response_fields": data.response_fields}
    if data.stream:
        return await sse(rows, native_frames(rows, texts, logprobs=logprobs, **shape))
    results = await rows.results()

    def body() -> Any:
        shaped = [
            native_body(
                result,
                generation_settings(row, rows.model, result.n_max),
                text,
                streamed=False,
                index=index,
                logprobs=shaper,
                **shape,
            )
            for index, (result, row, text, shaper) in enumerate(
                zip(results, rows.row_requests, texts, logprobs, strict=True)
            )
        ]
        return shaped[0] if len(shaped) == 1 else shaped

    headers = rule_header([result.rule for result in results])
    return await json_response(body, results, texts, engine.settings.server.max_response_bytes, headers)


# --- what the server is and does: /health, /props, /slots and /metrics ------------------------


class IntrospectionController(Controller):
    tags = ("introspection",)

    @get(["/health", "/v1/health"], name="health", guards=[require_ready], opt={"public": True})
    async def health(self) -> Health:
        """200 {"status": "ok"} while serving; 503 in the error envelope while loading, draining or failed."""
        return Health()

    @get("/props", name="props")
    async def props(self, engine: NamedDependency[EngineView]) -> Props:
        """The profile, its drafter, the plan's rules and the sampling defaults (also while loading)."""
        return props.props(engine)

    @post("/props", status_code=501, name="props-update")
    async def update_props(self) -> None:
        """Refused (here, not with the other refusals: two controllers cannot share a path)."""
        raise ApiError(501, "/props: settings change per profile at startup, not at run time", "not_supported_error")

    @get("/lora-adapters", name="lora-adapters", guards=[require_ready])
    async def lora_adapters(self, engine: NamedDependency[EngineView]) -> list[LoraAdapter]:
        """llama-server's loaded adapters: the profile's one (target.adapter_path), fused into the
        target at load, as id 0; none without one."""
        return adapters.listing(engine.settings)

    @post("/lora-adapters", status_code=200, name="lora-adapters-set", guards=[require_ready])
    async def set_lora_adapters(self, engine: NamedDependency[EngineView], data: JSONBody[Any]) -> LoraApplied:
        """llama-server's scale setting: 200 where the scales asked are the loaded ones, 400 otherwise
        (the adapter is fused at load; another scale would change every request's answer)."""
        problem = adapters.problem(data, engine.settings)
        if problem is not None:
            raise ApiError(400, f"/lora-adapters: {problem}")
        return LoraApplied()

    @get("/slots", name="slots", guards=[require_ready])
    async def slots(self, request: Request, engine: NamedDependency[EngineView]) -> list[Slot]:
        """One entry per row; a busy row of the caller's tenant shows its request's settings and
        drafting so far, another tenant's only that it is busy."""
        return props.slots(engine, tenant_of(request))

    @get("/metrics", name="metrics", guards=[require_ready], media_type=CONTENT_TYPE)
    async def metrics(self, state: State) -> bytes:
        """Prometheus text: llama-server's metric names, the speculative counters, latency
        histograms, requests by route and status, process metrics (docs/operations.md); with a
        router, each loaded model's engine metrics labelled `model`."""
        return exposition(served_metrics(state), state.http_metrics)


# --- text and tokens: /tokenize, /detokenize and /apply-template (the chat template's prompt) ---


PIECE_BYTES = 20  # the least one {"id":N,"piece":"..."} entry takes: a body of more pieces is refused unbuilt


class TokensController(Controller):
    tags = ("tokens",)
    guards = (require_ready,)

    @post("/tokenize", status_code=200, name="tokenize")
    async def tokenize(
        self, request: Request, engine: NamedDependency[EngineView], data: JSONBody[TokenizeRequest]
    ) -> Response[TokenIds | TokenPieces]:
        limit = engine.settings.server.max_response_bytes
        content = await offload.run(request, tokens_body, engine.tokenizer, data, limit)
        return Response(content, media_type=MediaType.JSON)

    @post("/detokenize", status_code=200, name="detokenize")
    async def detokenize(
        self, request: Request, engine: NamedDependency[EngineView], data: JSONBody[DetokenizeRequest]
    ) -> Response[Detokenized]:
        limit = engine.settings.server.max_response_bytes
        content = await offload.run(request, detokenized_body, engine.tokenizer, data.tokens, engine.vocab_size, limit)
        return Response(content, media_type=MediaType.JSON)

    @post("/apply-template", status_code=200, name="apply-template")
    async def apply_template(
        self, request: Request, engine: NamedDependency[EngineView], data: JSONBody[ApplyTemplateRequest]
    ) -> TemplatePrompt:
        """The prompt text the chat template makes of these messages (a final assistant message
        continued, as the chat route continues it)."""
        prompt = await offload.run(
            request,
            template.chat_prompt,
            data.messages,
            engine.tokenizer,
            None,
            engine.settings,
            tokenize=False,
            prefill=template.continues_final_message(data.messages),
        )
        return TemplatePrompt(prompt=prompt)


def detokenized_body(tokenizer: TokenizerWrapper, tokens: list[int], vocab: int, limit: int) -> bytes:
    """The encoded answer, within `limit` bytes (server.max_response_bytes); blocking."""
    requests.check_token_ids(tokens, vocab)
    return encoded(lambda: Detokenized(content=tokenizer.decode(tokens)), limit)


def tokens_body(tokenizer: TokenizerWrapper, data: TokenizeRequest, limit: int) -> bytes:
    """The encoded answer, within `limit` bytes (server.max_response_bytes). Blocking: a megabyte
    of text takes seconds with pieces, so the route runs it off the event loop."""
    ids = list(tokenizer.encode(data.content, add_special_tokens=data.add_special))
    if not data.with_pieces:
        return encoded(lambda: TokenIds(tokens=ids), limit)
    if len(ids) * PIECE_BYTES > limit:
        raise too_large(f"at least {len(ids) * PIECE_BYTES} bytes ({len(ids)} pieces)", limit)
    return encoded(lambda: TokenPieces(tokens=[TokenPiece(id=t, piece=tokenizer.decode([t])) for t in ids]), limit)


# --- POST /admin/reload: hot profile reload over HTTP ---------------------------------------
# mlxcel's own route; off unless the profile turns it on with `server.admin_reload`, which needs
# `server.api_key`: the server key guards it, and no tenant's key may call it


class AdminController(Controller):
    tags = ("admin",)

    @post(
        "/admin/reload",
        name="admin-reload",
        status_code=200,
        guards=[require_ready, require_server_key],
        responses={
            403: error("server.admin_reload is off in the serving profile, or a tenant's key, not the server key"),
            409: error("refused: the old profile goes on serving; the message is the one-line reason"),
        },
    )
    async def reload(self, request: Request, state: State) -> Reloaded:
        """Re-read the profile (file, environment, flags), build its engine beside the serving one,
        then send new requests to it; in-flight requests finish on the old one. Answers when done.
        With a router: the loaded model the body's `model` names (else the first) alone."""
        if (state.reloader is None and state.router is None) or not state.settings.server.admin_reload:
            raise ApiError(
                403,
                "reload over HTTP is off: set server.admin_reload = true (with server.api_key), or send SIGHUP",
                "permission_error",
            )
        try:
            engine = await reload_model(state, request, "http")
        except ReloadRefusedError as exc:
            raise ApiError(409, f"reload refused: {exc}", "invalid_request_error") from exc
        return props.reloaded(engine)


# --- llama-server routes answered with a clear 501 (compat/ records why) ----------------------


NO_RERANKER = "reranking needs a reranker checkpoint; not served"
REASONS = {
    "/rerank": NO_RERANKER,
    "/reranking": NO_RERANKER,
    "/v1/rerank": NO_RERANKER,
    "/v1/reranking": NO_RERANKER,
    # by design: a router loads on use and unloads by its budget and idle time
    "/models/load": "a [router] profile loads each model on the first request that names it (docs/deployment.md)",
    "/models/unload": "a [router] profile unloads models by its memory budget and idle time (docs/deployment.md)",
}
SLOT_ACTIONS = "slot save/restore/erase is not supported: rows hold no reusable prompt cache"


def refuse(request: Request, reason: str) -> ApiError:
    return ApiError(501, f"{request.url.path}: {reason}", "not_supported_error")


class UnsupportedController(Controller):
    tags = ("unsupported",)

    @route(list(REASONS), http_method=["POST"], status_code=501, name="unsupported")
    async def unsupported(self, request: Request) -> None:
        raise refuse(request, REASONS[request.scope["path_template"]])

    @route("/slots/{id_slot:int}", http_method=["POST"], status_code=501, name="slot-actions")
    async def slot_actions(self, request: Request) -> None:
        raise refuse(request, SLOT_ACTIONS)
