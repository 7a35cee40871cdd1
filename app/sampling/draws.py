"""A row's sampler work as a request its step yields (`Sample`), so that a tick's rows of like
samplers share one pass of the chain over their stacked rows.

A row's distribution on its own is a dozen or more operations over the vocabulary (the bias, top-k's
partition, the ordering, softmax, top-p's cumulative sum, min-p, the temperature, the draw); on a
GPU each is a launch, so sixteen rows each building their own cost several times one greedy
argmax each. Rows whose samplers agree on every setting (`SamplerPipeline.kind`) are served with
one `distribution` over their rows stacked `[R, V]` and one draw, each row with its own keys
(`Distribution.draw_each`). Every operation of the chain works along each row alone, so a row's
probabilities and token are its lone pass's bit for bit (tests/sampling/test_draws.py); a sampler
with state of its own (mirostat, the history's penalties and DRY, infill) is served alone, as is
any row without batch-mates (`run_alone`), through the same `serve`.

On CUDA (`compiled_sampling`), a stateless sampler's chain and draw run as one compiled graph:
`mx.compile` fuses the chain's elementwise operations, so a GPU's host encodes fewer launches per
tick, whatever the rows.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass
from typing import cast

import mlx.core as mx

from app.execution.device import backend
from app.execution.steps import Draw, Steps
from app.runtime.env import switch
from app.sampling.distribution import Distribution, stacked_keys
from app.sampling.pipeline import SamplerPipeline
from app.sampling.rng import RowRng
from app.sampling.streams import position_keys


@dataclass(frozen=True, eq=False)
class Sample(Draw):
    """One row's rows of a distribution, and their draws: `logits` `[R, V]` through `sampler`
    (with the rows' history windows `contexts` and XTC `coins`, as `SamplerPipeline.distribution`
    takes them); `keys`: each row's draw key (None at a forced row, which takes its top candidate),
    or, for one row, `stream`: the row draws its stream's next key, split when the tick serves it
    with every other such row's in one operation (`RowRng.next_keys`); neither: draw nothing. Served as
    (the tokens `[R]`, None without keys; p)."""

    logits: mx.array
    sampler: SamplerPipeline
    contexts: Sequence[Sequence[int]] | None = None
    coins: mx.array | None = None
    keys: tuple[mx.array | None, ...] | None = None
    stream: RowRng | None = None

    @property
    def draws(self) -> bool:
        return self.keys is not None or self.stream is not None

    @property
    def kind(self) -> Hashable:
        shared = self.sampler.kind
        if shared is None:  # state of its own (or Metal): served alone
            return id(self)
        return (shared, self.logits.dtype, self.logits.shape[-1], self.coins is None, self.draws)

    @staticmethod
    def serve(draws: Sequence[Draw]) -> list[object]:
        samples = cast("list[Sample]", list(draws))  # one kind: all Samples
        first = samples[0]
        keys = _keys(samples) if first.draws else None
        if len(samples) == 1:
            return [first.drawn(first.logits, first.coins, keys)]
        coins = None if first.coins is None else mx.concatenate([s.coins for s in samples if s.coins is not None])
        tokens, p = first.drawn(mx.concatenate([s.logits for s in samples]), coins, keys)
        served, start = [], 0
        for sample in samples:
            end = start + sample.logits.shape[0]
            served.append((None if tokens is None else tokens[start:end], p[start:end]))
            start = end
        return served

    def drawn(
        self, logits: mx.array, coins: mx.array | None, keys: Sequence[mx.array | None] | mx.array | None
    ) -> tuple[mx.array | None, Distribution]:
        """The distribution of `logits` under this row's sampler, and its rows drawn at `keys`."""
        if self.sampler.kind is None or not compiled_sampling():
            p = self.sampler.distribution(logits, self.contexts, coins)
            return (None if keys is None else p.draw_each(keys)), p
        stacked, forced = (None, []) if keys is None else stacked_keys(keys)
        inputs = [logits, *([] if coins is None else [coins]), *([] if stacked is None else [stacked])]
        ids, probs, *drawn = _compiled(self.sampler, coins is not None, stacked is not None)(*inputs)
        p = Distribution(ids, probs, logits.shape[-1])
        return (None if keys is None else p.forced_to_top(drawn[0] if drawn else None, forced)), p


