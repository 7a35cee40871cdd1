"""llama-server's `infill` sampler stage, for fill-in-the-middle (llama_sampler_infill_apply).

On each row's survivors, in descending order: when end-of-generation tokens hold enough of the
mass (3 * p(EOG) * n > p(text)), only they remain; otherwise a token whose text is a prefix of
another's takes the other's probability (the likelier of the two keeps both), text tokens under
0.2 drop, then text tokens under 1/(n_text + 1) of what is left drop; with no text token left,
the row is the end-of-text token alone. A function of the row alone (its tokens' bytes, no
history, no randomness), so the drafter's rows q and the target's rows p go through it alike and
every acceptance rule stays what it was. It runs on the host over each row's survivors, at most
`MAX_CANDIDATES` of them (the prefix merge is quadratic): llama.vscode's chain puts it after
top_k 40.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    from mlx_lm.tokenizer_utils import TokenizerWrapper

MAX_CANDIDATES = 256
FIRST_THRESHOLD = 0.2


@dataclass(frozen=True, eq=False)
class InfillVocabulary:
    """What the stage reads of the tokenizer: each token's bytes, the end-of-generation tokens and
    the end-of-text token a row falls back to."""

    pieces: tuple[bytes, ...]
    eog: frozenset[int]
    eot: int


@functools.lru_cache(maxsize=4)
def infill_vocabulary(tokenizer: TokenizerWrapper) -> InfillVocabulary:
    """Once per tokenizer (it walks the vocabulary). The end-of-generation tokens are the EOS
    ones and a FIM model's padding, repository and file-separator tokens, as llama.cpp counts them."""
    from app.loading.fim import tokenizer_fim_tokens
    from app.loading.token_bytes import token_bytes

    eos = sorted(tokenizer.eos_token_ids)
    pieces = tuple(token_bytes(tokenizer, token) for token in range(len(tokenizer._tokenizer)))
    return InfillVocabulary(pieces, frozenset(eos) | tokenizer_fim_tokens(tokenizer).ends, eos[0] if eos else 0)


def with_infill(params: Any, tokenizer: TokenizerWrapper) -> Any:
    """`params` (SamplingParams) with the tokenizer's tables where its chain names the stage."""
    import msgspec

    if "infill" not in params.samplers or params.infill is not None:
        return params
    return msgspec.structs.replace(params, infill=infill_vocabulary(tokenizer))


def infill_row(ids: np.ndarray, probs: np.ndarray, vocabulary: InfillVocabulary) -> tuple[np.ndarray, np.ndarray]:
    """One row's survivors (`ids`, `probs` in descending order, renormalised, zero for the dropped)
    after the stage: new (ids, probs), the same length."""
    ids, probs = ids.copy(), probs.astype(np.float64)
    n = min(int(np.count_nonzero(probs > 0)), MAX_CANDIDATES)  # the survivors lead the descending row
    eog = np.array([int(t) in vocabulary.eog for t in ids[:n]], dtype=bool)
    live = probs[:n]
    p_eog, p_txt = float(live[eog].sum()), float(live[~eog].sum())
    out = np.zeros_like(probs)
    if 3 * p_eog * n > p_txt:
        out[:n][eog] = live[eog] / p_eog
        return ids, out
    merged = live.copy()
    dropped = np.zeros(n, dtype=bool)
    pieces = [vocabulary.pieces[int(t)] if int(t) < len(vocabulary.pieces) else b"" for t in ids[:n]]
    for i0 in range(n):
        for i1 in range(n):
            if dropped[i0]:
                break
            if i0 == i1 or dropped[i1]:
                continue
            if pieces[i0] and pieces[i1].startswith(pieces[i0]):
                dst, src = (i1, i0) if merged[i1] > merged[i0] else (i0, i1)
                merged[dst] += merged[src]
                merged[src], dropped[src] = 0.0, True
    keep = ~dropped & (eog | (merged >= FIRST_THRESHOLD))
    text_left = int(np.count_nonzero(keep & ~eog))
    if text_left == 0:
        ids[0], out[0] = vocabulary.eot, 1.0
        return ids, out
    merged = np.where(keep, merged, 0.0)
    merged /= merged.sum()
    keep &= eog | (merged >= 1.0 / (text_left + 1))
    merged = np.where(keep, merged, 0.0)
    out[:n] = merged / merged.sum()
    return ids, out


def infill_rows(ids: np.ndarray, probs: np.ndarray, vocabulary: InfillVocabulary) -> tuple[np.ndarray, np.ndarray]:
    """The stage on rows `[R, C]` (each row's candidates in descending order)."""
    rows = [infill_row(i, p, vocabulary) for i, p in zip(ids, probs, strict=True)]
    return np.stack([r[0] for r in rows]), np.stack([r[1] for r in rows])
