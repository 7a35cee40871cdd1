"""Fill-in-the-middle tokens, found from the tokenizer's vocabulary as llama.cpp finds them.

A model trained for fill-in-the-middle (FIM) has three control tokens around the gap: one before
the prefix, one before the suffix and one after which the middle is written. Their spelling
differs by family, so each is looked for under every spelling llama.cpp knows (Qwen-coder's
`<|fim_prefix|>`, StarCoder's `<fim_prefix>`, CodeLlama's `▁<PRE>`, DeepSeek-coder's
`<｜fim▁begin｜>`); a repository token and a file separator, where the model has them, carry the
extra context of other files (Qwen2.5-coder's `<|repo_name|>` and `<|file_sep|>`). Pure Python.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

# Each role's spellings, in llama.cpp's order of preference (llama-vocab.cpp)
SPELLINGS: dict[str, tuple[str, ...]] = {
    "prefix": ("<|fim_prefix|>", "<fim-prefix>", "<fim_prefix>", "▁<PRE>", "<PRE>", "<｜fim▁begin｜>"),
    "suffix": ("<|fim_suffix|>", "<fim-suffix>", "<fim_suffix>", "▁<SUF>", "<SUF>", "<｜fim▁hole｜>"),
    "middle": ("<|fim_middle|>", "<fim-middle>", "<fim_middle>", "▁<MID>", "<MID>", "<｜fim▁end｜>"),
    "pad": ("<|fim_pad|>", "<fim-pad>", "<fim_pad>"),
    "repo": ("<|fim_repo|>", "<|repo_name|>", "<fim-repo>", "<REPO>", "<reponame>"),
    "separator": ("<|file_sep|>", "<fim-sep>", "<file_sep>", "<SEP>"),
}
REQUIRED = ("prefix", "suffix", "middle")


@dataclass(frozen=True)
class FimTokens:
    """The FIM tokens a vocabulary has (an id per role, or None)."""

    prefix: int | None = None
    suffix: int | None = None
    middle: int | None = None
    pad: int | None = None
    repo: int | None = None
    separator: int | None = None

    @property
    def missing(self) -> list[str]:
        """The required roles the vocabulary has no token for."""
        return [role for role in REQUIRED if getattr(self, role) is None]

    @property
    def supported(self) -> bool:
        return not self.missing

    @property
    def ends(self) -> frozenset[int]:
        """Tokens that end a middle, as llama.cpp counts them among the end-of-generation tokens:
        the padding, repository and file-separator tokens (the model moved on to another file)."""
        return frozenset(t for t in (self.pad, self.repo, self.separator) if t is not None)

    def refusal(self) -> str:
        """Why this vocabulary cannot fill in the middle, naming what it lacks (llama-server's words first)."""
        lacking = " ".join(f"{role} token is missing." for role in self.missing)
        looked = "; ".join(f"{role}: {' '.join(SPELLINGS[role])}" for role in self.missing)
        return (
            f"Infill is not supported by this model: {lacking} The tokenizer has none of the fill-in-the-middle "
            f"tokens looked for ({looked}); serve a model trained for fill-in-the-middle (a coder model)"
        )


def find(token_id: Callable[[str], int | None]) -> FimTokens:
    """The FIM tokens of a vocabulary, `token_id(spelling)` giving a spelling's id (None: not a token)."""
    found: dict[str, int] = {}
    for role, spellings in SPELLINGS.items():
        for spelling in spellings:
            token = token_id(spelling)
            if token is not None:
                found[role] = token
                break
    return FimTokens(**found)


def vocabulary_lookup(vocabulary: dict[str, int], unknown: int | None) -> Callable[[str], int | None]:
    """`token_id` over a tokenizer's whole vocabulary (added tokens included); its unknown token is no token."""
    return lambda spelling: None if (token := vocabulary.get(spelling)) is None or token == unknown else token


@functools.lru_cache(maxsize=4)
def tokenizer_fim_tokens(tokenizer: Any) -> FimTokens:
    """The FIM tokens of an mlx-lm tokenizer (found once per tokenizer)."""
    hf = tokenizer._tokenizer
    return find(vocabulary_lookup(hf.get_vocab(), hf.unk_token_id))