def _keys(samples: list[Sample]) -> Sequence[mx.array | None] | mx.array:
    """The draw keys of the samples' rows in order: their own, and their streams' next, these split
    together; stacked `[R, 2]` when every row draws from its stream (a tick of plain sampled rows)."""
    streams = [sample.stream for sample in samples if sample.stream is not None]
    fresh = RowRng.next_keys(streams) if streams else None
    if len(streams) == len(samples):
        return fresh
    taken = iter(range(len(streams)))
    return [key for s in samples for key in (s.keys if s.stream is None else (fresh[next(taken)],))]


COMPILED_SAMPLING = "MLXCEL_COMPILED_SAMPLING"  # set: compiled chains on or off, any device (`compiled_sampling`)
COMPILED_KINDS = 64  # the compiled chains kept, the most recently used: kinds come from requests


def compiled_sampling() -> bool:
    """Whether a stateless sampler's chain and draw run compiled (`mx.compile`). On by default on
    CUDA, where each of the chain's few dozen operations is a launch the host encodes every tick:
    on an H100 (2026-12-07) a tick of 16 sampled rows' chain took 0.49 ms compiled against 0.89,
    and the compiled chain held the uncompiled chain's bits there (tests/sampling/test_draws.py
    `test_a_compiled_chain_draws_the_uncompiled_bits`, the seeded identity, the batched steps and
    the sampler guards). Off on the CPU, where MLX's compiled kernels measured slower than its own
    (docs/benchmarks.md), and on Metal, where no run has held its bits. MLXCEL_COMPILED_SAMPLING,
    when set, overrides the device's default: on (1, true, yes, on) or off (anything else)."""
    on = switch(COMPILED_SAMPLING)
    return backend().name == "cuda" if on is None else on


_COMPILED: OrderedDict[Hashable, Callable[..., list[mx.array]]] = OrderedDict()


def _compiled(sampler: SamplerPipeline, coins: bool, draws: bool) -> Callable[..., list[mx.array]]:
    """The compiled chain of samplers of `sampler`'s kind (every sampler of a kind computes the
    same graph), taking (logits, coins if `coins`, stacked keys if `draws`) and returning the
    distribution's ids and probabilities and, with keys, each row's draw."""
    key = (sampler.kind, coins, draws)
    if key in _COMPILED:
        _COMPILED.move_to_end(key)
        return _COMPILED[key]

    def chain(logits: mx.array, *rest: mx.array) -> list[mx.array]:
        p = sampler.distribution(logits, None, rest[0] if coins else None)
        return [p.ids, p.probs, *([p.draw_each(rest[-1])] if draws else [])]

    _COMPILED[key] = compiled = mx.compile(chain)
    if len(_COMPILED) > COMPILED_KINDS:
        _COMPILED.popitem(last=False)
    return compiled


def sampling(
    sampler: SamplerPipeline,
    logits: mx.array,
    contexts: Sequence[Sequence[int]] | None,
    rng: RowRng,
    forced: bool = False,
) -> Steps[tuple[mx.array, Distribution | None]]:
    """Decide one token from one row of logits `[1, V]`, its draw asked for as a `Sample`; returns
    (the token `[1]`, lazy: the caller reads it with its batch-mates' in one wait; p or None if
    greedy). Its keys are consumed by then (a plain row's with the tick's others, `Sample.stream`).
    `forced`: the grammar allows one token here, which is decided drawing nothing
    (app/sampling/streams.py)."""
    if sampler.is_greedy:
        return sampler.greedy(logits, contexts)[:1], None
    if not forced and not sampler.uses_coin:  # one key: the stream's next, split with the tick's others
        return (yield Sample(logits, sampler, contexts, stream=rng))
    keys = position_keys(rng, [not forced], sampler.uses_coin)
    token, p = yield Sample(logits, sampler, contexts, keys.coins, tuple(keys.draws))
    keys.consume(1)
    return token, p
