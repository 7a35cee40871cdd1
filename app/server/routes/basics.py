"""Health, models, tokenize and detokenize."""

from __future__ import annotations

import asyncio
import time
from typing import Any

from litestar import Request, Response, get, post
from litestar.params import JSONBody
from mlx_lm.tokenizer_utils import TokenizerWrapper

from app.engine.engine import EngineState, unavailable_message
from app.server import requests
from app.server.errors import ApiError
from app.server.schemas import DetokenizeRequest, TokenizeRequest
from app.server.service import engine_of, model_alias, ready_engine


@get(["/health", "/v1/health"], name="health", opt={"public": True})
async def health(request: Request) -> Response:
    """200 {"status": "ok"} while serving; 503 in the error envelope while loading, draining or failed."""
    state = engine_of(request).state
    if state is EngineState.READY:
        return Response({"status": "ok"})
    raise ApiError(503, unavailable_message(state))


@get(["/v1/models", "/models"], name="models")
async def models(request: Request) -> dict[str, Any]:
    engine = engine_of(request)
    settings = engine.settings
    entry: dict[str, Any] = {
        "id": model_alias(settings),
        "object": "model",
        "created": int(time.time()),
        "owned_by": "mlxcel",
        "meta": {"path": settings.target},
    }
    if engine.state is EngineState.READY:
        entry["meta"] |= {"n_vocab": engine.model.vocab_size, "n_ctx_train": engine.model.context_limit}
    return {"object": "list", "data": [entry], "models": [{"name": entry["id"], "model": entry["id"]}]}


@post("/tokenize", status_code=200, name="tokenize")
async def tokenize(request: Request, data: JSONBody[TokenizeRequest]) -> dict[str, Any]:
    tokenizer = ready_engine(request).model.tokenizer
    return await asyncio.to_thread(tokens_of, tokenizer, data)


def tokens_of(tokenizer: TokenizerWrapper, data: TokenizeRequest) -> dict[str, Any]:
    """Blocking: a megabyte of text takes seconds with pieces, so the route runs it on a thread."""
    ids = list(tokenizer.encode(data.content, add_special_tokens=data.add_special))
    if not data.with_pieces:
        return {"tokens": ids}
    return {"tokens": [{"id": t, "piece": tokenizer.decode([t])} for t in ids]}


@post("/detokenize", status_code=200, name="detokenize")
async def detokenize(request: Request, data: JSONBody[DetokenizeRequest]) -> dict[str, Any]:
    engine = ready_engine(request)
    requests.check_token_ids(data.tokens, engine.model.vocab_size)
    return {"content": await asyncio.to_thread(engine.model.tokenizer.decode, data.tokens)}


ROUTES = [health, models, tokenize, detokenize]
