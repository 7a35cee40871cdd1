"""One request's decode from prompt to stop: limits, EOS, stop strings, text and timestamps."""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass, field
from enum import StrEnum

from mlx_lm.tokenizer_utils import TokenizerWrapper

from app.decoding.loop import RoundLoop
from app.decoding.outcome import Note, RoundOutcome, RowStats, log_notes
from app.decoding.row_events import Delta
from app.decoding.speculation import Speculation
from app.decoding.width import OWN_WIDTH, WidthOffer, WidthPolicy
from app.events.speculation import Speculated
from app.execution.prompt_cache import RowCaching
from app.execution.steps import Steps, run_alone
from app.sampling.logprobs import TokenLogprob
from app.sampling.state import RowState


class StopType(StrEnum):
    NONE = "none"
    EOS = "eos"
    LIMIT = "limit"
    WORD = "word"


@dataclass
class Generation:
    """Drives a round loop for one row and turns its tokens into text.

    `max_tokens` counts every decided token (an EOS included); -1 means until EOS or the context
    limit. Stop strings are matched on the text; text that could still become a stop string is
    held back from the stream until it cannot. Two of llama-server's code-completion limits end
    the text as well (both `limit`): `n_indent`, a line after the first new line whose first
    character is indented by fewer columns (the text ends before that character), and
    `t_max_predict_ms`, a step that brings a new line once that long has passed since the first
    token.

    Iterating it runs it: `for delta in generation:` yields each step's delta (the prefill's
    chunks first, empty until the first token) and stops once it has finished.

    Each step's `RoundOutcome` is folded into `stats` once the tokens it keeps are known;
    `speculation` (what the row's loop judges with) and `widths` (its width policy, None without
    a drafter) are the builder's, shared with the loop; `n_max` is the row's resolved width cap.
    """

    loop: RoundLoop
    state: RowState
    tokenizer: TokenizerWrapper
    max_tokens: int
    context_limit: int
    stop: list[str] = field(default_factory=list)
    ignore_eos: bool = False
    n_indent: int = 0
    t_max_predict_ms: int = 0
    emitted: list[int] = field(default_factory=list)
    stop_type: StopType = StopType.NONE
    stopping_word: str = ""
    prefill_started: float = 0.0
    prefill_finished: float = 0.0
    last_token_at: float = 0.0
    speculation: Speculation = field(default_factory=Speculation)
    widths: WidthPolicy | None = None
    n_max: int = 0  # row_n_max (app/decoding/width.py): the most proposals a round of this row may carry
    stats: RowStats = field(default_factory=RowStats)  # the notes of the loop's choice already in
    excluded_s: float = 0.0  # a drafter's first load, paid by this request, kept out of its timings
    caching: RowCaching | None = None  # the row's use of the prompt cache (None: it does not use it)
    exact: bool = True  # the plan's execution.exact: whether its tokens are independent of its batch-mates

    def __post_init__(self) -> None:
        self.prompt_n = len(self.state.tokens)
        self._detokenizer = self.tokenizer.detokenizer
        self._text = ""
        self._streamed = 0
        self.stop = [s for s in self.stop if s]
        self._longest_stop = max(map(len, self.stop), default=0)
        self._scanned = 0  # text[:_scanned] holds no stop string
        self._lines_scanned = 0  # every line starting before here is indented enough (n_indent)
        self._eos = set(self.tokenizer.eos_token_ids)
        room = self.context_limit - self.prompt_n
        self._limit = room if self.max_tokens < 0 else min(self.max_tokens, room)

    @property
    def finished(self) -> bool:
        return self.stop_type is not StopType.NONE

    @property
    def text(self) -> str:
        return self._text

    @property
    def logprobs(self) -> list[TokenLogprob]:
        """The emitted tokens' log-probabilities (empty unless the request asked)."""
        return self.state.reported[: len(self.emitted)]

    @property
    def cache_n(self) -> int:
        """Prompt tokens restored from the prompt cache rather than prefilled."""
        return self.caching.reused if self.caching is not None else 0

    @property
    def prefilled(self) -> bool:
        return self.prefill_finished > 0.0

    @property
    def prompt_processed(self) -> int:
        """Prompt tokens the target's cache holds so far, restored or prefilled (its decided
        tokens beyond the prompt are not counted): how far the prefill has come."""
        return min(self.loop.target.length, self.prompt_n)

    def __iter__(self) -> Generation:
        return self

    def __next__(self) -> Delta:
        """One step: a chunk of the prefill until the first token, then a decode step or round."""
        if self.finished:
            raise StopIteration
        return self.step() if self.prefilled else self.prefill_chunk()

    def prefill(self) -> Delta:
        """The whole prefill at once, up to the first token (offline callers)."""
        delta = self.prefill_chunk()
        while not self.prefilled:
            delta = self.prefill_chunk()
        return delta

    def prefill_chunk(self) -> Delta:
        """One chunk of the prefill (one engine tick); the first token once the prompt is in."""
        return run_alone(self.prefilling())

    def prefilling(self) -> Steps[Delta]:
        """`prefill_chunk` as the forwards it asks for (the engine batches many rows' chunks)."""
        if not self.prefill_started:
            self.prefill_started = time.perf_counter()
        if self._limit <= 0:
            self.prefill_finished = self.last_token_at = self.prefill_started
            self.stop_type = StopType.LIMIT
            return Delta([], "")
        token = yield from self.loop.prefilling(self.state)
        if token is None:
            return Delta([], "")
        self.prefill_finished = self.last_token_at = time.perf_counter()
        if self.caching is not None:
            self.caching.store()
        return self._accept([token])

    def step(self) -> Delta:
        return self._stepped(self.loop.step(self.state, self._limit - len(self.emitted)))

    def steps(self, offer: WidthOffer = OWN_WIDTH) -> Steps[Delta]:
        """A decode step (after the prefill) as the forwards it asks for, for the engine's batch;
        `offer`: the tick's choice of its round's width."""
        return self._stepped((yield from self.loop.steps(self.state, self._limit - len(self.emitted), offer)))

    @property
    def mask_seconds(self) -> float:
        """CPU seconds its grammar's masks took so far (0: no grammar)."""
        constraint = self.state.constraint
        return constraint.spent_s if constraint is not None else 0.0

    def ticking(self, offer: WidthOffer = OWN_WIDTH) -> Steps[Delta]:
        """What one engine tick advances, as the forwards it asks for: a prefill chunk until the
        first token, then a decode step or round (within `offer`, the tick's choice of its width)."""
        return (yield from (self.steps(offer) if self.prefilled else self.prefilling()))

    def positions(self) -> int:
        """Target positions the next tick forwards at most (a prefill chunk, or a step's)."""
        return self.loop.positions(self.state)

    @property
    def notes(self) -> list[Note]:
        """Every note the row's loop choice and rounds left (app/decoding/outcome.py `Note`)."""
        return self.stats.notes

    def log_notes(self, request_id: str | None) -> None:
        """Log what the row noted since the last call, each note once: how its loop was chosen
        (block loops: drafter loaded, probes, declines), prompt lookup's governor pausing or
        resuming (with the tokens the row has decided)."""
        log_notes(self.stats.unlogged(), request_id, decided=len(self.emitted))

    def speculated(self) -> Speculated | None:
        """What the row's verify rounds did, for its event once it has finished (None: it ran none)."""
        speculation, stats = self.speculation, self.stats
        if not (speculation.drafting and stats.ran):
            return None
        acceptance = stats.acceptance
        return Speculated(
            rule=str(speculation.rule),
            draft_kind=str(speculation.draft_kind),
            biased=speculation.biased(self.state.sampler.is_greedy),
            coupled=speculation.coupled,
            rounds=acceptance.rounds,
            proposed=acceptance.proposed,
            positions_tested=acceptance.positions_tested,
            accepted=acceptance.accepted,
            per_position_acceptance=round(acceptance.per_position_acceptance, 4),
            mean_accepted_len=round(acceptance.mean_accepted_len, 4),
            predicted_n=len(self.emitted),
            n_max=self.n_max,
            widths={str(width): rounds for width, rounds in sorted(stats.widths.items())},
            plain_steps=stats.plain_steps,
            governor_pauses=stats.governor_pauses,
            governor_resumes=stats.governor_resumes,
        )

    def _stepped(self, outcome: RoundOutcome) -> Delta:
        self.last_token_at = time.perf_counter()
        delta = self._accept(list(outcome.tokens))
        self.stats.fold(outcome, len(delta.tokens))
        return dataclasses.replace(delta, drafted=outcome.drafted(len(delta.tokens)))

    def _accept(self, tokens: list[int]) -> Delta:
        kept: list[int] = []
        ends: list[int] = []  # the detokenized text's length after each kept token
        before = len(self._detokenizer.text)
        for token in tokens:
            kept.append(token)
            if token in self._eos and not self.ignore_eos:
                self.stop_type = StopType.EOS
                break
            self._detokenizer.add_token(token)
            ends.append(len(self._detokenizer.text))
            if len(self.emitted) + len(kept) >= self._limit:
                self.stop_type = StopType.LIMIT
                break
        if not self.finished and self._out_of_time("\n" in self._detokenizer.text[before:]):
            self.stop_type = StopType.LIMIT
        if self.finished:
            self._detokenizer.finalize()
        self._text = self._detokenizer.text
        stop_end = self._match_stop_strings()
        indent_end = self._match_indent()
        cut_end = stop_end if indent_end is None else indent_end  # the indent's cut is the earlier one
        if cut_end is not None:  # a round's tokens after the one that ended the text are not emitted
            ends.append(len(self._detokenizer.text))  # the EOS or limit token, if one ended the loop above
            kept = kept[: next((i + 1 for i, end in enumerate(ends[: len(kept)]) if end >= cut_end), len(kept))]
        logprobs = self.state.reported[len(self.emitted) : len(self.emitted) + len(kept)]
        self.emitted.extend(kept)
        start = self._streamed
        chunk = self._release()
        return Delta(kept, chunk, logprobs=logprobs, pieces=_cut(chunk, start, ends, len(kept)))

    def _match_stop_strings(self) -> int | None:
        """The earliest stop string in the text; only text new since the last step (plus the
        longest stop string's length - 1 before it) can hold one that was not there before. Where
        one is found, the text offset it ends at (the tokens up to there are the row's last)."""
        if not self.stop:
            return None
        start = max(0, self._scanned - self._longest_stop + 1)
        hits = [(at, s) for s in self.stop if (at := self._text.find(s, start)) >= 0]
        found = None
        if hits:
            at, word = min(hits)
            found = at + len(word)
            self._text = self._text[:at]
            self.stop_type, self.stopping_word = StopType.WORD, word
        self._scanned = len(self._text)
        return found

    def _out_of_time(self, new_line: bool) -> bool:
        """llama-server's `t_max_predict_ms`: a step that brings a new line after that long since the first token."""
        if self.t_max_predict_ms <= 0 or not new_line:
            return False
        return (time.perf_counter() - self.prefill_finished) * 1000.0 > self.t_max_predict_ms

    def _match_indent(self) -> int | None:
        """llama-server's `n_indent`: the first line after a new line whose first character (other
        than spaces and tabs) sits fewer than `n_indent` columns in ends the text before that
        character. Where it does, the offset just past that character (its token is the last)."""
        if self.n_indent <= 0:
            return None
        text = self._text
        at = text.find("\n", self._lines_scanned)
        while at >= 0:
            start = pos = at + 1
            while pos < len(text) and text[pos] in " \t":
                pos += 1
            if pos == len(text):  # the line holds nothing but its indentation yet
                self._lines_scanned = at
                return None
            if pos - start < self.n_indent:
                self._text = text[:pos]
                self.stop_type, self.stopping_word = StopType.LIMIT, ""
                return pos + 1
            at = text.find("\n", start)
        self._lines_scanned = len(text)
        return None

    def _release(self) -> str:
        """Text not streamed yet, minus any tail that may be the start of a stop string."""
        end = len(self._text)
        if not self.finished and self.stop:
            tail = self._text[max(self._streamed, end - self._longest_stop + 1) :]
            end -= max(_overlap(tail, s) for s in self.stop)
        chunk = self._text[self._streamed : max(end, self._streamed)]
        self._streamed = max(end, self._streamed)
        return chunk


def _cut(chunk: str, start: int, ends: list[int], count: int) -> list[str]:
    """`chunk` (the text from offset `start`) in `count` pieces, piece i ending where token i's
    text ended (`ends`, clamped to the chunk): text held back earlier for a stop string goes out
    with the first piece, what finalizing the detokenizer added with the last."""
    bounds = [min(max(end - start, 0), len(chunk)) for end in ends[: count - 1]]
    bounds += [len(chunk)] * (count - len(bounds))
    pieces, at = [], 0
    for bound in bounds:
        bound = max(bound, at)
        pieces.append(chunk[at:bound])
        at = bound
    return pieces


def _overlap(tail: str, stop: str) -> int:
    """Length of the longest suffix of `tail` that is a proper prefix of `stop`.

    Only suffixes starting with stop's first character can match, so `find` skips to those.
    """
    at = tail.find(stop[0], max(0, len(tail) - len(stop) + 1))
    while at >= 0:
        if stop.startswith(tail[at:]):
            return len(tail) - at
        at = tail.find(stop[0], at + 1)
    return 0
