"""Embeddings: /v1/embeddings (OpenAI's shape), /embedding and /embeddings (llama-server's, as its
native routes answer them)."""

from __future__ import annotations

import asyncio

from litestar import Controller, Request, post
from litestar.di import NamedDependency
from litestar.params import JSONBody

from app.server import embeddings, shaping
from app.server.embeddings import EmbeddingList, EmbeddingRequest, NativeEmbedding
from app.server.engine_view import EngineView, require_ready


async def vectors(
    request: Request, engine: EngineView, data: EmbeddingRequest
) -> tuple[list[list[int]], list[list[list[float]]]]:
    """The inputs' tokens and each one's vectors (one pooled, or one per token with pooling
    `none`), one engine call per input (rows decode between them)."""
    embeddings.check_on(engine.settings, request.url.path)
    prompts = await asyncio.to_thread(
        embeddings.token_inputs, data, engine.tokenizer, engine.settings, engine.vocab_size
    )
    pooling = engine.settings.server.embeddings_pooling
    return prompts, [await engine.embed(tokens, pooling) for tokens in prompts]


class EmbeddingsController(Controller):
    tags = ("embeddings",)
    guards = (require_ready,)

    @post("/v1/embeddings", status_code=200, name="embeddings")
    async def openai_embeddings(
        self, request: Request, engine: NamedDependency[EngineView], data: JSONBody[EmbeddingRequest]
    ) -> EmbeddingList:
        """OpenAI's list of embeddings, floats or base64; 404 unless server.embeddings is on."""
        embeddings.check_on(engine.settings, request.url.path)
        embeddings.check_pooled(engine.settings)
        prompts, found = await vectors(request, engine, data)
        pooled = [rows[0] for rows in found]
        return embeddings.embedding_list(pooled, prompts, data.encoding_format, shaping.model_alias(engine.settings))

    @post(["/embedding", "/embeddings"], status_code=200, name="embedding")
    async def native_embedding(
        self, request: Request, engine: NamedDependency[EngineView], data: JSONBody[EmbeddingRequest]
    ) -> list[NativeEmbedding]:
        """llama-server's: one entry per input, its pooled vector as `[[...]]` (pooling `none`:
        every token's vector)."""
        _, found = await vectors(request, engine, data)
        return [NativeEmbedding(index=i, embedding=rows) for i, rows in enumerate(found)]
