"""One request while the engine serves it: its generation, its timestamps, its output channel."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from app.acceptance import AcceptanceStats
from app.decoding.builder import RowRequest
from app.decoding.generation import Delta, Generation
from app.decoding.timings import Timings, make_timings
from app.drafters.governor import Governor


@dataclass(frozen=True)
class Finished:
    """The whole result of a request."""

    text: str
    tokens: list[int]
    stop_type: str
    stopping_word: str
    prompt_n: int
    timings: Timings  # with the draft block when a drafter ran a verify round
    rule: str | None
    draft_kind: str | None


@dataclass(frozen=True)
class Failed:
    message: str
    code: int = 500
    kind: str = "server_error"


Event = Delta | Finished | Failed
Sink = Callable[[Event], None]


@dataclass
class Job:
    """A request handed to the engine: what to run and where its events go."""

    request: RowRequest
    request_id: str
    route: str
    sink: Sink
    stream: bool = False
    per_token_timings: bool = False
    created: float = field(default_factory=time.perf_counter)
    cancelled: bool = False


@dataclass(frozen=True)
class LoopFacts:
    """What a row's round loop reports about itself (rule, counters, drafter kind, governor).

    The one place the engine reads the loop's optional attributes, so a change to the round
    loop's protocol changes this function only.
    """

    rule: str | None
    lossless: bool
    stats: AcceptanceStats | None
    draft_kind: str | None
    governor: Governor | None


def loop_facts(generation: Generation) -> LoopFacts:
    loop = generation.loop
    drafter = getattr(loop, "drafter", None)
    return LoopFacts(
        rule=str(loop.rule) if loop.rule else None,
        lossless=loop.rule is not None and loop.rule.lossless,
        stats=loop.stats,
        draft_kind=loop.draft_kind,
        governor=getattr(drafter, "governor", None),
    )


class Row:
    """A job with its generation, advanced one step per engine tick."""

    def __init__(self, job: Job, generation: Generation, slot: int) -> None:
        self.job = job
        self.generation = generation
        self.slot = slot

    def advance(self) -> Delta:
        """One tick: the generation's next step, with the timings so far if the request wants them."""
        delta = next(self.generation)
        if not self.job.per_token_timings:
            return delta
        return dataclasses.replace(delta, timings=self.timings().base())

    def timings(self) -> Timings:
        generation = self.generation
        facts = loop_facts(generation)
        first = generation.prefill_finished or time.perf_counter()
        last = generation.last_token_at or first
        return make_timings(
            prompt_n=generation.prompt_n,
            # a drafter's first load, paid by this request, is kept out of its timings
            prompt_ms=max(0.0, (first - self.job.created - generation.excluded_s) * 1000.0),
            predicted_n=len(generation.emitted),
            predicted_ms=(last - first) * 1000.0,
            stats=facts.stats,
            draft_kind=facts.draft_kind,
        )

    def finished(self) -> Finished:
        generation = self.generation
        facts = loop_facts(generation)
        return Finished(
            text=generation.text,
            tokens=list(generation.emitted),
            stop_type=str(generation.stop_type),
            stopping_word=generation.stopping_word,
            prompt_n=generation.prompt_n,
            timings=self.timings(),
            rule=facts.rule,
            draft_kind=facts.draft_kind,
        )
