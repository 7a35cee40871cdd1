"""The sampler pipeline: logits to the final probability row `p` that acceptance rules read.

Token bias first, then the request's chain (app/sampling/chain.py), stage by stage in its order;
llama-server's default chain, and the contract's, is: repetition penalty, frequency and presence
penalties over the last `repeat_last_n` tokens, DRY over the last `dry_penalty_last_n`, top-n-sigma,
top-k, locally typical, top-p and min-p, XTC, and the temperature (dynamic, with `dynatemp_range`).
Each stage acts on the candidates the stages before it left, as llama-server's do: a filter measures
the survivors renormalised, and a stage after the temperature sees the tempered row. A stage the
chain leaves out does not run. With `mirostat`, as in llama-server, the chain is token bias,
temperature and mirostat alone (app/sampling/mirostat.py).
Every function takes rows `[R, V]`, so a verify forward's k+1 positions go through in one call;
`contexts[r]` is row r's history window (`context_length` long), drafts before it included.
The drafter's rows q and the target's rows p go through the same pipeline, so sampler-match stays
lossless for any chain.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence
from functools import cached_property

import mlx.core as mx
import numpy as np

from app.sampling import stages
from app.sampling.distribution import Distribution, stacked_draws
from app.sampling.dry import dry_penalties
from app.sampling.infill import infill_rows
from app.sampling.mirostat import MirostatState
from app.sampling.params import SamplingParams

# Stages that read the candidates in descending order (top-p's and XTC's prefixes, and ties
# broken the same way wherever the chain puts them); the others act on any order.
ORDERED = frozenset({"typ_p", "top_p", "min_p", "xtc", "temperature", "infill"})
# The stages that read no history, and the SamplerPipeline method that runs each
STAGE_METHODS = {
    "top_n_sigma": "_top_n_sigma",
    "top_k": "_top_k",
    "typ_p": "_typical",
    "top_p": "_top_p",
    "min_p": "_min_p",
    "xtc": "_xtc",
    "temperature": "_temperature",
    "infill": "_infill",
}


def _tail(window: Sequence[int], last_n: int) -> Sequence[int]:
    """The last `last_n` tokens of a window (-1: all of it)."""
    return window if last_n < 0 else window[max(0, len(window) - last_n) :] if last_n else []


class Candidates:
    """One pass of the chain over rows `[R, C]`: the candidates' logits and which survive.

    A filter narrows `keep` and leaves `values` alone, so every stage's probabilities come from
    one softmax of the same values, renormalised over the survivors where a stage needs them.
    """

    def __init__(self, values: mx.array) -> None:
        self.values = values  # [R, C] logits
        self.ids: mx.array | None = None  # [R, C] token ids; None: column c is token c
        self.keep: mx.array | None = None  # [R, C] survivors; None: every candidate
        self.ordered = False  # values descend along each row
        self._probs: mx.array | None = None
        self.basis: mx.array | None = None  # the survivors' probabilities as last measured

    def set_values(self, values: mx.array, *, keeps_order: bool = False) -> None:
        self.values, self._probs, self.basis = values, None, None
        self.ordered = self.ordered and keeps_order

    def narrow(self, keep: mx.array) -> None:
        self.keep = keep if self.keep is None else self.keep & keep

    def masked(self) -> mx.array:
        """The values with the dropped candidates at -inf."""
        return self.values if self.keep is None else mx.where(self.keep, self.values, -mx.inf)

    def probs(self) -> mx.array:
        """softmax of the values over every candidate, dropped ones included."""
        if self._probs is None:
            self._probs = mx.softmax(self.values, axis=-1)
        return self._probs

    def survivors(self) -> mx.array:
        """The survivors' probabilities renormalised (zero elsewhere)."""
        probs = self.probs()
        if self.keep is not None:
            kept = mx.where(self.keep, probs, 0.0)
            probs = kept / mx.sum(kept, axis=-1, keepdims=True)
        self.basis = probs
        return probs

    def replace(self, ids: mx.array, values: mx.array) -> None:
        """New candidates `[R, C]` (their logits `values`; -inf: dropped), every one kept."""
        self.ids, self.values, self.keep = ids, values, None
        self._probs, self.basis = None, None

    def take(self, columns: mx.array) -> None:
        """Keep only `columns` `[R, C']` of each row, in that order."""
        self.ids = columns if self.ids is None else mx.take_along_axis(self.ids, columns, axis=-1)
        self.values = mx.take_along_axis(self.values, columns, axis=-1)
        self.keep = None if self.keep is None else mx.take_along_axis(self.keep, columns, axis=-1)
        self._probs, self.basis = None, None

    def order(self) -> None:
        if not self.ordered:
            self.take(mx.argsort(-self.values, axis=-1))
            self.ordered = True

    def on_vocabulary(self, vocab: int, change: Callable[[mx.array], mx.array]) -> None:
        """Apply `change` to the rows laid out over the whole vocabulary `[R, V]`."""
        if self.ids is None:
            self.set_values(change(self.values))
            return
        full = mx.full((self.values.shape[0], vocab), -mx.inf, dtype=self.values.dtype)
        full = mx.put_along_axis(full, self.ids, self.values, axis=-1)
        self.set_values(mx.take_along_axis(change(full), self.ids, axis=-1))


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
        return self.params.uses_coin

    @property
    def needs_context(self) -> bool:
        """Whether rows need their history windows (otherwise pass `contexts=None`)."""
        return self.params.context_length != 0

    @cached_property
    def kind(self) -> Hashable | None:
        """What the rows of a tick whose samplers share one pass of the chain agree on
        (app/sampling/draws.py): every setting and the vocabulary. None for a row served alone: a
        sampler with state of its own (mirostat's mu, the history's penalties and DRY, infill's
        tables), or any sampler where the device's draws are not stacked (`stacked_draws`: Metal),
        decided once per row, not on every draw it asks for."""
        p = self.params
        if self.mirostat is not None or self.needs_context or p.infill is not None or not stacked_draws():
            return None
        # every field, not the ones the stages read today: a new stage's setting is in it already
        fields = (getattr(p, name) for name in p.__struct_fields__)
        return (self.vocab_size, *(tuple(sorted(f.items())) if isinstance(f, dict) else f for f in fields))

    def observe(self, rows: Distribution | None, tokens: Sequence[int]) -> None:
        """The row decided `tokens`, in order, from `rows` (None: greedily, or forced by a grammar)."""
        if self.mirostat is not None:
            self.mirostat.observe(rows, tokens)

    def _biased(self, logits: mx.array) -> mx.array:
        logits = logits.astype(mx.float32)
        return logits if self._bias is None else logits + self._bias

    def adjust(self, logits: mx.array, contexts: Sequence[Sequence[int]] | None = None) -> mx.array:
        """Token bias, then the chain's penalties and DRY, in its order. `contexts[r]` is row r's
        history window."""
        rows = Candidates(self._biased(logits))
        for stage in self.params.samplers:
            if stage in ("penalties", "dry"):
                self._history_stage(stage, rows, contexts)
        return rows.values

    def _history_stage(self, stage: str, rows: Candidates, contexts: Sequence[Sequence[int]] | None) -> None:
        p = self.params
        if contexts is None or not (p.has_penalties if stage == "penalties" else p.has_dry):
            return
        if stage == "penalties":
            windows = [_tail(ctx, p.repeat_last_n) for ctx in contexts]
            change = self._penalise
        else:
            windows = [_tail(ctx, p.dry_penalty_last_n) for ctx in contexts]
            change = self._dry
        rows.on_vocabulary(
            self.vocab_size, lambda full: mx.stack([change(row, w) for row, w in zip(full, windows, strict=True)])
        )

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
        penalties = dry_penalties(list(context), p.dry_multiplier, p.dry_base, p.dry_allowed_length, p.dry_breakers)
        if not penalties:
            return row
        ids = mx.array(list(penalties.keys()))
        return row.at[ids].add(-mx.array(list(penalties.values()), dtype=mx.float32))

    def greedy(self, logits: mx.array, contexts: Sequence[Sequence[int]] | None = None) -> mx.array:
        """Argmax of the adjusted rows `[R]`: the whole sampler when it is greedy (the chain's
        other stages keep the most likely token, but typical and XTC, which a greedy row skips)."""
        return mx.argmax(self.adjust(logits, contexts), axis=-1)

    def distribution(
        self, logits: mx.array, contexts: Sequence[Sequence[int]] | None = None, coins: mx.array | None = None
    ) -> Distribution:
        """The final probability rows `p` (for a non-greedy sampler), on their candidate set;
        `coins` `[R]`: each row's XTC coin (None: no XTC, as for q rows and log-probabilities)."""
        if self.mirostat is not None:
            previous = None if contexts is None else [ctx[-1] if ctx else -1 for ctx in contexts]
            return self.mirostat.rows(self._biased(logits), previous)
        rows = Candidates(self._biased(logits))
        for stage in self.params.samplers:
            if stage in ORDERED:
                rows.order()
            if stage in ("penalties", "dry"):
                self._history_stage(stage, rows, contexts)
            else:
                getattr(self, STAGE_METHODS[stage])(rows, coins)
        rows.order()  # the most likely candidate first: a forced row draws it (streams.PositionKeys)
        assert rows.ids is not None  # ordering took every column
        return Distribution(ids=rows.ids, probs=mx.softmax(rows.masked(), axis=-1), vocab=logits.shape[-1])

    def _top_n_sigma(self, rows: Candidates, coins: mx.array | None) -> None:
        if self.params.top_n_sigma > 0.0:
            rows.set_values(stages.top_n_sigma(rows.masked(), self.params.top_n_sigma), keeps_order=True)

    def _top_k(self, rows: Candidates, coins: mx.array | None) -> None:
        """Only the top_k candidates can survive: keep those (the survivors' best), unsorted."""
        top_k = self.params.top_k
        if 0 < top_k < rows.values.shape[-1]:
            rows.take(mx.argpartition(-rows.masked(), kth=top_k - 1, axis=-1)[:, :top_k])
            rows.ordered = False

    def _typical(self, rows: Candidates, coins: mx.array | None) -> None:
        if self.params.typical_p < 1.0:
            basis = rows.survivors() if rows.keep is not None else rows.probs()
            rows.narrow(stages.typical(basis, self.params.typical_p))

    def _top_p(self, rows: Candidates, coins: mx.array | None) -> None:
        """The shortest prefix of the ordered survivors whose mass reaches top_p."""
        if self.params.top_p < 1.0:
            survivors = rows.survivors()
            rank = mx.arange(survivors.shape[-1])[None, :]
            mass_before = mx.cumsum(survivors, axis=-1) - survivors
            # at least the top survivor, as llama-server's min_keep (top_p 0, or below float32's least)
            rows.narrow(rank < mx.maximum(mx.sum(mass_before < self.params.top_p, axis=-1, keepdims=True), 1))

    def _min_p(self, rows: Candidates, coins: mx.array | None) -> None:
        """A ratio to the top survivor's probability, which renormalising does not change, so it
        reads the survivors as last measured."""
        if self.params.min_p > 0.0:
            basis = rows.basis if rows.basis is not None else rows.survivors()
            top = mx.max(basis if rows.keep is None else mx.where(rows.keep, basis, 0.0), axis=-1, keepdims=True)
            rows.narrow(basis >= self.params.min_p * top)

    def _xtc(self, rows: Candidates, coins: mx.array | None) -> None:
        """Exclude Top Choices: drop every token above the threshold but the least likely of them.

        Measured on the renormalised survivors; one U[0, 1) coin per row decides whether it applies.
        """
        if not self.uses_coin or coins is None:
            return
        probs = rows.probs()
        kept = probs if rows.keep is None else mx.where(rows.keep, probs, 0.0)
        filtered = kept / mx.sum(kept, axis=-1, keepdims=True)
        rank = mx.arange(filtered.shape[-1])[None, :]
        over = filtered >= self.params.xtc_threshold
        if rows.keep is not None:  # among the kept: a threshold of 0 is no reason to revive one
            over = over & rows.keep
        above = mx.sum(over, axis=-1, keepdims=True)
        least_likely = mx.max(mx.where(over, rank, -1), axis=-1, keepdims=True)  # of those above
        applies = (coins[:, None] <= self.params.xtc_probability) & (above >= 2)
        rows.narrow(~applies | (rank >= least_likely))

    def _temperature(self, rows: Candidates, coins: mx.array | None) -> None:
        p = self.params
        if p.dynatemp_range > 0.0:
            keep = rows.keep if rows.keep is not None else mx.ones(rows.values.shape, dtype=mx.bool_)
            t = stages.dynamic_temperature(rows.probs(), keep, p.temperature, p.dynatemp_range, p.dynatemp_exponent)
            rows.set_values(rows.values / mx.maximum(t, 1e-6), keeps_order=True)
        else:
            rows.set_values(rows.values / max(p.temperature, 1e-6), keeps_order=True)

    def _infill(self, rows: Candidates, coins: mx.array | None) -> None:
        """llama-server's infill stage (app/sampling/infill.py), on the host over the ordered
        survivors; its probabilities become the candidates' logits (log p, -inf for the dropped)."""
        assert self.params.infill is not None, "the infill stage needs its tables (app/sampling/infill.py with_infill)"
        assert rows.ids is not None  # ordered before this stage
        survivors = rows.survivors()
        ids, probs = infill_rows(np.array(rows.ids), np.array(survivors), self.params.infill)
        with np.errstate(divide="ignore"):
            logits = np.log(probs).astype(np.float32)
        rows.replace(mx.array(ids), mx.array(logits))
        rows.ordered = False
