"""Driving several generations the way the engine's tick does: every live row's prefill chunk or
decode step in one `run_together`, their forwards batched."""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, replace

from app.decoding.builder import LoopBuilder, RowRequest
from app.decoding.generation import Generation
from app.decoding.width import OWN_WIDTH, WidthOffer
from app.execution.steps import run_together
from app.sampling import SamplingParams

STREAM_ROWS = 24  # rows of a distribution guard's stream: about half the CPU of running them one by one


@dataclass
class Arrival:
    generation: Generation
    joins: int = 0  # the tick it joins the batch at
    leaves: int | None = None  # the tick it is dropped at, finished or not (a cancelled request)


# sees each tick's decoding rows before they step; the engine's choice: an offer per row, in their order (None: none)
Tick = Callable[[list[Generation]], Sequence[WidthOffer] | None]


def run_batched(arrivals: Sequence[Arrival], before_tick: Tick = lambda _: None) -> int:
    """Run every arrival until it finishes or leaves; the most rows that decoded in one tick."""
    waiting, live, widest, tick = list(arrivals), [], 0, 0
    while waiting or live:
        live += [a for a in waiting if a.joins <= tick]
        waiting = [a for a in waiting if a.joins > tick]
        live = [a for a in live if not a.generation.finished and (a.leaves is None or tick < a.leaves)]
        decoding = [a.generation for a in live if a.generation.prefilled]
        offers = {id(g): offer for g, offer in zip(decoding, before_tick(decoding) or (), strict=False)}
        steps = [a.generation.ticking(offers.get(id(a.generation), OWN_WIDTH)) for a in live]
        for outcome in run_together(steps).outcomes:
            if isinstance(outcome, Exception):
                raise outcome
        widest = max(widest, len(decoding))
        tick += 1
    return widest


def run_rows(generations: Sequence[Generation], before_tick: Tick = lambda _: None) -> list[Generation]:
    """Run rows to their ends stepping together from the first tick. Each row emits exactly what it
    would alone (its output never depends on its batch-mates), at a fraction of the cost: one
    forward per model and tick serves every row."""
    run_batched([Arrival(generation) for generation in generations], before_tick)
    return list(generations)


def seeded_stream(
    builder: LoopBuilder,
    request: RowRequest,
    n: int,
    adjust: Callable[[Generation], object] = lambda _: None,
    before_tick: Tick = lambda _: None,
) -> list[int]:
    """n tokens from STREAM_ROWS rows of `request` seeded 0, 1, ..., stepping together (`adjust`
    sees each row before it runs). For models whose distribution is the same at every position
    (tests/support/derived_models.py): every token is one draw, so how the stream is cut into rows
    does not matter to a goodness-of-fit statistic."""
    per_row = -(-n // STREAM_ROWS)
    rows = [builder.build(replace(request, max_tokens=per_row, seed=seed)) for seed in range(STREAM_ROWS)]
    for generation in rows:
        adjust(generation)
    stream = [token for generation in run_rows(rows, before_tick) for token in generation.emitted]
    assert len(stream) >= n, "a row ended early"
    return stream[:n]


def seeded_rows(
    builder: LoopBuilder, prompts: Sequence[str], sampling: SamplingParams, rows: int, max_tokens: int = 256
) -> Iterator[Generation]:
    """Finished seeded rows of at most `max_tokens` over `prompts` (seed i on prompt i mod their
    count), seed 0, 1, ... in order, run `rows` rows at a time (each row emits, and counts, what it
    would alone, at a fraction of the cost: on the CPU a tick of 24 rows costs 1.4 times one of 12,
    so more, shorter rows buy the same positions for less)."""
    for first in itertools.count(0, rows):
        batch = []
        for seed in range(first, first + rows):
            prompt = builder.target.tokenizer.encode(prompts[seed % len(prompts)])
            request = RowRequest(prompt=prompt, sampling=sampling, max_tokens=max_tokens, seed=seed)
            batch.append(builder.build(request))
        yield from run_rows(batch)
