"""Stop strings on the real generation: matched on the text, across token (and round) boundaries.

Text that could still become a stop string is held back from the stream and released as soon as
it cannot; what was streamed is never cut afterwards. Each case runs on the three classic loops:
one token per step (target only) and several decided tokens per step (draft model, prompt lookup).
The embedded target's T = 0 continuation of CODE repeats `def merge_sort(left, right):` twice,
so a stop string can start in the middle of one token and end several tokens later.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

import pytest

from app.decoding.builder import LoopBuilder, RowRequest
from app.decoding.generation import Generation, StopType, _overlap
from app.decoding.plan import LoopPlan
from app.sampling import SamplingParams

CODE = "def merge_sorted(left, right):\n    result = []\n"
GREEDY = SamplingParams(temperature=0.0)
LOOPS = ["none", "draft-model", "prompt-lookup"]


@dataclass
class Run:
    generation: Generation
    deltas: list[str]  # the text each step released, prefill first
    held: list[str]  # the text decided but not released after each step


@pytest.fixture(params=LOOPS)
def builder(request, embedded_target, embedded_drafter) -> LoopBuilder:
    drafter = embedded_drafter if request.param == "draft-model" else None
    return LoopBuilder(embedded_target, drafter, LoopPlan(drafter_kind=request.param))


def decode(builder: LoopBuilder, stop: list[str], n: int = 40) -> Run:
    prompt = builder.target.tokenizer.encode(CODE)
    request = RowRequest(prompt, GREEDY, max_tokens=n, ignore_eos=True, stop=tuple(stop))
    generation = builder.build(request)
    run = Run(generation, [], [])
    delta = generation.prefill()
    while True:
        run.deltas.append(delta.text)
        run.held.append(generation.text[len("".join(run.deltas)) :])
        if generation.finished:
            return run
        delta = generation.step()


def longest_stop_start(text: str, stops: list[str]) -> str:
    """The longest suffix of `text` that is a proper prefix of a stop string (what must be held)."""
    return max((text[-n:] for s in stops for n in range(1, len(s)) if text.endswith(s[:n])), key=len, default="")


def assert_streams_safely(run: Run, stops: list[str]) -> None:
    """Every step released exactly what can no longer become a stop string, and nothing is cut later."""
    final, last = run.generation.text, len(run.deltas) - 1
    streamed = ""
    for step, (delta, held) in enumerate(zip(run.deltas, run.held, strict=True)):
        streamed += delta
        assert final.startswith(streamed), (streamed, final)
        assert held == ("" if step == last else longest_stop_start(streamed + held, stops)), (step, held)
    assert streamed == final


def test_a_stop_string_across_tokens_is_never_streamed_in_part(builder: LoopBuilder) -> None:
    free = decode(builder, []).generation.text
    stop = "rge_sort(left, ri"  # from inside "er" (the 4th token) to inside " right" (the 11th)
    at = free.find(stop)
    run = decode(builder, [stop])
    assert run.generation.stop_type is StopType.WORD and run.generation.stopping_word == stop
    assert run.generation.text == free[:at]
    assert any(held for held in run.held), "some step must have held text back"
    assert_streams_safely(run, [stop])


def test_held_back_text_is_released_when_the_match_fails(builder: LoopBuilder) -> None:
    free = decode(builder, []).generation.text
    stop = "merge_sort(right"  # matches "merge_sort(" over five tokens, then "left" breaks it
    run = decode(builder, [stop])
    assert run.generation.stop_type is StopType.LIMIT and run.generation.text == free
    assert any(held.startswith("merge_sort") for held in run.held), "held over five tokens"
    first = free.find("merge_sort(")
    released_at = next(i for i, d in enumerate(run.deltas) if len("".join(run.deltas[: i + 1])) > first)
    assert released_at < len(run.deltas) - 1, "released mid-stream, not only when the generation ended"
    assert_streams_safely(run, [stop])


def test_held_back_text_is_released_when_the_generation_ends(builder: LoopBuilder) -> None:
    free = decode(builder, [], n=20).generation.text
    tail = free[-3:]
    run = decode(builder, [tail + "\x00never"], n=20)
    assert run.generation.stop_type is StopType.LIMIT and run.generation.text == free
    assert run.deltas[-1].endswith(tail)
    assert_streams_safely(run, [tail + "\x00never"])


def test_the_first_occurrence_wins(builder: LoopBuilder) -> None:
    free = decode(builder, []).generation.text
    early, late = free[20:23], free[30:34]
    assert free.find(early) < free.find(late)
    run = decode(builder, [late, early])
    assert run.generation.stopping_word == early and run.generation.text == free[: free.find(early)]
    assert_streams_safely(run, [late, early])


def test_the_hold_back_is_the_longest_suffix_that_starts_a_stop_string() -> None:
    rng = random.Random(0)
    for _ in range(3000):
        text = "".join(rng.choice("ab") for _ in range(rng.randint(0, 12)))
        stop = "".join(rng.choice("ab") for _ in range(rng.randint(1, 6)))
        assert _overlap(text, stop) == len(longest_stop_start(text, [stop])), (text, stop)
