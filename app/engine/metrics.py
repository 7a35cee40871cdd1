"""Server-wide counters behind /metrics (llama-server's names) and /slots."""

from __future__ import annotations

from dataclasses import dataclass, field

from app.acceptance import AcceptanceStats
from app.engine.row import Finished


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
    spec_accepted_per_position: list[int] = field(default_factory=list)
    # the prompt cache's counters (app/loading/prompt_cache.py), copied in by each snapshot
    prompt_cache_hits_total: int = 0
    prompt_cache_misses_total: int = 0
    prompt_cache_evictions_total: int = 0
    prompt_cache_bytes: int = 0

    @property
    def prompt_tokens_seconds(self) -> float:
        """Average prompt throughput, tokens/s."""
        return _rate(self.prompt_tokens_total, self.prompt_seconds_total)

    @property
    def predicted_tokens_seconds(self) -> float:
        """Average generation throughput, tokens/s."""
        return _rate(self.tokens_predicted_total, self.tokens_predicted_seconds_total)

    def observe(self, result: Finished, stats: AcceptanceStats) -> None:
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
        per_position = stats.accepted_per_position
        if len(self.spec_accepted_per_position) < len(per_position):
            self.spec_accepted_per_position.extend([0] * (len(per_position) - len(self.spec_accepted_per_position)))
        for i, count in enumerate(per_position):
            self.spec_accepted_per_position[i] += count


def _rate(tokens: float, seconds: float) -> float:
    return tokens / seconds if seconds else 0.0
