"""Fill-in-the-middle prompts: llama-server's /infill and the `suffix` of /v1/completions.

The prompt is laid out as llama-server's format_prompt_infill lays it out, in llama.cpp's
repository-level pattern (Qwen2.5-coder's, arXiv 2409.12186), so every FIM family reads the
order it was trained on and prompt lookup sees the suffix and the other files' text (they are in
the prompt's tokens):

    [REPO]myproject\\n [SEP]filename0\\n extra 0 ... [SEP]filename\\n
    [BOS] [PRE] prefix prompt [SUF] suffix [MID]

A model without a repository or separator token gets the other files' text after a plain
`--- snippet ---` line each, as llama-server gives it. As there, the prefix keeps its last
3/4 of a 2048-token batch, the suffix its first 1/4 (less the prompt), and the extra context what
the context leaves beyond one batch and twice the server's default `n_predict`, its latest text
first. The text of the prefix, the suffix and the files is never read for control tokens (a
`<|fim_middle|>` in the code is text); the `prompt` is, as llama-server tokenizes it.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any

from mlx_lm.tokenizer_utils import TokenizerWrapper
from msgspec import UNSET

from app.loading import fim
from app.loading.fim import FimTokens
from app.server.core.prompts import NO_MULTIMODAL, Prompt, is_many
from app.server.core.requests import check_token_ids
from app.server.core.schemas import PromptInput, PromptObject
from app.server.errors import ApiError

N_BATCH = 2048  # llama-server's default --batch-size, which sizes its prefix and suffix takes
REPOSITORY = "myproject\n"  # llama-server's: the repository is not an input
CURRENT_FILE = "filename\n"  # llama-server's: the current file's name is not an input
SNIPPET = "\n\n--- snippet ---\n\n"  # a chunk's header where the model has no file separator
EXTRA_SHAPE = '"input_extra" must be an array of {"filename": string, "text": string}'


@dataclass(frozen=True)
class ExtraChunk:
    """One of `input_extra`: another file's text (`filename` "tmp" where none is given)."""

    filename: str
    text: str


def require_fim(tokenizer: TokenizerWrapper) -> FimTokens:
    """The tokenizer's FIM tokens; 400 naming the missing ones where it lacks any."""
    tokens = fim.tokenizer_fim_tokens(tokenizer)
    if not tokens.supported:
        raise ApiError(400, tokens.refusal())
    return tokens


@functools.lru_cache(maxsize=4)
def _bos(tokenizer: TokenizerWrapper) -> tuple[int, ...]:
    """What the tokenizer puts before a text of its own accord (its BOS, or nothing)."""
    return tuple(tokenizer.encode("", add_special_tokens=True))


def plain_tokens(tokenizer: TokenizerWrapper, text: str) -> list[int]:
    """`text`'s tokens, control-token spellings in it split as text, no BOS."""
    return list(tokenizer.encode(text, add_special_tokens=False, split_special_tokens=True)) if text else []


def text_or_tokens(value: Any, name: str, tokenizer: TokenizerWrapper, vocab: int) -> list[int]:
    """A prefix or suffix: a string, or token ids mixed with strings (llama-server's tokenize_mixed)."""
    if isinstance(value, str):
        return plain_tokens(tokenizer, value)
    if isinstance(value, list) and all(isinstance(p, str | int) and not isinstance(p, bool) for p in value):
        tokens: list[int] = []
        for piece in value:
            tokens.extend(plain_tokens(tokenizer, piece) if isinstance(piece, str) else [piece])
        check_token_ids(tokens, vocab)
        return tokens
    raise ApiError(400, f'"{name}" must be a string or a list of token ids and strings')


def extra_chunks(value: Any) -> list[ExtraChunk]:
    """`input_extra` checked as llama-server checks it (unknown keys of a chunk are ignored)."""
    if value is UNSET or value is None:
        return []
    if not isinstance(value, list):
        raise ApiError(400, EXTRA_SHAPE)
    chunks = []
    for chunk in value:
        if not isinstance(chunk, dict) or not isinstance(chunk.get("text"), str):
            raise ApiError(400, 'extra_context chunk must contain a "text" field with a string value')
        filename = chunk.get("filename", "tmp")
        if not isinstance(filename, str):
            raise ApiError(400, 'extra_context chunk\'s "filename" field must be a string')
        chunks.append(ExtraChunk(filename, chunk["text"]))
    return chunks


