"""The sampler pipeline: logits to the final probability row `p` that acceptance rules read.

Order (llama-server's default chain, and the contract's): token bias, repetition penalty, frequency
and presence penalties over the last `repeat_last_n` tokens, DRY over the last `dry_penalty_last_n`,
top-n-sigma, then top-k, locally typical, top-p and min-p on the untempered distribution (each on
the row the stage before it left, renormalised), XTC on the renormalised filtered row, and the
temperature (dynamic, with `dynatemp_range`) last. With `mirostat`, as in llama-server, the chain is
token bias, temperature and mirostat alone (app/sampling/mirostat.py).
Every function takes rows `[R, V]`, so a verify forward's k+1 positions go through in one call;
`contexts[r]` is row r's history window (`context_length` long), drafts before it included.
"""

from __future__ import annotations

from collections.abc import Sequence

import mlx.core as mx

from app.sampling import stages
from app.sampling.distribution import Distribution
from app.sampling.dry import dry_penalties
from app.sampling.mirostat import MirostatState
from app.sampling.params import SamplingParams
from app.sampling.rng import RowRng
from app.sampling.streams import position_keys


def _tail(window: Sequence[int], last_n: int) -> Sequence[int]:
    """The last `last_n` tokens of a window (-1: all of it)."""
    return window if last_n < 0 else window[max(0, len(window) - last_n) :] if last_n else []


