"""vLLM's OpenAI-compatible server (`vllm serve`).

What differs from plain OpenAI: `ignore_eos` and `min_tokens` force the output length;
`stream_options.continuous_usage_stats` puts cumulative usage on every chunk, so the tokens of each
event are known exactly (a chunk can carry several tokens, or a token whose text is empty because it ends
inside a multi-byte character); the chat stream opens with a role-only chunk. Every other chunk carries at
least one token, including the closing one whose text may be empty (an EOS that decodes to nothing).
Shapes: `vllm/entrypoints/openai/protocol.py`, `serving_completion.py`, `serving_chat.py`.
"""

from __future__ import annotations

from typing import Any

from adapters.openai import OpenAIChatAdapter, OpenAICompletionsAdapter
from adapters.startup_log import patterns

#: vLLM's Prometheus metric names (older and newer spellings) -> common names
VLLM_METRICS = {
    "vllm:num_requests_running": "requests_running",
    "vllm:num_requests_waiting": "requests_waiting",
    "vllm:kv_cache_usage_perc": "kv_cache_usage",
    "vllm:gpu_cache_usage_perc": "kv_cache_usage",
    "vllm:prompt_tokens_total": "prompt_tokens_total",
    "vllm:generation_tokens_total": "generation_tokens_total",
    "vllm:num_preemptions_total": "preemptions_total",
    "vllm:prefix_cache_queries_total": "prefix_cache_queries_total",
    "vllm:prefix_cache_hits_total": "prefix_cache_hits_total",
    "vllm:request_success_total": "requests_finished_total",
    "vllm:time_to_first_token_seconds": "ttft_seconds",
    "vllm:inter_token_latency_seconds": "itl_seconds",
    "vllm:time_per_output_token_seconds": "tpot_seconds",
    "vllm:e2e_request_latency_seconds": "e2e_seconds",
    "vllm:request_queue_time_seconds": "queue_seconds",
}


#: vLLM's start-up log lines (V1 engine; the GPU worker and the CPU worker word some of them differently)
VLLM_STARTUP = patterns(
    ("weights_loaded", r"Loading weights took (?P<seconds>[\d.]+) seconds"),
    ("model_loaded", r"Model loading took (?P<gib>[\d.]+) GiB(?: memory)? and (?P<seconds>[\d.]+) seconds"),
    ("torch_compile", r"torch\.compile took (?P<seconds>[\d.]+) s in total"),
    ("profile_run", r"Initial profiling/warmup run took (?P<seconds>[\d.]+) s"),
    ("kv_cache_memory", r"Available KV cache memory: (?P<gib>[\d.]+) GiB"),
    ("kv_cache_tokens", r"(?:GPU|CPU) KV cache size: (?P<tokens>[\d,]+) tokens"),
    ("graphs_captured", r"Graph capturing finished in (?P<seconds>[\d.]+) secs?, took (?P<gib>[\d.]+) GiB"),
    ("engine_ready", r"init engine \(profile, create kv cache, warmup model\) took (?P<seconds>[\d.]+) s"),
    ("server_ready", r"Application startup complete"),
)


class _VLLMMixin:
    health_path = "/health"
    info_path = "/v1/models"
    metric_names = VLLM_METRICS
    startup_patterns = VLLM_STARTUP

    def estimate_tokens(self, text: str | None, role_only: bool, finish: str | None) -> int:
        return 0 if role_only or text is None else 1


class VLLMCompletionsAdapter(_VLLMMixin, OpenAICompletionsAdapter):
    name = "vllm"

    def __init__(self, model: str | None = None, *, continuous_usage: bool = True,
                 force_output_length: bool = True, **options: Any) -> None:
        super().__init__(model, continuous_usage=continuous_usage, force_output_length=force_output_length,
                         **options)


class VLLMChatAdapter(_VLLMMixin, OpenAIChatAdapter):
    name = "vllm-chat"

    def __init__(self, model: str | None = None, *, continuous_usage: bool = True,
                 force_output_length: bool = True, **options: Any) -> None:
        super().__init__(model, continuous_usage=continuous_usage, force_output_length=force_output_length,
                         **options)
