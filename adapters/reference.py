"""Our reference engine's server. It speaks the OpenAI protocol byte-compatible with vLLM (completions by
default, chat as `reference-chat`) and the TGI protocol byte-compatible with TGI's router (`reference-tgi`),
so it is read exactly as those are. Its Prometheus metrics are vLLM's under the `reference:` prefix, plus a
few only it exports (KV blocks, CUDA-graph buckets, aborted requests).
"""

from __future__ import annotations

from adapters.startup_log import patterns
from adapters.tgi import TGIAdapter
from adapters.vllm import VLLM_METRICS, VLLMChatAdapter, VLLMCompletionsAdapter

REFERENCE_METRICS = {name.replace("vllm:", "reference:", 1): common for name, common in VLLM_METRICS.items()}
REFERENCE_METRICS.update({
    "reference:kv_cache_blocks_used": "kv_blocks_used",
    "reference:kv_cache_blocks_free": "kv_blocks_free",
    "reference:cuda_graph_buckets": "cuda_graph_buckets",
    "reference:cuda_graph_pool_bytes": "cuda_graph_pool_bytes",
    "reference:num_aborted_requests_total": "requests_aborted_total",
})


#: the server's start-up lines (reference_engine/engine.py and server.py write them)
REFERENCE_STARTUP = patterns(
    ("tokenizer_loaded", r"resolved, tokenizer loaded in (?P<seconds>[\d.]+) s"),
    ("weights_loaded", r"weights loaded: (?P<gib>[\d.]+) GiB, (?P<dtype>\S+) on (?P<device>\S+) in (?P<seconds>[\d.]+) s"),
    ("kv_cache_allocated", r"KV cache allocated: (?P<blocks>\d+) blocks of (?P<block_size>\d+) tokens, "
                           r"(?P<gib>[\d.]+) GiB in (?P<seconds>[\d.]+) s"),
    ("graphs_captured", r"CUDA graphs captured: (?P<buckets>\d+) buckets (?P<sizes>\[[\d, ]*\]), pool "
                        r"(?P<gib>[\d.]+) GiB in (?P<seconds>[\d.]+) s"),
    ("server_ready", r"server ready at (?P<url>\S+) in (?P<seconds>[\d.]+) s"),
)


class ReferenceAdapter(VLLMCompletionsAdapter):
    name = "reference"
    metric_names = REFERENCE_METRICS
    startup_patterns = REFERENCE_STARTUP


class ReferenceChatAdapter(VLLMChatAdapter):
    name = "reference-chat"
    metric_names = REFERENCE_METRICS
    startup_patterns = REFERENCE_STARTUP


class ReferenceTGIAdapter(TGIAdapter):
    name = "reference-tgi"
    metric_names = REFERENCE_METRICS
    startup_patterns = REFERENCE_STARTUP