def extra_context(tokenizer: TokenizerWrapper, tokens: FimTokens, chunks: list[ExtraChunk]) -> list[int]:
    """The other files' text, each after its separator and name, between the repository and the current file."""
    extra: list[int] = []
    if tokens.repo is not None:
        extra += [tokens.repo, *plain_tokens(tokenizer, REPOSITORY)]
    for chunk in chunks:
        if tokens.separator is not None:
            extra += [tokens.separator, *plain_tokens(tokenizer, chunk.filename + "\n")]
        else:
            extra += plain_tokens(tokenizer, SNIPPET)
        extra += plain_tokens(tokenizer, chunk.text)
    if tokens.separator is not None:
        extra += [tokens.separator, *plain_tokens(tokenizer, CURRENT_FILE)]
    return extra


@dataclass(frozen=True)
class Gap:
    """What surrounds the middle to fill, tokenized: the extra context, the prefix, the prompt
    (the middle's given start) and the suffix."""

    prefix: list[int]
    suffix: list[int]
    extra: list[int]
    prompt: list[int]


def fim_prompt(tokenizer: TokenizerWrapper, tokens: FimTokens, gap: Gap, n_ctx: int, n_predict: int) -> list[int]:
    """The prompt's tokens in llama-server's layout and takes (the module's docstring)."""
    assert tokens.prefix is not None and tokens.suffix is not None and tokens.middle is not None
    n_prefix = min(len(gap.prefix), 3 * (N_BATCH // 4))
    n_suffix = min(len(gap.suffix), max(0, N_BATCH // 4 - (2 + len(gap.prompt))))
    n_extra = min(max(0, n_ctx - N_BATCH - 2 * n_predict), len(gap.extra))
    head = [tokens.prefix, *gap.prefix[len(gap.prefix) - n_prefix :], *gap.prompt]
    extra = gap.extra[len(gap.extra) - n_extra :]
    return [*extra, *_bos(tokenizer), *head, tokens.suffix, *gap.suffix[:n_suffix], tokens.middle]


def infill_prompt(
    prefix: Any,
    suffix: Any,
    extra: Any,
    prompt: Any,
    tokenizer: TokenizerWrapper,
    vocab: int,
    n_ctx: int,
    n_predict: int,
) -> Prompt:
    """/infill's prompt from its fields, checked in llama-server's order and words. Blocking:
    call it off the event loop."""
    tokens = require_fim(tokenizer)
    if not isinstance(prompt, str):
        raise ApiError(400, '"prompt" must be a string')
    for name, value in (("input_prefix", prefix), ("input_suffix", suffix)):
        if value is UNSET:
            raise ApiError(400, f'"{name}" is required')
    gap = Gap(
        prefix=text_or_tokens(prefix, "input_prefix", tokenizer, vocab),
        suffix=text_or_tokens(suffix, "input_suffix", tokenizer, vocab),
        extra=extra_context(tokenizer, tokens, extra_chunks(extra)),
        prompt=list(tokenizer.encode(prompt, add_special_tokens=False)) if prompt else [],
    )
    ids = fim_prompt(tokenizer, tokens, gap, n_ctx, n_predict)
    return Prompt(ids, tokenizer.decode(ids))


def suffix_prompts(
    prompt: PromptInput, suffix: str, tokenizer: TokenizerWrapper, vocab: int, n_ctx: int, n_predict: int
) -> list[Prompt]:
    """/v1/completions with a `suffix`: each prompt is a prefix, filled up to the suffix (its text,
    for `echo`, is the prompt as sent). Blocking: call it off the event loop."""
    tokens = require_fim(tokenizer)
    suffix_tokens = plain_tokens(tokenizer, suffix)
    filled = []
    for part in prompt if is_many(prompt) else [prompt]:
        if isinstance(part, PromptObject) and part.multimodal_data is not UNSET:
            raise ApiError(400, NO_MULTIMODAL)
        given = part.prompt_string if isinstance(part, PromptObject) else part
        prefix = text_or_tokens(given, "prompt", tokenizer, vocab)
        gap = Gap(prefix=prefix, suffix=suffix_tokens, extra=extra_context(tokenizer, tokens, []), prompt=[])
        text = given if isinstance(given, str) else tokenizer.decode(prefix)
        filled.append(Prompt(fim_prompt(tokenizer, tokens, gap, n_ctx, n_predict), text))
    if not filled:
        raise ApiError(400, "prompt must not be empty")
    return filled
