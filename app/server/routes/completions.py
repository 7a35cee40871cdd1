"""Completion routes: llama-server's native /completion and OpenAI's /v1/completions."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

import msgspec
from litestar import Request, Response, post
from litestar.params import JSONBody
from litestar.response import Stream

from app.decoding.generation import Delta
from app.engine.row import Finished
from app.server import requests
from app.server.errors import ApiError
from app.server.schemas import CompletionRequest, OpenAICompletionRequest, SamplingFields
from app.server.service import Submission, model_alias, ready_engine, submit
from app.server.streaming import DONE, REQUEST_ID, error_frame, frame, sse


def start(request: Request, data: SamplingFields, tokens: list[int], route: str) -> tuple[Submission, dict]:
    """Validate, build the row request, submit it; returns the submission and its settings."""
    engine = ready_engine(request)
    tokenizer = engine.model.tokenizer
    params = requests.sampling(data, engine.settings, tokenizer, engine.model.vocab_size)
    row_request = requests.row_request(data, tokens, engine.settings, params)
    settings = generation_settings(row_request, params, model_alias(engine.settings), engine.plan.width)
    return submit(request, engine, row_request, route, data.stream, data.stream and data.timings_per_token), settings


def generation_settings(row_request: Any, params: Any, model: str, width: int) -> dict[str, Any]:
    return {
        "model": model,
        "n_predict": row_request.max_tokens,
        "seed": row_request.seed if row_request.seed is not None else -1,
        **{k: v for k, v in msgspec.structs.asdict(params).items() if k != "logit_bias"},
        "logit_bias": [[token, bias] for token, bias in params.logit_bias.items()],
        "stop": list(row_request.stop),
        "ignore_eos": row_request.ignore_eos,
        "speculative.n_max": width if row_request.n_max is None else min(width, row_request.n_max),
        "speculative.n_min": row_request.n_min,
        "speculative.p_min": row_request.p_min,
    }


def finish_reason(result: Finished) -> str:
    return "length" if result.stop_type == "limit" else "stop"


def usage(result: Finished) -> dict[str, int]:
    completion = len(result.tokens)
    return {
        "prompt_tokens": result.prompt_n,
        "completion_tokens": completion,
        "total_tokens": result.prompt_n + completion,
    }


# --- native ---------------------------------------------------------------------------------


def native_body(
    data: CompletionRequest, result: Finished, settings: dict, prompt: str, *, streamed: bool
) -> dict[str, Any]:
    body = {
        "index": 0,
        "content": "" if streamed else result.text,
        "tokens": result.tokens if data.return_tokens else [],
        "id_slot": 0,
        "stop": True,
        "model": settings["model"],
        "tokens_predicted": len(result.tokens),
        "tokens_evaluated": result.prompt_n,
        "generation_settings": settings,
        "prompt": prompt,
        "has_new_line": "\n" in result.text,
        "truncated": False,
        "stop_type": result.stop_type,
        "stopping_word": result.stopping_word,
        "tokens_cached": result.prompt_n + len(result.tokens),
        "timings": result.timings,
    }
    return select_fields(body, data.response_fields) if data.response_fields else body


def select_fields(body: dict[str, Any], fields: list[str]) -> dict[str, Any]:
    """llama-server's `response_fields`: keep the named keys; `a/b` reaches into nested objects."""
    out: dict[str, Any] = {}
    for path in fields:
        value: Any = body
        for part in path.split("/"):
            value = value.get(part) if isinstance(value, dict) else None
        if value is not None:
            out[path] = value
    return out


