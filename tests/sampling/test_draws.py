"""A tick's rows of like samplers share one pass of the chain (app/sampling/draws.py), and each row
gets exactly its lone pass's bits: tokens, candidates and probabilities."""

from __future__ import annotations

import mlx.core as mx
import numpy as np
import pytest

import app.sampling.distribution as distribution
import app.sampling.draws as draws
from app.execution.device import Backend
from app.execution.steps import Steps, run_alone, run_together
from app.sampling import RowRng, SamplerPipeline, SamplingParams
from app.sampling.draws import Sample, sampling
from app.sampling.streams import position_keys

VOCAB = 2048
# every stage of the chain that reads no history, and some of them together, in more than one order
SETTINGS = [
    {"temperature": 0.7},  # llama-server's defaults: top-k 40, top-p 0.95, min-p 0.05
    {"temperature": 0.7, "top_k": 0, "top_p": 0.9, "min_p": 0.0},
    {"temperature": 1.3, "top_k": 0, "top_p": 1.0, "min_p": 0.1},
    {"temperature": 0.9, "typical_p": 0.8},
    {"temperature": 0.8, "xtc_probability": 0.6, "xtc_threshold": 0.05},
    {"temperature": 1.0, "top_k": 0, "top_n_sigma": 1.5},
    {"temperature": 0.8, "dynatemp_range": 0.5, "dynatemp_exponent": 1.5},
    {"temperature": 0.6, "top_k": 0, "top_p": 1.0, "min_p": 0.0},  # the temperature alone
    {"temperature": 0.7, "samplers": ("temperature", "min_p", "top_p", "top_k"), "logit_bias": {5: 4.0, 9: -2.0}},
]


def logits(seed: int, n: int) -> mx.array:
    """Rows as a model's output: bfloat16, so many logits tie."""
    return mx.array(np.random.default_rng(seed).normal(0.0, 4.0, size=(n, VOCAB)).astype(np.float32)).astype(
        mx.bfloat16
    )


def sample(settings: dict, seed: int, positions: int, forced: int | None = None) -> Sample:
    """A row's `positions` rows (a verify round's when more than one) with its keys, in
    target-only's layout; `forced`: a position the grammar forces, which draws nothing."""
    sampler = SamplerPipeline(SamplingParams(**settings), VOCAB)
    keys = position_keys(RowRng(seed), [i != forced for i in range(positions)], sampler.uses_coin)
    return Sample(logits(seed, positions), sampler, None, keys.coins, tuple(keys.draws))


def served(request: Sample) -> Steps[tuple[mx.array, object]]:
    return (yield request)


def bits(array: mx.array) -> bytes:
    return np.array(array).tobytes()


def test_rows_of_a_tick_draw_their_lone_bits_with_one_pass_per_kind(monkeypatch) -> None:
    """Sixteen-odd rows of every stage mixed in one tick, one to four positions each (a forced one
    among them): each row's tokens, candidates and probabilities are its lone pass's bit for bit,
    and the chain runs once per kind of sampler, not once per row (stacked on Metal too: this is
    the run that would check them there)."""
    monkeypatch.setenv(distribution.STACKED_DRAWS, "1")
    requests = [
        sample(settings, seed=10 * kind + copy, positions=1 + (copy % 3) * (kind % 2), forced=2 if copy == 2 else None)
        for kind, settings in enumerate(SETTINGS)
        for copy in range(3)
    ]
    alone = [run_alone(served(request)) for request in requests]
    passes = []
    real = SamplerPipeline.distribution
    monkeypatch.setattr(SamplerPipeline, "distribution", lambda *a, **k: passes.append(1) or real(*a, **k))
    together = run_together([served(request) for request in requests]).outcomes
    assert len(passes) == len(SETTINGS)
    mx.eval([array for (tokens, p) in (*alone, *together) for array in (tokens, p.ids, p.probs)])
    for (lone_tokens, lone_p), (tokens, p) in zip(alone, together, strict=True):
        assert bits(tokens) == bits(lone_tokens)
        assert (bits(p.ids), bits(p.probs)) == (bits(lone_p.ids), bits(lone_p.probs))


