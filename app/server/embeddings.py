"""Embeddings: OpenAI's /v1/embeddings and llama-server's /embedding, their inputs and answers.

Off unless the profile sets `server.embeddings = true` (llama-server's `--embeddings`); then each
input is tokenized (with the tokenizer's special tokens, as llama-server) or taken as token ids,
and the target's hidden states are pooled by `server.embeddings_pooling` and normalised
(app/execution/embedding.py). Off, the routes answer 404 `not_supported_error`, which the OpenAI
SDK does not retry (it retries a 501).
"""

from __future__ import annotations

import base64
import struct
from typing import Literal

import msgspec
from mlx_lm.tokenizer_utils import TokenizerWrapper

from app.profiles.schema import Settings
from app.server.errors import ApiError
from app.server.requests import check_token_ids
from app.server.schemas import WireStruct

MAX_INPUTS = 2048  # OpenAI's limit on one request's inputs
# a string, a list of strings, token ids, or a list of token-id lists (a mix is refused in token_inputs)
EmbeddingInput = str | list[str | int | list[int]]


class EmbeddingRequest(WireStruct, kw_only=True):
    """OpenAI's body; llama-server's /embedding takes `content` for `input`. `input` is
    optional here only so an embeddings-off server answers its 404 before a body check."""

    input: EmbeddingInput | None = None
    content: EmbeddingInput | None = None
    model: str | None = None
    encoding_format: str = "float"
    dimensions: int | None = None
    # no-op: user


class EmbeddingItem(msgspec.Struct, kw_only=True):
    object: Literal["embedding"] = "embedding"
    index: int
    embedding: list[float] | str  # base64: the float32 values, little-endian, as OpenAI encodes them


class EmbeddingUsage(msgspec.Struct, kw_only=True):
    prompt_tokens: int
    total_tokens: int


class EmbeddingList(msgspec.Struct, kw_only=True):
    object: Literal["list"] = "list"
    data: list[EmbeddingItem]
    model: str
    usage: EmbeddingUsage


class NativeEmbedding(msgspec.Struct, kw_only=True):
    """llama-server's /embedding entry: the pooled vector as a list of one vector."""

    index: int
    embedding: list[list[float]]


def check_on(settings: Settings, path: str) -> None:
    if not settings.server.embeddings:
        raise ApiError(
            404, f"{path}: embeddings are off; start the server with server.embeddings = true", "not_supported_error"
        )


def token_inputs(
    request: EmbeddingRequest, tokenizer: TokenizerWrapper, settings: Settings, vocab: int
) -> list[list[int]]:
    """Each input's tokens: a string, a list of strings, token ids, or a list of token-id lists.
    Blocking (tokenizing): call it off the event loop."""
    raw = request.input if request.input is not None else request.content
    if raw is None:
        raise ApiError(400, "input: required (a string, a list of strings, token ids or lists of token ids)")
    if request.dimensions is not None:
        raise ApiError(400, "dimensions: not supported: the vector has the target's hidden size, which cannot be cut")
    if request.encoding_format not in ("float", "base64"):
        raise ApiError(400, f'encoding_format must be "float" or "base64", got {request.encoding_format!r}')
    if isinstance(raw, str) or (raw and all(isinstance(item, int) for item in raw)):
        raw = [raw]
    if not raw:
        raise ApiError(400, "input: must not be empty")
    if len(raw) > MAX_INPUTS:
        raise ApiError(400, f"input: {len(raw)} inputs; this server embeds at most {MAX_INPUTS} per request")
    prompts, total, budget = [], 0, settings.server.max_embedding_tokens
    for index, item in enumerate(raw):
        if isinstance(item, int):
            raise ApiError(
                400, "input: token ids and strings cannot be mixed; give one list of ids or a list of inputs"
            )
        tokens = list(tokenizer.encode(item)) if isinstance(item, str) else list(item)
        if not tokens:
            raise ApiError(400, f"input[{index}]: empty; an embedding needs at least one token")
        if len(tokens) > settings.server.max_prompt_tokens:
            raise ApiError(400, f"input[{index}]: {len(tokens)} tokens; this server accepts "
                                f"{settings.server.max_prompt_tokens} (server.max_prompt_tokens)")  # fmt: skip
        check_token_ids(tokens, vocab)
        total += len(tokens)
        if total > budget:
            raise ApiError(400, f"input: over {total} tokens by input[{index}]; this server embeds at most "
                                f"{budget} per request (server.max_embedding_tokens)")  # fmt: skip
        prompts.append(tokens)
    return prompts


def encoded(vector: list[float], encoding_format: str) -> list[float] | str:
    if encoding_format == "float":
        return vector
    return base64.b64encode(struct.pack(f"<{len(vector)}f", *vector)).decode()


def embedding_list(
    vectors: list[list[float]], prompts: list[list[int]], encoding_format: str, model: str
) -> EmbeddingList:
    tokens = sum(map(len, prompts))
    data = [EmbeddingItem(index=i, embedding=encoded(v, encoding_format)) for i, v in enumerate(vectors)]
    return EmbeddingList(data=data, model=model, usage=EmbeddingUsage(prompt_tokens=tokens, total_tokens=tokens))
