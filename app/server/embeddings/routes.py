"""Embeddings: /v1/embeddings (OpenAI's shape), /embedding and /embeddings (llama-server's, as its
native routes answer them)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from litestar import Controller, Request, Response, post
from litestar.di import NamedDependency
from litestar.params import JSONBody

from app.server import offload
from app.server.core.bodies import encoded_response
from app.server.core.shaping import model_alias
from app.server.embeddings import requests
from app.server.embeddings.requests import EmbeddingRequest
from app.server.embeddings.shapes import EmbeddingList, NativeEmbedding, embedding_list
from app.server.engine_view import EngineView, require_ready

FLOAT_BYTES = 10  # about what one vector entry takes in JSON (base64: 5.3)


async def answer(
    request: Request,
    engine: EngineView,
    data: EmbeddingRequest,
    body: Callable[[list[list[int]], list[list[list[float]]]], Any],
) -> Response:
    """The inputs' embedding rows (one pooled row each, or one per token with pooling `none`; one
    engine call, a chunk at a time between ticks), shaped by `body` within server.max_response_bytes."""
    requests.check_on(engine.settings, request.url.path)
    prompts = await offload.run(
        request, requests.token_inputs, data, engine.tokenizer, engine.settings, engine.vocab_size
    )
    found = await engine.embed(prompts, engine.settings.server.embeddings_pooling, request.receive)
    estimate = sum(len(row) for rows in found for row in rows) * FLOAT_BYTES
    return await encoded_response(lambda: body(prompts, found), estimate, engine.settings.server.max_response_bytes)


class EmbeddingsController(Controller):
    tags = ("embeddings",)
    guards = (require_ready,)

    @post("/v1/embeddings", status_code=200, name="embeddings")
    async def openai_embeddings(
        self, request: Request, engine: NamedDependency[EngineView], data: JSONBody[EmbeddingRequest]
    ) -> Response[EmbeddingList]:
        """OpenAI's list of embeddings, floats or base64; 404 unless server.embeddings is on."""
        requests.check_pooled(engine.settings)
        model = model_alias(engine.settings)
        return await answer(
            request,
            engine,
            data,
            lambda prompts, found: embedding_list([rows[0] for rows in found], prompts, data.encoding_format, model),
        )

    @post(["/embedding", "/embeddings"], status_code=200, name="embedding")
    async def native_embedding(
        self, request: Request, engine: NamedDependency[EngineView], data: JSONBody[EmbeddingRequest]
    ) -> Response[list[NativeEmbedding]]:
        """llama-server's: one entry per input, its pooled vector as `[[...]]` (pooling `none`:
        every token's vector)."""
        return await answer(
            request,
            engine,
            data,
            lambda _, found: [NativeEmbedding(index=i, embedding=rows) for i, rows in enumerate(found)],
        )