@pytest.mark.parametrize("mates", ["alone in their kind", "beside rows with keys of their own"])
def test_plain_rows_split_their_streams_together_and_draw_their_lone_tokens(mates: str) -> None:
    """Plain sampled rows (`sampling`: one key, the stream's next) split their streams' keys in one
    operation a tick (`RowRng.next_keys`), alone in their kind or beside a verify round's rows that bring
    keys of their own: over three ticks (the second splits the stack the first left, the third
    without the last row, which draws alone meanwhile) each row draws its lone tokens, and its
    stream ends where drawing alone leaves it."""
    sampler = SamplerPipeline(SamplingParams(**SETTINGS[0]), VOCAB)
    ticks, rows = 3, 6

    def plain(seed: int, rng: RowRng, tick: int) -> Steps[tuple[mx.array, object]]:
        return sampling(sampler, logits(10 * seed + tick, 1), None, rng)

    lone_streams, streams = [RowRng(seed) for seed in range(rows)], [RowRng(seed) for seed in range(rows)]
    lone = [[run_alone(plain(seed, rng, tick))[0] for tick in range(ticks)] for seed, rng in enumerate(lone_streams)]
    together: list[list[mx.array]] = [[] for _ in range(rows)]
    for tick in range(ticks):
        others = [served(sample(SETTINGS[0], seed=99 + tick, positions=3))] if mates != "alone in their kind" else []
        ticking = range(rows - 1) if tick == ticks - 1 else range(rows)
        outcomes = run_together([*others, *(plain(seed, streams[seed], tick) for seed in ticking)]).outcomes
        for seed, (tokens, _) in zip(ticking, outcomes[len(others) :], strict=True):
            together[seed].append(tokens)
        if tick == ticks - 1:
            together[rows - 1].append(run_alone(plain(rows - 1, streams[rows - 1], tick))[0])
    for seed in range(rows):
        assert [bits(token) for token in together[seed]] == [bits(token) for token in lone[seed]]
        assert bits(streams[seed].next_key()) == bits(lone_streams[seed].next_key())


@pytest.mark.parametrize("settings", SETTINGS, ids=range(len(SETTINGS)))
def test_a_compiled_chain_draws_the_uncompiled_bits(monkeypatch, settings: dict) -> None:
    """`compiled_sampling` (CUDA's default) changes no bit: a tick's rows of one kind, with a
    forced row among them and without keys, give the tokens, candidates and probabilities of the
    uncompiled chain (run on the device to hold its kernels)."""
    requests = [
        sample(settings, seed=seed, positions=1 + seed % 3, forced=1 if seed == 2 else None) for seed in range(5)
    ]
    requests.append(Sample(logits(7, 2), requests[0].sampler))  # probabilities only: no keys
    served_as = {}
    for compiled in ("0", "1"):
        monkeypatch.setenv(draws.COMPILED_SAMPLING, compiled)
        outcomes = run_together([served(request) for request in requests]).outcomes
        served_as[compiled] = [
            (None if tokens is None else bits(tokens), bits(p.ids), bits(p.probs)) for tokens, p in outcomes
        ]
    assert served_as["1"] == served_as["0"]


@pytest.mark.parametrize("state", [{"mirostat": 2}, {"repeat_penalty": 1.3}, {"dry_multiplier": 0.8}])
def test_a_sampler_with_state_of_its_own_is_served_alone(state: dict) -> None:
    sampler = SamplerPipeline(SamplingParams(temperature=0.7, **state), VOCAB)
    assert sampler.kind is None
    mates = [Sample(logits(seed, 1), sampler, [[1, 2, 3]]) for seed in range(2)]
    assert mates[0].kind != mates[1].kind


def test_a_row_draws_its_own_key_in_a_stack_as_alone() -> None:
    """`draw_each` gives row r the draw of `p[r].draw(keys[r])`; a forced row its top candidate."""
    p = SamplerPipeline(SamplingParams(temperature=1.0), VOCAB).distribution(logits(3, 5))
    keys = [RowRng(seed).next_key() for seed in range(5)]
    keys[3] = None
    lone = [p[r].draw(key) if key is not None else p[r].ids[:, 0] for r, key in enumerate(keys)]
    assert np.array(p.draw_each(keys)).tolist() == np.array(mx.concatenate(lone)).tolist()


@pytest.mark.parametrize(
    ("device", "switch", "stacked"),
    [("metal", None, False), ("metal", "1", True), ("cuda", None, True), ("cuda", "0", False), ("cpu", "off", False)],
)
def test_metal_draws_each_row_alone_unless_stacked_draws_are_switched_on(
    monkeypatch, device: str, switch: str | None, stacked: bool
) -> None:
    """On Metal the stacked pass has not been held to each row's lone bits on the device, so there
    every row's draw is served alone and `draw_each` draws row by row; on the CPU and CUDA (held
    there) rows of like samplers share a pass. MLXCEL_STACKED_DRAWS overrides either way; the
    tokens are the same either way (here, on the CPU's kernels)."""
    monkeypatch.setattr(distribution, "backend", lambda: Backend(device, 1024))
    if switch is None:
        monkeypatch.delenv(distribution.STACKED_DRAWS, raising=False)
    else:
        monkeypatch.setenv(distribution.STACKED_DRAWS, switch)
    mates = [sample(SETTINGS[0], seed=seed, positions=1) for seed in range(3)]
    assert (len({m.kind for m in mates}) == 1) is stacked
    p = SamplerPipeline(SamplingParams(temperature=1.0), VOCAB).distribution(logits(3, 4))
    keys = [RowRng(seed).next_key() for seed in range(4)]
    lone = mx.concatenate([p[r].draw(key) for r, key in enumerate(keys)])
    assert np.array(p.draw_each(keys)).tolist() == np.array(lone).tolist()
