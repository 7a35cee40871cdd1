"""Embeddings' requests: OpenAI's /v1/embeddings and llama-server's /embedding and /embeddings,
and their inputs as tokens.

Off unless the profile sets `server.embeddings = true` (llama-server's `--embeddings`); then the
inputs are read as llama-server reads prompts (app/server/core/prompts.py: one string, token ids or a
mix of both is one input, a list of those is many; `{"prompt_string": ...}` and
`{"content": [text parts]}` objects too), each tokenized with the tokenizer's special tokens, and
the target's hidden states are pooled by `server.embeddings_pooling` and normalised
(app/execution/embedding.py), within `server.max_embedding_tokens` positions per request: the
forwards of the request's plan (`embedding.Plan`: short inputs packed together, a long one in
chunks, the grouping the engine then runs), each counted as a whole chunk, which bounds the
time a request holds the engine's embedding lane; pooling `none` answers every token's vector,
on llama-server's native routes only. Off, the routes answer 404 `not_supported_error`, which
the OpenAI SDK does not retry (it retries a 501).
"""

from __future__ import annotations

from mlx_lm.tokenizer_utils import TokenizerWrapper
from msgspec import UNSET

from app.execution.embedding import CHUNK, Plan
from app.profiles.schema import Settings
from app.server.core import prompts
from app.server.core.schemas import ContentPart, PromptObject, WireStruct
from app.server.errors import ApiError

MAX_INPUTS = 2048  # OpenAI's limit on one request's inputs


class InputObject(WireStruct, kw_only=True):
    """An input as an object: llama-server's `{"prompt_string": ...}` or `{"content": [parts]}`."""

    prompt_string: str | list[int | str] | None = None
    content: str | list[ContentPart] | None = None
    multimodal_data: object = UNSET  # any value, to answer it with a clear 400 (text-only checkpoints)


Piece = str | int | list[int | str] | InputObject
EmbeddingInput = str | list[Piece] | InputObject


class EmbeddingRequest(WireStruct, kw_only=True):
    """OpenAI's body; llama-server's /embedding takes `content` for `input`. `input` is
    optional here only so an embeddings-off server answers its 404 before a body check."""

    input: EmbeddingInput | None = None
    content: EmbeddingInput | None = None
    model: str | None = None
    encoding_format: str = "float"
    dimensions: int | None = None


def check_on(settings: Settings, path: str) -> None:
    if not settings.server.embeddings:
        raise ApiError(
            404, f"{path}: embeddings are off; start the server with server.embeddings = true", "not_supported_error"
        )


def check_pooled(settings: Settings) -> None:
    """OpenAI's answer holds one vector per input: pooling `none` has one per token."""
    if settings.server.embeddings_pooling == "none":  # llama-server's words
        raise ApiError(400, "Pooling type 'none' is not OAI compatible. Please use a different pooling type")


def token_inputs(
    request: EmbeddingRequest, tokenizer: TokenizerWrapper, settings: Settings, vocab: int
) -> list[list[int]]:
    """Each input's tokens. Blocking (tokenizing): call it off the event loop."""
    raw = request.input if request.input is not None else request.content
    if raw is None:
        raise ApiError(400, "input: required (a string, a list of strings, token ids or lists of token ids)")
    if request.dimensions is not None:
        raise ApiError(400, "dimensions: not supported: the vector has the target's hidden size, which cannot be cut")
    if request.encoding_format not in ("float", "base64"):
        raise ApiError(400, f'encoding_format must be "float" or "base64", got {request.encoding_format!r}')
    parts = raw if prompts.is_many(raw) else [raw]
    if not parts:
        raise ApiError(400, "input: must not be empty")
    if len(parts) > MAX_INPUTS:
        raise ApiError(400, f"input: {len(parts)} inputs; this server embeds at most {MAX_INPUTS} per request")
    found, plan, budget = [], Plan(), settings.server.max_embedding_tokens
    for index, part in enumerate(parts):
        tokens = prompts.prompt_tokens(prompt_of(index, part), tokenizer, vocab)
        if not tokens:  # llama-server's words: a tokenizer with no BOS makes "" no tokens
            raise ApiError(400, f"input[{index}]: Input content cannot be empty")
        limit = settings.server.max_prompt_tokens
        if len(tokens) > limit:  # llama-server's words ("too large to process"), this server's limit
            raise ApiError(400, f"input[{index}] ({len(tokens)} tokens) is too large to process: this server "
                                f"embeds at most {limit} tokens (server.max_prompt_tokens)")  # fmt: skip
        plan.add(len(tokens))
        if plan.positions > budget:
            raise ApiError(400, f"input: {plan.positions} positions by input[{index}] ({plan.forwards} forwards of "
                                f"{CHUNK}: short inputs packed together, a long one in chunks); this server embeds "
                                f"at most {budget} per request (server.max_embedding_tokens)")  # fmt: skip
        found.append(tokens)
    return found


def prompt_of(index: int, part: object) -> object:
    """An input object as the prompt it holds: its `prompt_string`, or its text parts joined."""
    if not isinstance(part, InputObject):
        return part
    if part.prompt_string is not None:
        return PromptObject(prompt_string=part.prompt_string, multimodal_data=part.multimodal_data)
    if not isinstance(part.content, list):
        raise ApiError(400, f'input[{index}]: an object needs "prompt_string" or "content": a list of text parts')
    if any(piece.type != "text" for piece in part.content):
        raise ApiError(400, f"input[{index}]: only text content parts are supported (text-only checkpoints)")
    return "".join(piece.text or "" for piece in part.content)