async def native_frames(
    submission: Submission, data: CompletionRequest, settings: dict, prompt: str
) -> AsyncIterator[bytes]:
    async for event in submission.stream():
        if isinstance(event, Delta):
            chunk: dict[str, Any] = {
                "index": 0,
                "content": event.text,
                "tokens": event.tokens,
                "stop": False,
                "id_slot": 0,
                "tokens_predicted": 0,
                "tokens_evaluated": 0,
            }
            if data.timings_per_token:
                chunk["timings"] = event.timings
                chunk["tokens_predicted"] = event.timings.predicted_n
                chunk["tokens_evaluated"] = event.timings.prompt_n
            yield frame(chunk)
        elif isinstance(event, Finished):
            yield frame(native_body(data, event, settings, prompt, streamed=True))
        else:
            yield error_frame(event.code, event.message, event.kind)


@post(["/completion", "/completions"], status_code=200, name="completion")
async def completion(request: Request, data: JSONBody[CompletionRequest]) -> Response | Stream:
    """llama-server's native completion (stream: SSE frames ending with the full object)."""
    engine = ready_engine(request)
    tokens = await asyncio.to_thread(
        requests.prompt_tokens, data.prompt, engine.model.tokenizer, engine.model.vocab_size
    )
    submission, settings = start(request, data, tokens, "/completion")
    prompt = data.prompt if isinstance(data.prompt, str) else engine.model.tokenizer.decode(tokens)
    rid = submission.job.request_id
    if data.stream:
        return sse(native_frames(submission, data, settings, prompt), rid)
    result = await submission.result()
    return Response(native_body(data, result, settings, prompt, streamed=False), headers={REQUEST_ID: rid})


# --- OpenAI text completions -----------------------------------------------------------------


async def openai_prompt(data: OpenAICompletionRequest, request: Request) -> list[int]:
    engine = ready_engine(request)
    if data.n != 1:
        raise ApiError(400, "only n = 1 is supported")
    if data.echo:
        raise ApiError(400, "echo is not supported")
    if isinstance(data.prompt, list) and data.prompt and all(isinstance(p, str) for p in data.prompt):
        if len(data.prompt) != 1:
            raise ApiError(400, "one prompt per request is supported")
        data.prompt = data.prompt[0]
    return await asyncio.to_thread(requests.prompt_tokens, data.prompt, engine.model.tokenizer, engine.model.vocab_size)


def text_choice(text: str | None, reason: str | None) -> dict[str, Any]:
    return {"text": text or "", "index": 0, "logprobs": None, "finish_reason": reason}


async def openai_frames(
    submission: Submission, per_token: bool, head: dict[str, Any], choice: Callable[[str | None, str | None], dict]
) -> AsyncIterator[bytes]:
    """OpenAI chunks: one per update, then the finish chunk with usage and timings, then [DONE].

    `choice(text, finish_reason)` shapes a choice (a text choice or a chat delta).
    """
    async for event in submission.stream():
        if isinstance(event, Delta):
            chunk = {**head, "choices": [choice(event.text, None)]}
            if per_token:
                chunk["timings"] = event.timings
            yield frame(chunk)
        elif isinstance(event, Finished):
            finish = {"choices": [choice(None, finish_reason(event))], "usage": usage(event), "timings": event.timings}
            yield frame(head | finish)
        else:
            yield error_frame(event.code, event.message, event.kind)
    yield DONE


@post("/v1/completions", status_code=200, name="openai-completion")
async def openai_completion(request: Request, data: JSONBody[OpenAICompletionRequest]) -> Response | Stream:
    """OpenAI text completion (stream: SSE chunks ending with `data: [DONE]`)."""
    tokens = await openai_prompt(data, request)
    submission, settings = start(request, data, tokens, "/v1/completions")
    rid = submission.job.request_id
    head = {
        "id": f"cmpl-{rid}",
        "object": "text_completion",
        "created": int(time.time()),
        "model": settings["model"],
    }
    if data.stream:
        return sse(openai_frames(submission, data.timings_per_token, head, text_choice), rid)
    result = await submission.result()
    body = {
        **head,
        "choices": [text_choice(result.text, finish_reason(result))],
        "usage": usage(result),
        "timings": result.timings,
    }
    return Response(body, headers={REQUEST_ID: rid})


ROUTES = [completion, openai_completion]
