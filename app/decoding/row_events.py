"""What a row sends its request's handler, in order: `Started` (a stream's rule, before any frame),
`Progress` (a stream's prefill), one `Delta` per step, then `Finished` or `Failed`.

`Generation` (app/decoding/generation.py) makes the deltas; the engine (app/engine/row.py) the
rest; HTTP reads them through app/server/engine_view.py.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from app.decoding.timings import Timings
from app.sampling.logprobs import TokenLogprob


@dataclass(frozen=True)
class Delta:
    """What one step added: decided tokens and the text that is now safe to stream.

    The engine streams deltas as they come, with the request's `timings` so far (base keys only)
    when it asked for per-token timings, and the tokens' log-probabilities when it asked for them.
    """

    tokens: list[int]
    text: str
    timings: Timings | None = None
    logprobs: list[TokenLogprob] = field(default_factory=list)  # one per token, when the request asked
    # `text` cut at the tokens it came from, one piece per token (they join to `text`), so a
    # stream can send a round's tokens one frame each, as llama-server does
    pieces: list[str] = field(default_factory=list)
    drafted: list[bool] = field(default_factory=list)  # per token: an accepted draft (else decided by the target)


@dataclass(frozen=True)
class Finished:
    """The whole result of a request."""

    text: str
    tokens: list[int]
    stop_type: str
    stopping_word: str
    prompt_n: int  # the whole prompt (timings.cache_n of them restored from the prompt cache)
    timings: Timings  # with the draft block when a drafter ran a verify round
    rule: str | None
    draft_kind: str | None
    n_max: int = 0  # the row's width cap (row_n_max), as generation_settings, /slots and events report it
    logprobs: list[TokenLogprob] = field(default_factory=list)  # one per token, when the request asked
    biased: bool = False  # Speculation.biased: the stream followed the target's argmax at T > 0


@dataclass(frozen=True)
class Started:
    """A streaming row was built: the rule its loop runs (None: no drafter), which the response's
    headers name before its first frame."""

    rule: str | None


@dataclass(frozen=True)
class Progress:
    """How far a streaming row's prefill has come, for a request that asked (llama-server's
    `return_progress`): `total` prompt tokens, `cache` of them restored from the prompt cache,
    `processed` in the target's cache so far (the restored ones included), `time_ms` since the
    prefill began. Sent once the row is built (processed = cache) and after each chunk it prefills."""

    total: int
    cache: int
    processed: int
    time_ms: int


@dataclass(frozen=True)
class Failed:
    """A row that ended in error: what its client is told, the HTTP status, the error's type."""

    message: str
    code: int = 500
    kind: str = "server_error"


Event = Started | Progress | Delta | Finished | Failed
Sink = Callable[[Event], None]
