"""Behaviour guard: every shipped profile's outputs, hashed, must not change under refactors.

The hashes were recorded from the code before issue 11's plan refactor; issue 17 moved the seeded
T = 0.7 hashes of the block profiles (dflash, mtp, muse) to their T = 0 ones: under
argmax-against-argmax their whole stream is now the target's greedy stream, where the first token
used to be sampled. Issue 27 moved the seeded T = 0.7 hashes of the drafting profiles once: a
drafter now draws from a stream of its own, no longer from the target's, so `default`
(sampler-match over the draft model) records target-only's hash, and `stochastic` a new one (its
drafter's draws moved; the rule itself still draws on the target stream). Issue 39 moved every
seeded T = 0.7 hash once more, target-only's included: a draw is now Gumbel-max with its key's
noise indexed by token id over the vocabulary (app/sampling/distribution.py), where it was
`mx.random.categorical` over the candidates in rank order, so that a coupled draft shares the
target's noise; the T = 0 hashes did not move, and `default`, `prompt-lookup` and `dspark` still
record target-only's hash (`default` now with coupled drafts). Each profile's loop is
built the way the server builds it (the engine's load, then the builder, in process, no HTTP)
and run on a fixed prompt set at temperature 0 and at a seeded temperature 0.7. A profile
that declines sampling (dspark: the DSpark drafter is greedy-only) serves T = 0.7 with classic
decode; its hash is recorded too, together with the decline note it must keep logging.
"""

from __future__ import annotations

import hashlib
import json
import os

import pytest

from app.decoding.builder import RowRequest
from app.engine.engine import Engine
from app.profiles import resolve, shipped_profiles
from app.profiles.schema import ENV_OVERRIDES
from app.sampling import SamplingParams

PROMPTS = (
    "def merge_sorted(left, right):\n",
    "The three primary colours are",
    "for i in range(10):\n    print(i)\nfor i in range(10):\n",
)
N_PREDICT = 24
SEED = 1234
HOT = 0.7

# profile -> (sha256 at T = 0, sha256 at seeded T = 0.7, loop notes at T = 0.7)
EXPECTED = {
    "default": (
        "936a873548b228779292d8b898b1dc13b3b98e46df4d4c8350887bcdcf72840c",
        "9b3b32cbc730b45224fd7cf7f34cc9ee9a1dcc091bec775aa59d09aa030be7c5",
        [],
    ),
    "dflash": (
        "936a873548b228779292d8b898b1dc13b3b98e46df4d4c8350887bcdcf72840c",
        "936a873548b228779292d8b898b1dc13b3b98e46df4d4c8350887bcdcf72840c",
        [],
    ),
    "dspark": (
        "936a873548b228779292d8b898b1dc13b3b98e46df4d4c8350887bcdcf72840c",
        "9b3b32cbc730b45224fd7cf7f34cc9ee9a1dcc091bec775aa59d09aa030be7c5",
        ["block_loop_declined", "block_loop_declined", "block_loop_declined"],
    ),
    "mtp": (
        "936a873548b228779292d8b898b1dc13b3b98e46df4d4c8350887bcdcf72840c",
        "936a873548b228779292d8b898b1dc13b3b98e46df4d4c8350887bcdcf72840c",
        [],
    ),
    "muse": (
        "936a873548b228779292d8b898b1dc13b3b98e46df4d4c8350887bcdcf72840c",
        "936a873548b228779292d8b898b1dc13b3b98e46df4d4c8350887bcdcf72840c",
        [],
    ),
    "prompt-lookup": (
        "936a873548b228779292d8b898b1dc13b3b98e46df4d4c8350887bcdcf72840c",
        "9b3b32cbc730b45224fd7cf7f34cc9ee9a1dcc091bec775aa59d09aa030be7c5",
        [],
    ),
    "stochastic": (
        "936a873548b228779292d8b898b1dc13b3b98e46df4d4c8350887bcdcf72840c",
        "0f61e100089ac274cf4e20e32ed708ff12e7865526cdb8447233a1b486efc6d4",
        [],
    ),
    "target-only": (
        "936a873548b228779292d8b898b1dc13b3b98e46df4d4c8350887bcdcf72840c",
        "9b3b32cbc730b45224fd7cf7f34cc9ee9a1dcc091bec775aa59d09aa030be7c5",
        [],
    ),
}


def outputs(engine: Engine, temperature: float) -> tuple[str, list[str]]:
    """sha256 of the emitted token ids of every prompt, and the loop notes the requests logged."""
    emitted, notes = [], []
    tokenizer = engine.host.target.tokenizer
    for prompt in PROMPTS:
        sampling = SamplingParams(temperature=temperature)
        request = RowRequest(list(tokenizer.encode(prompt)), sampling, max_tokens=N_PREDICT, seed=SEED)
        generation = engine.host.builder.build(request)
        generation.prefill()
        while not generation.finished:
            generation.step()
        emitted.append(generation.emitted)
        notes += [note.event for note in generation.notes if note.event == "block_loop_declined"]
    return hashlib.sha256(json.dumps(emitted).encode()).hexdigest(), notes


@pytest.fixture
def clean_contract_env(monkeypatch: pytest.MonkeyPatch):
    for name in ENV_OVERRIDES:
        monkeypatch.delenv(name, raising=False)
    saved = dict(os.environ)
    yield
    os.environ.clear()
    os.environ.update(saved)


def test_every_shipped_profile_is_hashed() -> None:
    assert sorted(EXPECTED) == shipped_profiles()


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_outputs_are_unchanged(name: str, clean_contract_env: None) -> None:
    engine = Engine(resolve(name).settings)
    engine.host.load()
    cold, cold_notes = outputs(engine, 0.0)
    hot, hot_notes = outputs(engine, HOT)
    assert cold_notes == []
    assert (cold, hot, hot_notes) == EXPECTED[name]
