"""/metrics: the engine's counters in Prometheus text, under llama-server's metric names.

prometheus_client writes the exposition format; the table below names each metric once.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from app.server.engine_view import Metrics

PREFIX = "llamacpp:"
CONTENT_TYPE = "text/plain; version=0.0.4"


def _rate(tokens: float, seconds: float) -> float:
    return tokens / seconds if seconds else 0.0


# (name, family, HELP text, value)
SCALARS: tuple[tuple[str, type[Metric], str, Callable[[Metrics], float]], ...] = (
    ("prompt_tokens_total", CounterMetricFamily, "Number of prompt tokens processed.",
     lambda m: m.prompt_tokens_total),
    ("prompt_seconds_total", CounterMetricFamily, "Prompt process time.",
     lambda m: m.prompt_seconds_total),
    ("tokens_predicted_total", CounterMetricFamily, "Number of generation tokens processed.",
     lambda m: m.tokens_predicted_total),
    ("tokens_predicted_seconds_total", CounterMetricFamily, "Predict process time.",
     lambda m: m.tokens_predicted_seconds_total),
    ("prompt_tokens_seconds", GaugeMetricFamily, "Average prompt throughput in tokens/s.",
     lambda m: _rate(m.prompt_tokens_total, m.prompt_seconds_total)),
    ("predicted_tokens_seconds", GaugeMetricFamily, "Average generation throughput in tokens/s.",
     lambda m: _rate(m.tokens_predicted_total, m.tokens_predicted_seconds_total)),
    ("requests_processing", GaugeMetricFamily, "Number of requests processing.",
     lambda m: m.requests_processing),
    ("requests_deferred", GaugeMetricFamily, "Number of requests deferred.",
     lambda m: m.requests_deferred),
    ("spec_decode_num_drafts_total", CounterMetricFamily, "Verify rounds run on drafted tokens.",
     lambda m: m.spec_drafts_total),
    ("spec_decode_num_draft_tokens_total", CounterMetricFamily, "Drafted tokens proposed for verification.",
     lambda m: m.spec_draft_tokens_total),
    ("spec_decode_num_accepted_tokens_total", CounterMetricFamily, "Drafted tokens accepted and emitted.",
     lambda m: m.spec_accepted_tokens_total),
)  # fmt: skip
PER_POSITION = (
    "spec_decode_num_accepted_tokens_per_pos_total",
    "Drafted tokens accepted at each draft position (0 = first).",
)


class EngineCollector:
    """A prometheus_client collector reading one Metrics object at scrape time."""

    def __init__(self, metrics: Metrics) -> None:
        self.metrics = metrics

    def collect(self) -> Iterator[Metric]:
        m = self.metrics
        for name, family, help_text, value in SCALARS:
            yield family(PREFIX + name, help_text, value=value(m))
        name, help_text = PER_POSITION
        per_position = CounterMetricFamily(PREFIX + name, help_text, labels=["position"])
        for position, count in enumerate(m.spec_accepted_per_position):
            per_position.add_metric([str(position)], count)
        yield per_position


def exposition(metrics: Metrics) -> bytes:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(EngineCollector(metrics))
    return generate_latest(registry)
