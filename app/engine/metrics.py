"""Server-wide counters behind /metrics (llama-server's names) and /slots, and the latency
histograms (prometheus_client's, which take observations from the engine thread under their
own locks)."""

from __future__ import annotations

from dataclasses import dataclass, field

from prometheus_client import Histogram

from app.decoding.outcome import RowStats
from app.decoding.row_events import Finished

# Seconds, from a token on a warm model to a long generation queued behind others
LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0)
TOKEN_GAP_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)


def _histogram(name: str, help_text: str, buckets: tuple[float, ...] = LATENCY_BUCKETS) -> Histogram:
    """Unregistered: /metrics collects it through its own registry (app/server/metrics.py)."""
    return Histogram(name, help_text, buckets=buckets, registry=None)


@dataclass(frozen=True)
class Latencies:
    """Per-request wall times, as the client waits them, from the moment the request was queued."""

    queue_wait: Histogram = field(
        default_factory=lambda: _histogram("mlxcel_queue_wait_seconds", "Time from queued to admitted into a row.")
    )
    time_to_first_token: Histogram = field(
        default_factory=lambda: _histogram(
            "mlxcel_time_to_first_token_seconds", "Time from queued to the first generated token."
        )
    )
    end_to_end: Histogram = field(
        default_factory=lambda: _histogram(
            "mlxcel_request_duration_seconds", "Time from queued to the last generated token."
        )
    )
    inter_token: Histogram = field(
        default_factory=lambda: _histogram(
            "mlxcel_inter_token_latency_seconds",
            "A request's mean time between generated tokens after the first (requests of two tokens or more).",
            TOKEN_GAP_BUCKETS,
        )
    )

    def observe(self, created: float, admitted: float, first: float, last: float, predicted_n: int) -> None:
        self.queue_wait.observe(admitted - created)
        self.time_to_first_token.observe(first - created)
        self.end_to_end.observe(last - created)
        if predicted_n >= 2:
            self.inter_token.observe((last - first) / (predicted_n - 1))


@dataclass
class Metrics:
    """Written by the engine thread only; read by HTTP handlers (plain ints under the GIL)."""

    prompt_tokens_total: int = 0
    prompt_seconds_total: float = 0.0
    tokens_predicted_total: int = 0
    tokens_predicted_seconds_total: float = 0.0
    requests_processing: int = 0
    requests_deferred: int = 0
    spec_decode_num_drafts_total: int = 0
    spec_decode_num_draft_tokens_total: int = 0
    spec_decode_num_accepted_tokens_total: int = 0
    spec_decode_plain_steps_total: int = 0  # drafting rows' steps that verified nothing (width 0)
    spec_accepted_per_position: list[int] = field(default_factory=list)
    spec_accepted_lengths: list[int] = field(default_factory=list)  # [k]: verify rounds that accepted k drafts
    spec_widths: list[int] = field(default_factory=list)  # [w]: verify rounds the width policy ran at width w
    # the prompt cache's counters (app/execution/prompt_cache.py), copied in by each snapshot
    prompt_cache_hits_total: int = 0
    prompt_cache_misses_total: int = 0
    prompt_cache_evictions_total: int = 0
    prompt_cache_bytes: int = 0
    latencies: Latencies = field(default_factory=Latencies)

    @property
    def prompt_tokens_seconds(self) -> float:
        """Average prompt throughput, tokens/s."""
        return _rate(self.prompt_tokens_total, self.prompt_seconds_total)

    @property
    def predicted_tokens_seconds(self) -> float:
        """Average generation throughput, tokens/s."""
        return _rate(self.tokens_predicted_total, self.tokens_predicted_seconds_total)

    def observe(self, result: Finished, row: RowStats) -> None:
        timings = result.timings
        self.prompt_tokens_total += timings.prompt_n
        self.prompt_seconds_total += timings.prompt_ms / 1000.0
        self.tokens_predicted_total += timings.predicted_n
        self.tokens_predicted_seconds_total += timings.predicted_ms / 1000.0
        if timings.draft_rounds is None:
            return
        self.spec_decode_num_drafts_total += timings.draft_rounds
        self.spec_decode_num_draft_tokens_total += timings.draft_n or 0
        self.spec_decode_num_accepted_tokens_total += timings.draft_n_accepted or 0
        self.spec_decode_plain_steps_total += row.plain_steps
        stats = row.acceptance
        _add(self.spec_accepted_per_position, stats.accepted_per_position)
        _add(self.spec_accepted_lengths, stats.accepted_lengths)
        _add(self.spec_widths, [row.widths.get(w, 0) for w in range(max(row.widths, default=-1) + 1)])


def _add(total: list[int], counts: list[int]) -> None:
    """Add `counts` into `total` element-wise, growing it as needed."""
    if len(total) < len(counts):
        total.extend([0] * (len(counts) - len(total)))
    for i, count in enumerate(counts):
        total[i] += count


def _rate(tokens: float, seconds: float) -> float:
    return tokens / seconds if seconds else 0.0
