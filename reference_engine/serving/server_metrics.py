"""Prometheus metrics of the reference server, named like vLLM's (`reference:` instead of `vllm:`).

Two kinds. What a front end counts itself (prompt and generated tokens, finished and aborted requests, TTFT,
inter-token and end-to-end latency) are prometheus_client metrics; with several front-end processes
(`--api-server-count`) they live in prometheus_client's multiprocess files, so a scrape of any front end sums
every process's. What the engine core reports (running and waiting requests, KV blocks, prefix-cache and
preemption counts, engine steps, CUDA-graph set-up) is read at scrape time from the scraped front end's latest
step report, which every front end receives, by `EngineCollector`: the same in every process, never summed.
"""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest, values
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.multiprocess import MultiProcessCollector
from prometheus_client.registry import Collector

from reference_engine.engine_info import EngineStartup
from reference_engine.serving.request_streams import RequestStreams

_LATENCY_BUCKETS = (
    0.001,
    0.0025,
    0.005,
    0.0075,
    0.01,
    0.02,
    0.04,
    0.06,
    0.08,
    0.1,
    0.25,
    0.5,
    0.75,
    1.0,
    2.5,
    5.0,
    7.5,
    10.0,
    20.0,
    40.0,
    80.0,
)
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


def metrics_shared() -> bool:
    """Whether this process's metrics go to prometheus_client's multiprocess files, as prometheus_client
    decided when it was first imported (from PROMETHEUS_MULTIPROC_DIR: `frontends.py` sets it)."""
    return values.ValueClass is not values.MutexValue


class ServerMetrics:
    def __init__(self, model_name: str) -> None:
        # What a scrape renders. Shared between processes, this process's metrics are registered nowhere and
        # read back from every front end's files; else they are registered in it directly.
        self.registry = CollectorRegistry()
        r = None if metrics_shared() else self.registry
        if r is None:
            MultiProcessCollector(self.registry)
        self._engine_collected = False
        labels = ["model_name"]
        self.aborted = Counter(
            "reference:num_aborted_requests",
            "Requests abandoned before finishing (client disconnect, stop string, shutdown).",
            labels,
            registry=r,
        )
        self.prompt_tokens = Counter("reference:prompt_tokens", "Prompt tokens received.", labels, registry=r)
        self.generation_tokens = Counter(
            "reference:generation_tokens", "Tokens generated.", labels, registry=r
        )
        self.request_success = Counter(
            "reference:request_success",
            "Requests finished, by reason.",
            [*labels, "finished_reason"],
            registry=r,
        )
        self.ttft = Histogram(
            "reference:time_to_first_token_seconds",
            "Arrival to first generated token.",
            labels,
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.itl = Histogram(
            "reference:inter_token_latency_seconds",
            "Gap between consecutive generated tokens.",
            labels,
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.e2e = Histogram(
            "reference:e2e_request_latency_seconds",
            "Arrival to last generated token.",
            labels,
            buckets=(*_LATENCY_BUCKETS, 160.0, 320.0),
            registry=r,
        )
        self.model = model_name
        # The per-token series, bound once: `labels()` takes a lock and builds a key on every call (about 5 us
        # a token in all, at 256 streams).
        self.generated = self.generation_tokens.labels(model_name)
        self.first_token = self.ttft.labels(model_name)
        self.token_gap = self.itl.labels(model_name)
        self.aborted_one = self.aborted.labels(model_name).inc

    def render(self, async_engine: RequestStreams, setup: EngineStartup) -> bytes:
        """Everything, as Prometheus text: this process's (or every front end's) counters and histograms, and
        the engine's state as this front end last heard it."""
        if not self._engine_collected:  # the engine is known from the first scrape on
            self.registry.register(EngineCollector(self.model, async_engine, setup))
            self._engine_collected = True
        return generate_latest(self.registry)


class EngineCollector(Collector):
    """The engine core's counters and start-up report, read when scraped."""

    def __init__(self, model: str, async_engine: RequestStreams, setup: EngineStartup) -> None:
        self.model = model
        self.async_engine = async_engine
        self.setup = setup

    def collect(self) -> Iterator[Metric]:
        engine, setup, m = self.async_engine, self.setup, [self.model]
        stats = engine.stats()

        def gauge(name: str, doc: str, value: float) -> GaugeMetricFamily:
            family = GaugeMetricFamily(name, doc, labels=["model_name"])
            family.add_metric(m, value)
            return family

        def counter(name: str, doc: str, value: float) -> CounterMetricFamily:
            family = CounterMetricFamily(name, doc, labels=["model_name"])
            family.add_metric(m, value)
            return family

        yield gauge("reference:num_requests_running", "Requests in the running batch.", stats.running)
        yield gauge("reference:num_requests_waiting", "Requests waiting to be scheduled.", engine.num_waiting)
        yield gauge(
            "reference:kv_cache_blocks_used", "KV-cache blocks held by requests.", stats.kv_blocks_used
        )
        yield gauge(
            "reference:kv_cache_blocks_free", "KV-cache blocks on the free list.", stats.kv_blocks_free
        )
        yield gauge(
            "reference:kv_cache_usage_perc",
            "Fraction of KV-cache blocks in use (0-1).",
            stats.kv_blocks_used / max(1, stats.kv_blocks_total),
        )
        yield gauge(
            "reference:cuda_graph_buckets",
            "Decode batch sizes captured as CUDA graphs.",
            len(setup.cuda_graph_buckets),
        )
        yield gauge(
            "reference:cuda_graph_pool_bytes",
            "Device memory held by CUDA graphs (decode steps and the pieces of steps with prompts).",
            setup.cuda_graph_pool_bytes + setup.mixed_graph_pool_bytes,
        )
        yield gauge(
            "reference:cuda_graph_warmup_seconds",
            "Start-up seconds of the eager step before capture (first use of kernels).",
            setup.cuda_graph_warmup_seconds,
        )
        capture = GaugeMetricFamily(
            "reference:cuda_graph_capture_seconds",
            "Start-up seconds of each CUDA-graph bucket (its warm-up step and capture).",
            labels=["model_name", "batch_size"],
        )
        for size, seconds in setup.cuda_graph_capture_seconds.items():
            capture.add_metric([self.model, str(size)], seconds)
        yield capture
        yield counter(
            "reference:prefix_cache_queries",
            "Prompt tokens looked up in the prefix cache.",
            stats.prefix_queried_tokens,
        )
        yield counter(
            "reference:prefix_cache_hits", "Prompt tokens found in the prefix cache.", stats.prefix_hit_tokens
        )
        yield counter(
            "reference:num_preemptions", "Sequences preempted for lack of KV blocks.", stats.preemptions
        )
        yield counter("reference:engine_steps", "Engine steps run.", engine.num_steps)
        yield counter(
            "reference:engine_step_seconds",
            "Seconds spent inside engine steps (scheduling, the model's forward pass, sampling).",
            engine.step_seconds,
        )
