"""The sampler pipeline: logits to the final probability row `p` that acceptance rules read.

Order (llama-server's, and the contract's): token bias, repetition penalty, frequency and
presence penalties over the last `repeat_last_n` tokens, then top-k, top-p and min-p on the
untempered distribution, XTC on the renormalised filtered row, and temperature last.
Every function takes rows `[R, V]`, so a verify forward's k+1 positions go through in one call.
"""

from __future__ import annotations

from collections.abc import Sequence

import mlx.core as mx

from app.sampling.distribution import Distribution
from app.sampling.params import SamplingParams
from app.sampling.rng import RowRng
from app.sampling.streams import position_keys


class SamplerPipeline:
    """One request's sampler, built once and applied to any number of rows."""

    def __init__(self, params: SamplingParams, vocab_size: int) -> None:
        self.params = params
        self.vocab_size = vocab_size
        self._bias: mx.array | None = None
        if params.logit_bias:
            ids = mx.array(list(params.logit_bias.keys()))
            values = mx.array(list(params.logit_bias.values()), dtype=mx.float32)
            self._bias = mx.zeros((vocab_size,), dtype=mx.float32).at[ids].add(values)

    @property
    def is_greedy(self) -> bool:
        return self.params.is_greedy

    @property
    def uses_coin(self) -> bool:
        """Whether XTC can apply, so each sampled position also takes a coin (`distribution`'s `coins`)."""
        return self.params.xtc_probability > 0.0 and self.params.xtc_threshold <= 0.5

    @property
    def needs_context(self) -> bool:
        """Whether rows need their penalty windows (otherwise pass `contexts=None`)."""
        return self.params.has_penalties

    def adjust(self, logits: mx.array, contexts: Sequence[Sequence[int]] | None = None) -> mx.array:
        """Token bias then penalties. `contexts[r]` is row r's penalty window."""
        logits = logits.astype(mx.float32)
        if self._bias is not None:
            logits = logits + self._bias
        if self.params.has_penalties and contexts is not None:
            logits = mx.stack([self._penalise(row, ctx) for row, ctx in zip(logits, contexts, strict=True)])
        return logits

    def _penalise(self, row: mx.array, context: Sequence[int]) -> mx.array:
        if not context:
            return row
        counts = mx.zeros(row.shape, dtype=mx.float32).at[mx.array(list(context))].add(1.0)
        seen = counts > 0
        p = self.params
        repeated = mx.where(row <= 0, row * p.repeat_penalty, row / p.repeat_penalty)
        row = mx.where(seen, repeated, row)
        return row - counts * p.frequency_penalty - seen.astype(mx.float32) * p.presence_penalty

    def greedy(self, logits: mx.array, contexts: Sequence[Sequence[int]] | None = None) -> mx.array:
        """Argmax of the adjusted rows `[R]`: the whole sampler when it is greedy."""
        return mx.argmax(self.adjust(logits, contexts), axis=-1)

    def distribution(
        self, logits: mx.array, contexts: Sequence[Sequence[int]] | None = None, coins: mx.array | None = None
    ) -> Distribution:
        """The final probability rows `p` (for a non-greedy sampler), on their candidate set;
        `coins` `[R]`: each row's XTC coin (None: no XTC, as for q rows and log-probabilities)."""
        adjusted = self.adjust(logits, contexts)
        vocab = adjusted.shape[-1]
        top_k = self.params.top_k
        if 0 < top_k < vocab:
            # Only the top_k candidates can survive: sort those instead of the whole vocabulary.
            candidates = mx.argpartition(-adjusted, kth=top_k - 1, axis=-1)[:, :top_k]
            values = mx.take_along_axis(adjusted, candidates, axis=-1)
        else:
            candidates, values = None, adjusted
        order = mx.argsort(-values, axis=-1)
        ranked = mx.take_along_axis(values, order, axis=-1)
        keep = self._filter(ranked, coins)
        tempered = mx.where(keep, ranked / max(self.params.temperature, 1e-6), -mx.inf)
        token_ids = order if candidates is None else mx.take_along_axis(candidates, order, axis=-1)
        return Distribution(ids=token_ids, probs=mx.softmax(tempered, axis=-1), vocab=vocab)

    def _filter(self, ranked: mx.array, coins: mx.array | None) -> mx.array:
        """Keep-mask over candidates sorted by descending logit, on the untempered distribution.

        Sorted candidates make every filter keep a prefix, so the filters reduce to a count of
        kept leading candidates (and XTC to a start). top-k was applied by choosing the
        candidates; top-p is measured on the renormalised top-k row, and min-p is a ratio to the
        top probability, which renormalising does not change.
        """
        p = self.params
        rows, width = ranked.shape
        rank = mx.arange(width)[None, :]
        probs = mx.softmax(ranked, axis=-1)
        kept = mx.full((rows, 1), width)
        if p.top_p < 1.0:
            mass_before = mx.cumsum(probs, axis=-1) - probs
            kept = mx.minimum(kept, mx.sum(mass_before < p.top_p, axis=-1, keepdims=True))
        if p.min_p > 0.0:
            kept = mx.minimum(kept, mx.sum(probs >= p.min_p * probs[:, :1], axis=-1, keepdims=True))
        keep = rank < kept
        if self.uses_coin and coins is not None:
            keep = keep & self._xtc_mask(probs, keep, rank, coins)
        return keep

    def _xtc_mask(self, probs: mx.array, keep: mx.array, rank: mx.array, coins: mx.array) -> mx.array:
        """Exclude Top Choices: drop every token above the threshold but the least likely of them.

        Measured on the renormalised filtered row; one U[0, 1) coin per row decides whether it applies.
        """
        filtered = mx.where(keep, probs, 0.0)
        filtered = filtered / mx.sum(filtered, axis=-1, keepdims=True)
        above = mx.sum(filtered >= self.params.xtc_threshold, axis=-1, keepdims=True)
        applies = (coins[:, None] <= self.params.xtc_probability) & (above >= 2)
        return ~applies | (rank >= above - 1)

    def sample(
        self, logits: mx.array, contexts: Sequence[Sequence[int]] | None, rng: RowRng, forced: bool = False
    ) -> tuple[int, Distribution | None]:
        """Decide one token from one row of logits `[1, V]`; returns (token, p or None if greedy).
        `forced`: the grammar allows one token here, which is decided drawing nothing (app/sampling/streams.py)."""
        if self.is_greedy:
            return int(self.greedy(logits, contexts)[0].item()), None
        keys = position_keys(rng, [not forced], self.uses_coin)
        p = self.distribution(logits, contexts, keys.coins)
        token = int(keys.draw(p).item())
        keys.consume(1)
        return token, p
