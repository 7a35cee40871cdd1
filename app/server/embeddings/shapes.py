"""Embeddings' answers: OpenAI's list (floats or base64) and llama-server's entries."""

from __future__ import annotations

import base64
import struct
from typing import Literal

import msgspec


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
    """llama-server's /embedding entry: the pooled vector as a list of one vector, or with pooling
    `none` each token's vector."""

    index: int
    embedding: list[list[float]]


def encoded(vector: list[float], encoding_format: str) -> list[float] | str:
    if encoding_format == "float":
        return vector
    return base64.b64encode(struct.pack(f"<{len(vector)}f", *vector)).decode()


def embedding_list(
    vectors: list[list[float]], inputs: list[list[int]], encoding_format: str, model: str
) -> EmbeddingList:
    tokens = sum(map(len, inputs))
    data = [EmbeddingItem(index=i, embedding=encoded(v, encoding_format)) for i, v in enumerate(vectors)]
    return EmbeddingList(data=data, model=model, usage=EmbeddingUsage(prompt_tokens=tokens, total_tokens=tokens))