class SamplerPipeline:
    """One row's sampler, built once and applied to any number of its positions.

    Per row, because mirostat keeps state: `observe` settles it past the tokens the row decides.
    """

    def __init__(self, params: SamplingParams, vocab_size: int) -> None:
        self.params = params
        self.vocab_size = vocab_size
        self._bias: mx.array | None = None
        if params.logit_bias:
            ids = mx.array(list(params.logit_bias.keys()))
            values = mx.array(list(params.logit_bias.values()), dtype=mx.float32)
            self._bias = mx.zeros((vocab_size,), dtype=mx.float32).at[ids].add(values)
        self.mirostat: MirostatState | None = None
        if params.mirostat and not params.is_greedy:
            p = params
            self.mirostat = MirostatState(p.mirostat, p.mirostat_tau, p.mirostat_eta, p.temperature, vocab_size)

    @property
    def is_greedy(self) -> bool:
        return self.params.is_greedy

    @property
    def uses_coin(self) -> bool:
        """Whether XTC can apply, so each sampled position also takes a coin (`distribution`'s `coins`)."""
        return self.params.xtc_probability > 0.0 and self.params.xtc_threshold <= 0.5

    @property
    def needs_context(self) -> bool:
        """Whether rows need their history windows (otherwise pass `contexts=None`)."""
        return self.params.context_length != 0

    def observe(self, rows: Distribution | None, tokens: Sequence[int]) -> None:
        """The row decided `tokens`, in order, from `rows` (None: greedily, or forced by a grammar)."""
        if self.mirostat is not None:
            self.mirostat.observe(rows, tokens)

    def adjust(self, logits: mx.array, contexts: Sequence[Sequence[int]] | None = None) -> mx.array:
        """Token bias, then penalties and DRY. `contexts[r]` is row r's history window."""
        logits = logits.astype(mx.float32)
        if self._bias is not None:
            logits = logits + self._bias
        if contexts is not None and self.params.has_penalties:
            last_n = self.params.repeat_last_n
            logits = mx.stack(
                [self._penalise(row, _tail(ctx, last_n)) for row, ctx in zip(logits, contexts, strict=True)]
            )
        if contexts is not None and self.params.has_dry:
            logits = mx.stack([self._dry(row, ctx) for row, ctx in zip(logits, contexts, strict=True)])
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

    def _dry(self, row: mx.array, context: Sequence[int]) -> mx.array:
        p = self.params
        window = list(_tail(context, p.dry_penalty_last_n))
        penalties = dry_penalties(window, p.dry_multiplier, p.dry_base, p.dry_allowed_length, p.dry_breakers)
        if not penalties:
            return row
        ids = mx.array(list(penalties.keys()))
        return row.at[ids].add(-mx.array(list(penalties.values()), dtype=mx.float32))

    def greedy(self, logits: mx.array, contexts: Sequence[Sequence[int]] | None = None) -> mx.array:
        """Argmax of the adjusted rows `[R]`: the whole sampler when it is greedy."""
        return mx.argmax(self.adjust(logits, contexts), axis=-1)

    def distribution(
        self, logits: mx.array, contexts: Sequence[Sequence[int]] | None = None, coins: mx.array | None = None
    ) -> Distribution:
        """The final probability rows `p` (for a non-greedy sampler), on their candidate set;
        `coins` `[R]`: each row's XTC coin (None: no XTC, as for q rows and log-probabilities)."""
        adjusted = self.adjust(logits, contexts)
        if self.mirostat is not None:
            previous = None if contexts is None else [ctx[-1] if ctx else -1 for ctx in contexts]
            return self.mirostat.rows(adjusted, previous)
        if self.params.top_n_sigma > 0.0:
            adjusted = stages.top_n_sigma(adjusted, self.params.top_n_sigma)
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
        tempered = mx.where(keep, ranked / self._temperature(ranked, keep), -mx.inf)
        token_ids = order if candidates is None else mx.take_along_axis(candidates, order, axis=-1)
        return Distribution(ids=token_ids, probs=mx.softmax(tempered, axis=-1), vocab=vocab)

    def _temperature(self, ranked: mx.array, keep: mx.array) -> mx.array | float:
        p = self.params
        if p.dynatemp_range > 0.0:
            t = stages.dynamic_temperature(
                mx.softmax(ranked, axis=-1), keep, p.temperature, p.dynatemp_range, p.dynatemp_exponent
            )
            return mx.maximum(t, 1e-6)
        return max(p.temperature, 1e-6)

    def _filter(self, ranked: mx.array, coins: mx.array | None) -> mx.array:
        """Keep-mask over candidates sorted by descending logit, on the untempered distribution.

        top-k was applied by choosing the candidates. Sorted candidates make top-p and min-p keep a
        prefix of what the stage before them left: top-p is measured on the renormalised survivors
        of top-k and typical, and min-p is a ratio to the top survivor's probability, which
        renormalising does not change.
        """
        p = self.params
        rows, width = ranked.shape
        rank = mx.arange(width)[None, :]
        probs = mx.softmax(ranked, axis=-1)
        keep, survivors = mx.ones((rows, width), dtype=mx.bool_), probs
        if p.typical_p < 1.0:
            keep = stages.typical(probs, p.typical_p)
            survivors = mx.where(keep, probs, 0.0)
            survivors = survivors / mx.sum(survivors, axis=-1, keepdims=True)
        if p.top_p < 1.0:  # at least the top survivor, as llama-server's min_keep (top_p 0, or below float32's least)
            mass_before = mx.cumsum(survivors, axis=-1) - survivors
            keep = keep & (rank < mx.maximum(mx.sum(mass_before < p.top_p, axis=-1, keepdims=True), 1))
        if p.min_p > 0.0:
            keep = keep & (survivors >= p.min_p * mx.max(survivors, axis=-1, keepdims=True))
        if self.uses_coin and coins is not None:
            keep = keep & self._xtc_mask(probs, keep, rank, coins)
        return keep

    def _xtc_mask(self, probs: mx.array, keep: mx.array, rank: mx.array, coins: mx.array) -> mx.array:
        """Exclude Top Choices: drop every token above the threshold but the least likely of them.

        Measured on the renormalised filtered row; one U[0, 1) coin per row decides whether it applies.
        """
        filtered = mx.where(keep, probs, 0.0)
        filtered = filtered / mx.sum(filtered, axis=-1, keepdims=True)
        over = keep & (
            filtered >= self.params.xtc_threshold
        )  # among the kept: a threshold of 0 is no reason to revive one
        above = mx.sum(over, axis=-1, keepdims=True)
        least_likely = mx.max(mx.where(over, rank, -1), axis=-1, keepdims=True)  # of those above
        applies = (coins[:, None] <= self.params.xtc_probability) & (above >= 2)
        return ~applies | (rank >= least_likely)

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
