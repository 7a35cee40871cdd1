"""/metrics: the engine's counters under llama-server's metric names, the latency and
accepted-length histograms, requests by route and status, and the process's own metrics.

prometheus_client writes the exposition format (counters as exact integers below 2^53, never
rounded); the table below names each llama-server metric once.
"""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client import CollectorRegistry, Counter, ProcessCollector, disable_created_metrics, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric

from app.server.engine_view import Metrics

disable_created_metrics()  # no `_created` series beside each counter and histogram: llama-server has none

PREFIX = "llamacpp:"
CONTENT_TYPE = "text/plain; version=0.0.4"


C, G = CounterMetricFamily, GaugeMetricFamily
# (llama-server's name, which is also the Metrics attribute; family; HELP text)
SCALARS: tuple[tuple[str, type[Metric], str], ...] = (
    ("prompt_tokens_total", C, "Number of prompt tokens processed."),
    ("prompt_seconds_total", C, "Prompt process time."),
    ("tokens_predicted_total", C, "Number of generation tokens processed."),
    ("tokens_predicted_seconds_total", C, "Predict process time."),
    ("prompt_tokens_seconds", G, "Average prompt throughput in tokens/s."),
    ("predicted_tokens_seconds", G, "Average generation throughput in tokens/s."),
    ("requests_processing", G, "Number of requests processing."),
    ("requests_deferred", G, "Number of requests deferred."),
    ("spec_decode_num_drafts_total", C, "Verify rounds run on drafted tokens."),
    ("spec_decode_num_draft_tokens_total", C, "Drafted tokens proposed for verification."),
    ("spec_decode_num_accepted_tokens_total", C, "Drafted tokens accepted and emitted."),
    ("prompt_cache_hits_total", C, "Requests that restored a prompt prefix from the prompt cache."),
    ("prompt_cache_misses_total", C, "Requests that looked in the prompt cache and found no prefix."),
    ("prompt_cache_evictions_total", C, "Prompt cache entries dropped for its budget."),
    ("prompt_cache_bytes", G, "Bytes the prompt cache's entries hold."),
)
PER_POSITION = (
    "spec_decode_num_accepted_tokens_per_pos_total",
    "Drafted tokens accepted at each draft position (0 = first).",
)


ACCEPTED_LENGTH = (
    "mlxcel_spec_decode_accepted_length",
    "Drafted tokens accepted per verify round (le: at most that many; the bonus token not counted).",
)
WIDTH = (
    "mlxcel_spec_decode_width",
    "Verify rounds by the width (proposals) the width policy decided for them (le: at most that many).",
)
PLAIN_STEPS = (
    "mlxcel_spec_decode_plain_steps_total",
    "Steps of drafting rows that verified no draft (width 0: the tick's choice, a paused governor).",
)
UNMATCHED = "unmatched"  # the route label of a path no route serves (keeps the label set bounded)


class HttpMetrics:
    """Requests by route and status, counted by the access log (app/server/access.py)."""

    def __init__(self) -> None:
        self.requests = Counter(
            "mlxcel_http_requests",
            "HTTP requests answered, by route (its path template) and status.",
            ["route", "status"],
            registry=None,
        )

    def observe(self, route: str | None, status: int) -> None:
        self.requests.labels(route or UNMATCHED, str(status)).inc()


class EngineCollector:
    """A prometheus_client collector reading one Metrics object at scrape time."""

    def __init__(self, metrics: Metrics) -> None:
        self.metrics = metrics

    def collect(self) -> Iterator[Metric]:
        m = self.metrics
        for name, family, help_text in SCALARS:
            yield family(PREFIX + name, help_text, value=getattr(m, name))
        name, help_text = PER_POSITION
        per_position = CounterMetricFamily(PREFIX + name, help_text, labels=["position"])
        for position, count in enumerate(m.spec_accepted_per_position):
            per_position.add_metric([str(position)], count)
        yield per_position
        yield counts_histogram(ACCEPTED_LENGTH, m.spec_accepted_lengths)
        yield counts_histogram(WIDTH, m.spec_widths)
        name, help_text = PLAIN_STEPS
        yield CounterMetricFamily(name, help_text, value=m.spec_decode_plain_steps_total)
        for histogram in vars(m.latencies).values():
            yield from histogram.collect()


def counts_histogram(metric: tuple[str, str], counts: list[int]) -> HistogramMetricFamily:
    """Exact counts by value ([v]: rounds of value v: accepted length, width) as a cumulative histogram."""
    name, help_text = metric
    buckets, running = [], 0
    for length, count in enumerate(counts):
        running += count
        buckets.append((str(length), running))
    buckets.append(("+Inf", running))
    total = sum(length * count for length, count in enumerate(counts))
    return HistogramMetricFamily(name, help_text, buckets=buckets, sum_value=total)


class RoutedCollector:
    """Each loaded model's metrics in one family per name, every sample labelled with its `model`:
    the names the router's table gives, so the label's values are bounded by the profile."""

    def __init__(self, metrics: dict[str, Metrics]) -> None:
        self.metrics = metrics

    def collect(self) -> Iterator[Metric]:
        families: dict[str, Metric] = {}
        for model, metrics in self.metrics.items():
            for family in EngineCollector(metrics).collect():
                samples = [sample._replace(labels={"model": model, **sample.labels}) for sample in family.samples]
                if family.name in families:
                    families[family.name].samples += samples
                else:
                    family.samples = samples
                    families[family.name] = family
        yield from families.values()


def exposition(metrics: Metrics | dict[str, Metrics], http: HttpMetrics) -> bytes:
    """The exposition of one engine's metrics, or (a router's) each loaded model's, labelled."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(RoutedCollector(metrics) if isinstance(metrics, dict) else EngineCollector(metrics))
    registry.register(http.requests)
    ProcessCollector(registry=registry)  # process_cpu_seconds_total, memory, open fds (Linux)
    return generate_latest(registry)
