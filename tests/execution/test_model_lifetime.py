"""A model nobody uses any more is freed, with its KV pool and its compiled ticks: a reloaded
server's old engine, or a test's. A model's prepared record (app/execution/prepare.py) lives in a
module table until the model goes, and keeps the model's tick functions and taps; anything there
that held the model itself would keep it, its pool and its record for good (an engine of a block
drafter's profile kept ~100 MB that way)."""

from __future__ import annotations

import gc
import weakref

import mlx.core as mx
import mlx.nn as nn
import pytest

from app.decoding.builder import RowRequest
from app.engine.engine import Engine
from app.profiles import resolve
from app.sampling import SamplingParams


def models_alive() -> set[int]:
    gc.collect()
    return {id(o) for o in gc.get_objects() if isinstance(o, nn.Module) and hasattr(o, "layers")}


@pytest.mark.parametrize("name", ["default", "mtp"])  # a draft model's ticks; the target's taps
def test_a_dropped_engine_frees_its_models_and_their_memory(name: str) -> None:
    before, active = models_alive(), mx.get_active_memory()
    engine = Engine(resolve(name).settings)
    engine.host.load()
    tokens = list(engine.host.target.tokenizer.encode("def add(a, b):\n"))
    for temperature in (0.0, 0.7):
        request = RowRequest(tokens, SamplingParams(temperature=temperature), max_tokens=8, seed=1)
        generation = engine.host.build(request)
        generation.prefill()
        while not generation.finished:
            generation.step()
    target = weakref.ref(engine.host.target.model)
    assert models_alive() - before  # the engine's models, loaded
    del engine, generation
    assert not models_alive() - before and target() is None
    assert mx.get_active_memory() <= active + (1 << 20)
