"""llama-server's prompt shapes: which `prompt` values are one prompt and which are many.

As llama-server's tokenize_input_prompts: a list holding no bare token id is a list of prompts,
anything else is one prompt. One prompt is a string, a list of token ids, a list mixing strings
and ids (each string tokenized in place; only a leading string gets the tokenizer's special
tokens, e.g. BOS), or `{"prompt_string": one of those}`. `multimodal_data` is refused: this
server loads text-only checkpoints.
"""

from __future__ import annotations

from dataclasses import dataclass

from mlx_lm.tokenizer_utils import TokenizerWrapper
from msgspec import UNSET

from app.profiles.schema import Settings
from app.server.core.requests import check_token_ids
from app.server.core.schemas import PromptInput, PromptObject
from app.server.errors import ApiError

NO_MULTIMODAL = "multimodal_data is not supported: this server runs text-only checkpoints"
BAD_ELEMENT = (
    "prompt: each element of a list of prompts must be a string, a list of token ids, "
    'a list mixing strings and token ids, or {"prompt_string": ...}'
)


@dataclass(frozen=True)
class Prompt:
    tokens: list[int]
    text: str  # the prompt as a client reads it back (`prompt` of the native body, OpenAI's echo)


def prompts(prompt: PromptInput, tokenizer: TokenizerWrapper, vocab: int) -> list[Prompt]:
    """The request's prompts, in order, tokenized. Blocking: call it off the event loop."""
    parts = prompt if is_many(prompt) else [prompt]
    if not parts:
        raise ApiError(400, "prompt must not be empty")
    return [one_prompt(part, tokenizer, vocab) for part in parts]


def one_prompt(part: object, tokenizer: TokenizerWrapper, vocab: int) -> Prompt:
    tokens = prompt_tokens(part, tokenizer, vocab)
    if not tokens:
        raise ApiError(400, "the prompt is empty")
    text = part.prompt_string if isinstance(part, PromptObject) else part
    return Prompt(tokens, text if isinstance(text, str) else tokenizer.decode(tokens))


def is_many(prompt: object) -> bool:
    """A list holding no bare token id is a list of prompts."""
    return isinstance(prompt, list) and not any(isinstance(piece, int) for piece in prompt)


def prompt_tokens(part: object, tokenizer: TokenizerWrapper, vocab: int) -> list[int]:
    """One prompt's tokens (perhaps none), its shape checked."""
    if isinstance(part, PromptObject):
        if part.multimodal_data is not UNSET:
            raise ApiError(400, NO_MULTIMODAL)
        part = part.prompt_string
    if isinstance(part, list) and part and all(isinstance(piece, str) for piece in part):
        raise ApiError(400, BAD_ELEMENT)  # strings only: a list of prompts, which cannot nest
    if isinstance(part, list) and not all(isinstance(piece, int | str) for piece in part):
        raise ApiError(400, "prompt: one prompt is a string, token ids, or strings mixed with token ids")
    tokens = mixed_tokens(part, tokenizer)
    check_token_ids(tokens, vocab)
    return tokens


def mixed_tokens(part: str | list[int | str], tokenizer: TokenizerWrapper) -> list[int]:
    """llama-server's tokenize_mixed: special tokens (BOS) only for a string in first place."""
    pieces = [part] if isinstance(part, str) else part
    tokens: list[int] = []
    for position, piece in enumerate(pieces):
        if isinstance(piece, int):
            tokens.append(piece)
        else:
            tokens.extend(tokenizer.encode(piece, add_special_tokens=position == 0))
    return tokens


def check_rows(n_prompts: int, n: int, settings: Settings) -> None:
    """One request runs its prompts × n rows side by side, so it may ask for at most server.max_rows."""
    if n < 1:
        raise ApiError(400, f"n must be >= 1, got {n}")
    limit = settings.server.max_rows
    if n_prompts * n > limit:
        raise ApiError(
            400,
            f"{n_prompts} prompt(s) x n = {n} make {n_prompts * n} rows; "
            f"this server runs at most {limit} per request (server.max_rows)",
        )
