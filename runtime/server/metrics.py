"""GET /metrics: the server's counters in Prometheus' text format (prometheus_client), with `edgelm serve --metrics`.

    edgelm_requests_total{endpoint, status}          requests answered, by route and HTTP status
    edgelm_request_duration_seconds{endpoint}        how long each took, streams to their last byte
    edgelm_prompt_tokens_total, edgelm_generated_tokens_total
    edgelm_speculative_drafted_tokens_total          tokens proposed to verify passes (runtime/speculative/)
    edgelm_speculative_accepted_tokens_total         of them, those the model accepted
    edgelm_time_to_first_token_seconds               from the request's arrival to its first generated text
    edgelm_time_per_output_token_seconds             the decode time per token after the first, per request
    edgelm_queue_depth, edgelm_running_requests      waiting for a slot; holding one
    edgelm_jobs_ended_total{outcome}                 finished, cancelled, timeout, shutdown
    edgelm_prefix_cache_reused_tokens_total, edgelm_prefix_cache_bytes   with --prefix-cache-mb

Off by default: the figures tell whoever can read them how busy the server is and how long its requests are, which
on a shared network is more than a local app's users may want known. With --metrics the endpoint answers like
/health (no API key needed) on whatever address the server listens on: keep the server on 127.0.0.1, or give
--api-key, which /metrics then requires. Endpoints are the routes' paths (never the client's path), so the
label set stays bounded whatever the clients send.
"""

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

LATENCY = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300)
PER_TOKEN = (0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1)


class Metrics:
    """One server's counters, in a registry of its own (two apps in one process do not mix)."""

    def __init__(self, jobs, prefix_cache=None):
        self.registry = registry = CollectorRegistry(auto_describe=True)
        self.requests = Counter("edgelm_requests", "Requests answered", ["endpoint", "status"], registry=registry)
        self.duration = Histogram(
            "edgelm_request_duration_seconds", "Request time", ["endpoint"], buckets=LATENCY, registry=registry
        )
        self.prompt_tokens = Counter("edgelm_prompt_tokens", "Prompt tokens of generation requests", registry=registry)
        self.generated = Counter("edgelm_generated_tokens", "Tokens generated", registry=registry)
        self.drafted = Counter("edgelm_speculative_drafted_tokens", "Tokens proposed to verify", registry=registry)
        self.accepted = Counter("edgelm_speculative_accepted_tokens", "Proposed tokens accepted", registry=registry)
        self.first_token = Histogram(
            "edgelm_time_to_first_token_seconds", "Arrival to first text", buckets=LATENCY, registry=registry
        )
        self.per_token = Histogram(
            "edgelm_time_per_output_token_seconds", "Decode time per token", buckets=PER_TOKEN, registry=registry
        )
        Gauge("edgelm_queue_depth", "Requests waiting for a slot", registry=registry).set_function(
            lambda: jobs.slots.queued
        )
        Gauge("edgelm_running_requests", "Requests holding a slot", registry=registry).set_function(
            lambda: jobs.slots.active
        )
        registry.register(_Ended(jobs, prefix_cache))

    def request(self, endpoint: str, status: int, seconds: float) -> None:
        self.requests.labels(endpoint, str(status)).inc()
        self.duration.labels(endpoint).observe(seconds)

    def generation(
        self, arrived: float, first: float | None, last: float, prompt_tokens: int, tokens: int, speculation=None
    ) -> None:
        """A generation request's figures, told once it ends (time.monotonic() values; speculation: its
        {drafted, accepted, ...} where it speculated, else None)."""
        self.prompt_tokens.inc(prompt_tokens)
        self.generated.inc(tokens)
        if speculation is not None:
            self.drafted.inc(speculation["drafted"])
            self.accepted.inc(speculation["accepted"])
        if first is not None:
            self.first_token.observe(first - arrived)
            if tokens > 1:
                self.per_token.observe((last - first) / (tokens - 1))

    def exposition(self) -> tuple[bytes, str]:
        return generate_latest(self.registry), CONTENT_TYPE_LATEST


class _Ended:
    """Counters the server keeps itself, read at each scrape: jobs ended by outcome, the prefix cache's figures."""

    def __init__(self, jobs, prefix_cache):
        self.jobs, self.prefix_cache = jobs, prefix_cache

    def describe(self):
        return []

    def collect(self):
        ended = CounterMetricFamily("edgelm_jobs_ended", "Jobs ended, by outcome", labels=["outcome"])
        for outcome, count in self.jobs.ended.items():
            ended.add_metric([outcome], count)
        yield ended
        if self.prefix_cache is not None:
            stats = self.prefix_cache.stats()
            yield CounterMetricFamily(
                "edgelm_prefix_cache_reused_tokens", "Prompt tokens copied from the cache", value=stats["reused_tokens"]
            )
            yield GaugeMetricFamily("edgelm_prefix_cache_bytes", "Bytes the prefix cache holds", value=stats["bytes"])
