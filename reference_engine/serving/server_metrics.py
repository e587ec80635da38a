"""Prometheus metrics of the reference server, named like vLLM's (`reference:` instead of `vllm:`)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from reference_engine.engine import EngineStartup
from reference_engine.serving.request_streams import RequestStreams

_LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.0075, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0,
                    2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0)
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


class ServerMetrics:
    def __init__(self, model_name: str) -> None:
        self.registry = CollectorRegistry()
        labels = ["model_name"]
        r = self.registry

        def gauge(name: str, doc: str) -> Gauge:
            return Gauge(name, doc, labels, registry=r)

        self.running = gauge("reference:num_requests_running", "Requests in the running batch.")
        self.waiting = gauge("reference:num_requests_waiting", "Requests waiting to be scheduled.")
        self.blocks_used = gauge("reference:kv_cache_blocks_used", "KV-cache blocks held by requests.")
        self.blocks_free = gauge("reference:kv_cache_blocks_free", "KV-cache blocks on the free list.")
        self.cache_usage = gauge("reference:kv_cache_usage_perc", "Fraction of KV-cache blocks in use (0-1).")
        self.graph_buckets = gauge("reference:cuda_graph_buckets",
                                   "Decode batch sizes captured as CUDA graphs.")
        self.graph_pool_bytes = gauge("reference:cuda_graph_pool_bytes", "Device memory held by CUDA graphs.")
        self.graph_warmup_seconds = gauge("reference:cuda_graph_warmup_seconds",
                                          "Start-up seconds of the eager step before capture "
                                          "(first use of kernels).")
        self.graph_capture_seconds = Gauge("reference:cuda_graph_capture_seconds",
                                           "Start-up seconds of each CUDA-graph bucket "
                                           "(its warm-up step and capture).",
                                           [*labels, "batch_size"], registry=r)
        self.prefix_queries = Counter("reference:prefix_cache_queries",
                                      "Prompt tokens looked up in the prefix cache.", labels, registry=r)
        self.prefix_hits = Counter("reference:prefix_cache_hits", "Prompt tokens found in the prefix cache.",
                                   labels, registry=r)
        self.aborted = Counter("reference:num_aborted_requests", "Requests abandoned before finishing "
                               "(client disconnect, stop string, shutdown).", labels, registry=r)
        self.preemptions = Counter("reference:num_preemptions", "Sequences preempted for lack of KV blocks.",
                                   labels, registry=r)
        self.engine_steps = Counter("reference:engine_steps", "Engine steps run.", labels, registry=r)
        self.engine_step_seconds = Counter("reference:engine_step_seconds",
                                           "Seconds spent inside engine steps "
                                           "(scheduling, the model's forward pass, sampling).", labels,
                                           registry=r)
        self.prompt_tokens = Counter("reference:prompt_tokens", "Prompt tokens received.", labels, registry=r)
        self.generation_tokens = Counter("reference:generation_tokens", "Tokens generated.", labels,
                                         registry=r)
        self.request_success = Counter("reference:request_success", "Requests finished, by reason.",
                                       [*labels, "finished_reason"], registry=r)
        self.ttft = Histogram("reference:time_to_first_token_seconds", "Arrival to first generated token.",
                              labels, buckets=_LATENCY_BUCKETS, registry=r)
        self.itl = Histogram("reference:inter_token_latency_seconds",
                             "Gap between consecutive generated tokens.", labels, buckets=_LATENCY_BUCKETS,
                             registry=r)
        self.e2e = Histogram("reference:e2e_request_latency_seconds", "Arrival to last generated token.",
                             labels, buckets=(*_LATENCY_BUCKETS, 160.0, 320.0), registry=r)
        self.model = model_name
        # The per-token series, bound once: `labels()` takes a lock and builds a key on every call (about 5 us
        # a token in all, at 256 streams).
        self.generated = self.generation_tokens.labels(model_name)
        self.first_token = self.ttft.labels(model_name)
        self.token_gap = self.itl.labels(model_name)
        self._seen_queries = 0
        self._seen_hits = 0
        self._seen_preemptions = 0
        self._seen_aborted = 0
        self._seen_steps = 0
        self._seen_step_seconds = 0.0

    def render(self, async_engine: RequestStreams, setup: EngineStartup) -> bytes:
        """Refresh the gauges from the engine's live state and its start-up report, then serialise
        everything."""
        stats = async_engine.stats()
        m = self.model
        self.running.labels(m).set(stats.running)
        self.waiting.labels(m).set(async_engine.num_waiting)
        self.blocks_used.labels(m).set(stats.kv_blocks_used)
        self.blocks_free.labels(m).set(stats.kv_blocks_free)
        self.cache_usage.labels(m).set(stats.kv_blocks_used / max(1, stats.kv_blocks_total))
        self.graph_buckets.labels(m).set(len(setup.cuda_graph_buckets))
        self.graph_pool_bytes.labels(m).set(setup.cuda_graph_pool_bytes)
        self.graph_warmup_seconds.labels(m).set(setup.cuda_graph_warmup_seconds)
        for size, seconds in setup.cuda_graph_capture_seconds.items():
            self.graph_capture_seconds.labels(m, str(size)).set(seconds)
        self.prefix_queries.labels(m).inc(stats.prefix_queried_tokens - self._seen_queries)
        self.prefix_hits.labels(m).inc(stats.prefix_hit_tokens - self._seen_hits)
        self.preemptions.labels(m).inc(stats.preemptions - self._seen_preemptions)
        self._seen_queries, self._seen_hits = stats.prefix_queried_tokens, stats.prefix_hit_tokens
        self._seen_preemptions = stats.preemptions
        self.aborted.labels(m).inc(async_engine.num_aborted - self._seen_aborted)
        self._seen_aborted = async_engine.num_aborted
        steps, step_seconds = async_engine.num_steps, async_engine.step_seconds
        self.engine_steps.labels(m).inc(steps - self._seen_steps)
        self.engine_step_seconds.labels(m).inc(step_seconds - self._seen_step_seconds)
        self._seen_steps, self._seen_step_seconds = steps, step_seconds
        return generate_latest(self.registry)
