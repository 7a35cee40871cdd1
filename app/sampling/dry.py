"""DRY ("don't repeat yourself"): a penalty on the token that would extend a repeat of the row's history.

llama-server's rule: look back over the last `dry_penalty_last_n` tokens; for every earlier spot where
the history's suffix recurs (at least `dry_allowed_length` tokens), the token that followed it there
gets `dry_multiplier * dry_base ** (length - dry_allowed_length)` off its logit. A repeat never reaches
back past a sequence breaker, and a token that is itself a breaker is never penalised. A pure function
of the window, so each verify position gets the penalty of its own history, drafts included.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from mlx_lm.tokenizer_utils import TokenizerWrapper

DEFAULT_BREAKERS = ("\n", ":", '"', "*")
MAX_BREAKER_CHARS = 40  # llama-server truncates longer breakers, and their tails to MAX_TAIL_TOKENS
MAX_TAIL_TOKENS = 20
# Each breaker is matched against every token's text (Python over the vocabulary, and a tokenizer
# call per partial match): a request may name this many, as it may name server.max_stop_strings stops.
MAX_BREAKERS = 16
FLOAT_MAX_LOG = 88.7228391  # log(float32 max): the exponent is capped so the penalty stays finite

# head token -> the token tails that must follow it to complete a breaker (an empty tail: the head is one)
Breakers = dict[int, tuple[tuple[int, ...], ...]]


def sequence_breakers(
    breakers: Sequence[str], token_texts: Sequence[str], encode: Callable[[str], list[int]]
) -> Breakers:
    """Breaker strings as token sequences: every token whose text contains a breaker is one by itself,
    and a token whose text ends with the start of a breaker is one when the breaker's rest follows it."""
    found: dict[int, set[tuple[int, ...]]] = {}
    for breaker in (b[:MAX_BREAKER_CHARS] for b in breakers if b):
        for token, text in enumerate(token_texts):
            if breaker in text:
                found.setdefault(token, set()).add(())
                continue
            for start in range(len(text)):
                overlap = text[start:]
                if breaker.startswith(overlap):
                    tail = tuple(encode(breaker[len(overlap) :])[:MAX_TAIL_TOKENS])
                    found.setdefault(token, set()).add(tail)
    return {token: tuple(sorted(tails)) for token, tails in found.items()}


@functools.lru_cache(maxsize=4)
def _token_texts(tokenizer: TokenizerWrapper) -> tuple[str, ...]:
    """Every token's text, as DRY matches breakers against it (once per tokenizer: it walks the vocabulary)."""
    hf = tokenizer._tokenizer
    return tuple(hf.batch_decode([[token] for token in range(len(hf))]))


@functools.lru_cache(maxsize=64)
def dry_breakers(tokenizer: TokenizerWrapper, breakers: tuple[str, ...], tenant: str) -> Breakers:
    """DRY's sequence breakers as `tokenizer`'s token sequences, remembered per breaker list and
    `tenant`: a list's first use walks the vocabulary (7-22 ms on the embedded target), a
    remembered one costs nothing, so a cache shared by tenants would tell one whether another had
    sent a list (docs/reliability.md, "Tenants and the caches")."""
    return sequence_breakers(
        breakers, _token_texts(tokenizer), lambda text: tokenizer.encode(text, add_special_tokens=False)
    )


def _repeat_limit(recent: np.ndarray, breakers: Breakers) -> int:
    """How far back a repeat may reach: up to the latest breaker (`recent[0]` is the last token)."""
    for i, token in enumerate(recent.tolist()):
        tails = breakers.get(token)
        if tails is None:
            continue
        longest = max(
            (len(t) for t in tails if len(t) <= i and all(t[o] == recent[i - o - 1] for o in range(len(t)))),
            default=-1,
        )
        if longest >= 0:
            return i - longest
    return len(recent)


def dry_penalties(
    window: Sequence[int], multiplier: float, base: float, allowed: int, breakers: Breakers
) -> dict[int, float]:
    """Token -> the amount DRY takes off its logit after `window` (the history it looks back over)."""
    if len(window) <= allowed:
        return {}
    recent = np.array(window[::-1], dtype=np.int64)  # recent[0] is the last token
    size = len(recent)
    limit = _repeat_limit(recent, breakers)
    if limit < allowed:
        return {}
    # lengths[k - 1]: how many tokens the suffix shares with the history ending k tokens back
    lengths = np.zeros(size - 1, dtype=np.int64)
    alive = np.arange(1, size)
    matched = 0
    while alive.size and matched < limit:
        alive = alive[alive + matched < size]
        alive = alive[recent[alive + matched] == recent[matched]]
        lengths[alive - 1] += 1
        matched += 1
    longest: dict[int, int] = {}
    for k in np.nonzero(lengths >= allowed)[0].tolist():
        token = int(recent[k])  # the token that followed the repeat there
        longest[token] = max(longest.get(token, 0), int(lengths[k]))
    cap = int(FLOAT_MAX_LOG / math.log(base)) if base > 1.000001 else 0
    return {
        token: multiplier * base ** (min(n - allowed, cap) if cap else n - allowed)
        for token, n in longest.items()
        if () not in breakers.get(token, ())
    }
