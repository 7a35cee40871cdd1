"""Token log-probabilities in each route's shape: llama-server's `completion_probabilities` and
OpenAI chat's and completions' `logprobs` (app/sampling/logprobs.py computes them)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import msgspec
from mlx_lm.tokenizer_utils import TokenizerWrapper
from msgspec import UNSET, UnsetType

from app.decoding.builder import RowRequest
from app.loading.token_bytes import token_bytes, token_text
from app.sampling.logprobs import TokenLogprob


class TokenProbability(msgspec.Struct, kw_only=True):
    """llama-server's candidate: `logprob`, or `prob` with post_sampling_probs."""

    id: int
    token: str
    bytes: list[int]
    logprob: float | UnsetType = UNSET
    prob: float | UnsetType = UNSET


class CompletionProbability(TokenProbability, kw_only=True):
    """One decided token of llama-server's `completion_probabilities`, with its top candidates."""

    top_logprobs: list[TokenProbability] | UnsetType = UNSET
    top_probs: list[TokenProbability] | UnsetType = UNSET


class TopLogprob(msgspec.Struct, kw_only=True):
    token: str
    logprob: float
    bytes: list[int]


class ChatTokenLogprob(TopLogprob, kw_only=True):
    top_logprobs: list[TopLogprob]


class ChatLogprobs(msgspec.Struct, kw_only=True):
    """OpenAI's chat log-probabilities: one entry per token of the message (or of the chunk)."""

    content: list[ChatTokenLogprob]
    refusal: None = None


class TextLogprobs(msgspec.Struct, kw_only=True):
    """OpenAI's completion log-probabilities: parallel lists, one entry per token."""

    tokens: list[str]
    token_logprobs: list[float]
    top_logprobs: list[dict[str, float]]
    text_offset: list[int]


@dataclass
class Logprobs:
    """One row's token log-probabilities in each route's shape (app/sampling/logprobs.py
    computes them). OpenAI completions' `text_offset` runs on from chunk to chunk of the row."""

    tokenizer: TokenizerWrapper
    post_sampling: bool
    offset: int = 0  # characters of completion text before the next entry

    def _piece(self, token: int) -> tuple[str, list[int]]:
        raw = token_bytes(self.tokenizer, token)
        return token_text(raw), list(raw)

    def _candidate(self, token: int, logprob: float) -> TokenProbability:
        text, raw = self._piece(token)
        if self.post_sampling:
            return TokenProbability(id=token, token=text, bytes=raw, prob=math.exp(logprob))
        return TokenProbability(id=token, token=text, bytes=raw, logprob=logprob)

    def native(self, entries: Sequence[TokenLogprob]) -> list[CompletionProbability]:
        """llama-server's `completion_probabilities`: probabilities with post_sampling_probs."""
        shaped = []
        for entry in entries:
            top = [self._candidate(token, logprob) for token, logprob in entry.top]
            chosen = msgspec.structs.asdict(self._candidate(entry.token, entry.logprob))
            listed = {"top_probs": top} if self.post_sampling else {"top_logprobs": top}
            shaped.append(CompletionProbability(**chosen, **listed))
        return shaped

    def chat(self, entries: Sequence[TokenLogprob]) -> ChatLogprobs:
        """OpenAI chat's `logprobs`."""
        return ChatLogprobs(content=[self._chat_entry(entry) for entry in entries])

    def _chat_entry(self, entry: TokenLogprob) -> ChatTokenLogprob:
        top = [self._alternative(token, logprob) for token, logprob in entry.top]
        chosen = msgspec.structs.asdict(self._alternative(entry.token, entry.logprob))
        return ChatTokenLogprob(**chosen, top_logprobs=top)

    def _alternative(self, token: int, logprob: float) -> TopLogprob:
        text, raw = self._piece(token)
        return TopLogprob(token=text, logprob=logprob, bytes=raw)

    def text(self, entries: Sequence[TokenLogprob]) -> TextLogprobs:
        """OpenAI completions' `logprobs`; each token's alternatives include it (OpenAI's "up to n + 1")."""
        tokens, offsets, tops = [], [], []
        for entry in entries:
            text = self._piece(entry.token)[0]
            tokens.append(text)
            offsets.append(self.offset)
            self.offset += len(text)
            tops.append({self._piece(t)[0]: lp for t, lp in entry.top} | {text: entry.logprob})
        return TextLogprobs(
            tokens=tokens, token_logprobs=[e.logprob for e in entries], top_logprobs=tops, text_offset=offsets
        )


def logprobs_for(tokenizer: TokenizerWrapper, rows: Sequence[RowRequest]) -> list[Logprobs | None]:
    """One shaper per row (each choice's `text_offset` runs on in its own text); None for a row
    whose request asked for no log-probabilities."""
    return [None if row.probs is None else Logprobs(tokenizer, row.probs.post_sampling) for row in rows]
