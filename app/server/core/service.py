"""Between HTTP handlers and the engine thread: building a job, submitting it, awaiting its events."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import msgspec
from litestar import Request
from litestar.types import Receive

from app.decoding.builder import RowRequest
from app.sampling import SamplingParams
from app.sampling.grammar import Grammar
from app.server import access, offload
from app.server.auth import tenant_of
from app.server.core import field_policy, requests, shaping
from app.server.core.grammars import Grammars
from app.server.core.prompts import check_rows
from app.server.core.schemas import SamplingFields
from app.server.engine_view import Delta, EngineView, Event, Failed, Finished, Job, Progress, Started, Timings
from app.server.errors import ApiError

DISCONNECTED = Failed("the client disconnected", 499, "cancelled")  # nginx's "client closed request"


@dataclass
class Submission:
    """A job in flight and the queue its events arrive on."""

    job: Job
    events: asyncio.Queue[Event]
    receive: Receive  # the request's ASGI channel: its next message is the client's disconnect
    per_round: bool = False  # server.stream_frames "round": a round's tokens in one frame

    async def result(self) -> Finished:
        """Wait for the whole result (non-streaming requests); a client that leaves stops its row."""
        watcher = asyncio.create_task(self._watch_disconnect())
        try:
            while True:
                event = await self.events.get()
                if isinstance(event, Failed):
                    raise ApiError(event.code, event.message, event.kind)
                if isinstance(event, Finished):
                    counted(event)
                    return event
        finally:
            watcher.cancel()
            self.job.cancelled = True  # no-op once finished; stops the row if the client went away

    async def started(self) -> Started:
        """A stream's first event: its row was built (the rule it runs is known), or it failed
        before its first token (answered with its own status, not a 200 stream)."""
        watcher = asyncio.create_task(self._watch_disconnect())
        try:
            event = await self.events.get()
        finally:
            watcher.cancel()
        if isinstance(event, Failed):
            self.job.cancelled = True
            raise ApiError(event.code, event.message, event.kind)
        assert isinstance(event, Started), event  # the engine sends a stream's Started first
        return event

    async def _watch_disconnect(self) -> None:
        """The body is read by now, so the only message left to receive is `http.disconnect`."""
        while (await self.receive())["type"] != "http.disconnect":
            pass
        self.job.cancelled = True
        self.events.put_nowait(DISCONNECTED)  # the engine sends nothing to a cancelled row

    async def stream(self) -> AsyncIterator[Delta | Progress | Finished | Failed]:
        """Events as the engine produces them; a client that disconnects stops its row.

        Each token is a delta of its own, as llama-server streams one token per frame even
        while drafting. Per round instead (`per_round`), deltas that queued up while the last
        frame was being sent go out as one, so a slow reader costs fewer frames.
        """
        try:
            while True:
                # A turn of the loop per event: a queue that filled while a slow client's writes
                # waited would otherwise be shaped whole, frames for nobody, before the client's
                # disconnect is read (1.6 s of event loop for 80 frames of n_probs 1000)
                await asyncio.sleep(0)
                event = await self.events.get()
                if isinstance(event, Delta) and not self.per_round:
                    for delta in per_token(event):
                        yield delta
                    continue
                while isinstance(event, Delta) and not self.events.empty():
                    following = self.events.get_nowait()
                    if not isinstance(following, Delta):
                        yield event
                        event = following
                        break
                    event = merge(event, following)
                if isinstance(event, Finished):
                    counted(event)
                yield event
                if isinstance(event, Finished | Failed):
                    return
        finally:
            self.job.cancelled = True


def counted(result: Finished) -> None:
    """The row's tokens, for its request's access event."""
    access.count_tokens(result.prompt_n, result.timings.predicted_n)


def per_token(delta: Delta) -> list[Delta]:
    """A round's delta as one delta per token, each with its piece of the text and its
    log-probabilities; per-token timings count the tokens (and the accepted drafts) up to each."""
    if len(delta.tokens) <= 1:
        return [delta]
    count = len(delta.tokens)
    drafted = delta.drafted or [False] * count
    return [
        Delta(
            tokens=[token],
            text=piece,
            timings=delta.timings and up_to(delta.timings, count - 1 - i, sum(drafted[i + 1 :])),
            logprobs=delta.logprobs[i : i + 1],
            pieces=[piece],
            drafted=drafted[i : i + 1],
        )
        for i, (token, piece) in enumerate(zip(delta.tokens, delta.pieces, strict=True))
    ]


def up_to(timings: Timings, later: int, later_drafts: int) -> Timings:
    """A round's timings as of one of its tokens, `later` tokens (`later_drafts` accepted drafts) before its end."""
    accepted = timings.draft_n_accepted
    return msgspec.structs.replace(
        timings,
        predicted_n=timings.predicted_n - later,
        draft_n_accepted=accepted if accepted is None else accepted - later_drafts,
    )


def merge(first: Delta, second: Delta) -> Delta:
    return Delta(
        text=first.text + second.text,
        tokens=first.tokens + second.tokens,
        timings=second.timings,
        logprobs=first.logprobs + second.logprobs,
        pieces=first.pieces + second.pieces,
        drafted=first.drafted + second.drafted,
    )


