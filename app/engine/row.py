"""One request while the engine serves it: its generation, its timestamps, its output channel."""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass, field

import msgspec

from app.decoding.builder import RowRequest
from app.decoding.generation import Generation
from app.decoding.row_events import Delta, Finished, Progress, Sink
from app.decoding.timings import Timings, make_timings
from app.decoding.width import OWN_WIDTH, WidthOffer
from app.execution.steps import Steps


@dataclass
class Job:
    """A request handed to the engine: what to run and where its events go."""

    request: RowRequest
    request_id: str
    route: str
    sink: Sink
    group: str = ""  # the HTTP request whose rows these are (its id; "": this row is its request's only one)
    stream: bool = False
    per_token_timings: bool = False
    progress: bool = False  # a stream that gets Progress events while its prompt prefills
    diagnostics: bool = False  # its Finished timings carry `speculative` (SpeculativeDiagnostics)
    created: float = field(default_factory=time.perf_counter)
    admitted: float = 0.0  # when the engine began building its row (queue wait = admitted - created)
    cancelled: bool = False


class Row:
    """A job with its generation, advanced one step per engine tick."""

    def __init__(self, job: Job, generation: Generation, slot: int) -> None:
        self.job = job
        self.generation = generation
        self.slot = slot
        self._reported = -1  # the prompt tokens the last Progress counted (-1: none sent yet)
        self.mask_cost = 0.0  # CPU seconds its grammar's masks took in its last tick (the scheduler weighs it)

    def steps(self, offer: WidthOffer = OWN_WIDTH) -> Steps[Delta]:
        """One tick's prefill chunk or decode step as the forwards it asks for (the engine
        batches many rows'), its round's width within `offer` (the tick's choice)."""
        return self._timed((yield from self.generation.ticking(offer)))

    def _timed(self, delta: Delta) -> Delta:
        if not self.job.per_token_timings:
            return delta
        return dataclasses.replace(delta, timings=self.timings().partial())

    def progress(self) -> Progress | None:
        """The prefill's progress if it moved since the last one reported (None: it did not)."""
        generation = self.generation
        processed = generation.prompt_processed
        if processed <= self._reported:
            return None
        self._reported = processed
        started = generation.prefill_started
        elapsed = time.perf_counter() - started if started else 0.0
        return Progress(generation.prompt_n, generation.cache_n, processed, int(elapsed * 1000))

    def timings(self) -> Timings:
        generation = self.generation
        first = generation.prefill_finished or time.perf_counter()
        last = generation.last_token_at or first
        return make_timings(
            cache_n=generation.cache_n,
            prompt_n=generation.prompt_n - generation.cache_n,
            # a drafter's first load, paid by this request, is kept out of its timings
            prompt_ms=max(0.0, (first - self.job.created - generation.excluded_s) * 1000.0),
            predicted_n=len(generation.emitted),
            predicted_ms=(last - first) * 1000.0,
            stats=generation.stats.acceptance,
            draft_kind=generation.speculation.draft_kind,
            exact=generation.exact,
        )

    def finished(self) -> Finished:
        generation = self.generation
        speculation = generation.speculation
        greedy = generation.state.sampler.is_greedy
        timings = self.timings()
        if self.job.diagnostics:
            timings = msgspec.structs.replace(timings, speculative=generation.stats.diagnostics(speculation, greedy))
        return Finished(
            text=generation.text,
            tokens=list(generation.emitted),
            stop_type=str(generation.stop_type),
            stopping_word=generation.stopping_word,
            prompt_n=generation.prompt_n,
            timings=timings,
            rule=speculation.rule_name,
            draft_kind=speculation.draft_kind,
            n_max=generation.n_max,
            logprobs=generation.logprobs,
            biased=speculation.biased(greedy),
        )
