"""Prompt lookup's n-gram index: where did the current suffix last occur, and what followed it."""

from __future__ import annotations

from collections.abc import Iterable

NGRAM_MAX = 3
NGRAM_MIN = 2


class NgramIndex:
    """Incremental: appending a token records the n-grams that now have a follower.

    For the sequence a b c a b the suffix (a, b) last occurred at 0..1 and was followed by c at
    position 2, so `lookup` proposes [c, a, b, ...]. The suffix itself is never its own match:
    its n-grams are only recorded once a token follows them.
    """

    def __init__(self, ngram_min: int = NGRAM_MIN, ngram_max: int = NGRAM_MAX) -> None:
        self.tokens: list[int] = []
        self.sizes = range(ngram_max, ngram_min - 1, -1)
        self._followers: dict[int, dict[tuple[int, ...], int]] = {n: {} for n in self.sizes}

    def __len__(self) -> int:
        return len(self.tokens)

    def extend(self, tokens: Iterable[int]) -> None:
        for token in tokens:
            at = len(self.tokens)
            self.tokens.append(token)
            for n in self.sizes:
                if at >= n:
                    self._followers[n][tuple(self.tokens[at - n : at])] = at

    def lookup(self, max_tokens: int) -> list[int]:
        """Up to max_tokens tokens that followed the latest earlier occurrence of the suffix."""
        if max_tokens <= 0:
            return []
        for n in self.sizes:
            if len(self.tokens) < n:
                continue
            start = self._followers[n].get(tuple(self.tokens[-n:]))
            if start is not None:
                return self.tokens[start : start + max_tokens]
        return []