def start(
    request: Request,
    engine: EngineView,
    data: SamplingFields,
    tokens: list[int],
    route: str,
    params: SamplingParams,
    *,
    choice: int = 0,
    request_id: str | None = None,
    grammar: Grammar | None = None,
    rows: int = 1,
    group: str = "",
) -> Submission:
    """Build the row request (choice `choice` of its prompt, one of the request's `rows`, with the
    request's sampling `params` and `grammar`, its rows together the `group`) and submit it."""
    settings = engine.settings
    requests.check_prompt_fits(tokens, settings, engine.context_limit)
    row_request = requests.row_request(data, tokens, settings, params, choice, grammar, rows, tenant=tenant_of(request))
    loop = asyncio.get_running_loop()
    events: asyncio.Queue[Event] = asyncio.Queue()

    def sink(event: Event) -> None:
        loop.call_soon_threadsafe(events.put_nowait, event)

    job = Job(
        request=row_request,
        request_id=request_id or access.request_id(),
        route=route,
        sink=sink,
        group=group,
        stream=data.stream,
        per_token_timings=data.stream and data.timings_per_token,
        progress=data.stream and data.return_progress,
        diagnostics=data.speculative_diagnostics,
    )
    engine.submit(job)
    return Submission(job, events, request.receive, per_round=settings.server.stream_frames == "round")


@dataclass
class Rows:
    """The rows of one request, one per prompt and choice, in the order of their answer's `index`.

    They run side by side in the engine (its scheduler batches decoding rows); the first failure
    or a client that leaves stops them all.
    """

    request_id: str  # the x-request-id; row i > 0 logs as f"{request_id}-{i}"
    submissions: list[Submission]
    model: str  # the served model's name, as every answer names it (shaping.model_alias)

    @property
    def row_requests(self) -> list[RowRequest]:
        """Each row's request as validated (its seed, its log-probabilities asked), in row order."""
        return [submission.job.request for submission in self.submissions]

    async def started(self) -> list[str | None]:
        """Every row of a stream built: the rule each runs, in row order (a failure cancels them all)."""
        try:
            return [(await submission.started()).rule for submission in self.submissions]
        except BaseException:
            for submission in self.submissions:
                submission.job.cancelled = True
            raise

    async def results(self) -> list[Finished]:
        waits = [asyncio.ensure_future(s.result()) for s in self.submissions]
        try:
            return list(await asyncio.gather(*waits))
        finally:
            for wait in waits:
                wait.cancel()  # after a failure: the others' rows stop

    async def stream(self) -> AsyncIterator[tuple[int, Delta | Progress | Finished | Failed]]:
        """(row index, event) as the rows produce them; ends after every row finished or one failed."""
        if len(self.submissions) == 1:  # the common case keeps Submission.stream's merged deltas
            async for event in self.submissions[0].stream():
                yield 0, event
            return
        merged: asyncio.Queue[tuple[int, Delta | Progress | Finished | Failed]] = asyncio.Queue()

        async def pump(index: int, submission: Submission) -> None:
            async for event in submission.stream():
                merged.put_nowait((index, event))

        pumps = [asyncio.ensure_future(pump(i, s)) for i, s in enumerate(self.submissions)]
        try:
            running = len(pumps)
            while running:
                index, event = await merged.get()
                yield index, event
                if isinstance(event, Failed):
                    return
                running -= isinstance(event, Finished)
        finally:
            for task in pumps:
                task.cancel()  # closes each row's stream, which cancels its row


async def start_rows(
    request: Request,
    engine: EngineView,
    data: SamplingFields,
    prompts: list[list[int]],
    n: int,
    route: str,
    forced_call: dict[str, Any] | None = None,
) -> Rows:
    """Submit `n` rows per prompt (choice j of a prompt seeded by resolve_seed (app/sampling/rng.py)); the
    request's grammar (or a forced tool call's schema, `forced_call`) is compiled once (in the
    grammar worker, off the event loop), and each row follows it with its own matcher."""
    field_policy.refuse_unhonoured(data, engine.settings)
    check_rows(len(prompts), n, engine.settings)
    rows = len(prompts) * n
    # Once per request, off the event loop: logit_bias keys that are text are tokenized.
    # Both caches behind these are per tenant: one tenant's hit must not tell it what another sent.
    tenant = tenant_of(request)
    params = await offload.run(
        request, requests.sampling, data, engine.settings, engine.tokenizer, engine.vocab_size, tenant
    )
    wanted = requests.grammar(data, forced_call)
    grammars: Grammars = request.app.state.grammars
    grammar = None if wanted is None else await grammars.compiled(engine, tenant, *wanted)
    request_id = access.request_id()
    submissions: list[Submission] = []
    try:
        for tokens in prompts:
            for choice in range(n):
                row_id = f"{request_id}-{len(submissions)}" if submissions else request_id
                submission = start(
                    request,
                    engine,
                    data,
                    tokens,
                    route,
                    params,
                    choice=choice,
                    request_id=row_id,
                    grammar=grammar,
                    rows=rows,
                    group=request_id,
                )
                submissions.append(submission)
    except Exception:
        for submission in submissions:
            submission.job.cancelled = True  # a later row was refused: none of them runs
        raise
    return Rows(request_id, submissions, shaping.model_alias(engine.settings))
