"""Our reference engine's server. It speaks the OpenAI protocol byte-compatible with vLLM (completions by
default, chat as `reference-chat`) and the TGI protocol byte-compatible with TGI's router (`reference-tgi`),
so it is read exactly as those are. Its Prometheus metrics are vLLM's under the `reference:` prefix, plus a
few only it exports (KV blocks, CUDA-graph buckets, aborted requests).
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import ClassVar

from adapters.base import Adapter, ApiServersDefault, InfoMetrics, SettingFlags
from adapters.launch_spec import LaunchSpec, ModelSource, Variant
from adapters.startup_log import clock, config_line, pattern
from adapters.tgi import TGIAdapter
from adapters.vllm import VLLM_METRICS, VLLMChatAdapter, VLLMCompletionsAdapter

REFERENCE_METRICS = {name.replace("vllm:", "reference:", 1): common for name, common in VLLM_METRICS.items()}
REFERENCE_METRICS.update(
    {
        "reference:kv_cache_blocks_used": "kv_blocks_used",
        "reference:kv_cache_blocks_free": "kv_blocks_free",
        "reference:cuda_graph_buckets": "cuda_graph_buckets",
        "reference:cuda_graph_pool_bytes": "cuda_graph_pool_bytes",
        "reference:num_aborted_requests_total": "requests_aborted_total",
    }
)


#: the server's start-up lines (reference_engine/engine.py and serving/server.py write them), Python logging's
#: clock
REFERENCE_STARTUP = [
    pattern(
        "tokenizer_loaded",
        r"(?:resolved, )?tokenizer loaded in (?P<seconds>[\d.]+) s",
        phase="tokenizer",
        detail="tokenizer loaded",
    ),
    pattern(
        "weights_loaded",
        r"weights loaded: (?P<gib>[\d.]+) GiB, (?:torch\.)?(?P<dtype>\w+) on "
        r"(?P<device>[^\s,]+),? in (?P<seconds>[\d.]+) s",
        phase="weights",
        memory="weights",
    ),
    pattern(
        "kv_cache_allocated",
        r"KV cache allocated: (?P<blocks>\d+) blocks of (?P<block_size>\d+) "
        r"tokens, (?P<gib>[\d.]+) GiB in (?P<seconds>[\d.]+) s",
        phase="kv_cache",
        memory="kv_cache",
    ),
    # decode graphs, then the pieces of steps with prompt tokens: both count as graph capture, their pools add
    pattern(
        "graphs_captured",
        r"CUDA graphs captured: (?P<buckets>\d+) buckets (?P<sizes>\[[\d, ]*\]), pool "
        r"(?P<gib>[\d.]+) GiB in (?P<seconds>[\d.]+) s",
        phase="cuda_graphs",
        memory="graph_pool",
        repeat="sum",
    ),
    pattern(
        "mixed_graphs_captured",
        r"CUDA graphs for steps with prompt tokens: (?P<pieces>\d+) pieces over "
        r"token counts (?P<sizes>\[[\d, ]*\]), pool (?P<gib>[\d.]+) GiB in (?P<seconds>[\d.]+) s",
        phase="cuda_graphs",
        memory="graph_pool",
        repeat="sum",
        detail="pieces between attention calls, for steps with prompt tokens",
    ),
    pattern(
        "warmed_up",
        r"eager steps warmed up: (?P<steps>\d+) step shapes in (?P<seconds>[\d.]+) s",
        phase="compile",
        detail="every eager step shape run once (kernel compiles, allocator growth)",
    ),
    pattern("server_ready", r"server ready at (?P<url>\S+) in (?P<seconds>[\d.]+) s", ready=True),
]
REFERENCE_CLOCK = clock(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3})", "%Y-%m-%d %H:%M:%S,%f")


#: our images (docker/reference-cpu.Dockerfile, docker/reference-cuda.Dockerfile); their entrypoint is the
#: server listening on 0.0.0.0:8000, so the arguments start at --model
REFERENCE_IMAGES = {"cpu": "llm-compare/reference-cpu:latest", "cuda": "llm-compare/reference-cuda:latest"}


def reference_flags(model: ModelSource, variant: Variant) -> list[str]:
    """Our server's flags for a variant; they are named as vLLM's where they mean the same."""
    flags = []
    if variant.graphs is False:
        flags.append("--enforce-eager")
    if variant.graph_sizes:
        flags += ["--cudagraph-capture-sizes", *map(str, variant.graph_sizes)]
    if variant.block_size:
        flags += ["--block-size", str(variant.block_size)]
    if variant.max_num_seqs:
        flags += ["--max-num-seqs", str(variant.max_num_seqs)]
    if model.max_model_len:
        flags += ["--max-model-len", str(model.max_model_len)]
    if model.dtype != "auto":
        flags += ["--dtype", model.dtype]
    return flags


#: our engine's defaults, for a log from before it printed its configuration, and what it has no option
#: for (reference_engine/config.py: EngineConfig; it has no quantised kernels, and its loader drops a
#: checkpoint's quantization_config; its scheduler always splits a prompt over steps by the token budget;
#: no speculative decoding, no parallelism, a KV cache in the model's dtype)
REFERENCE_DEFAULTS = {
    "prefix_caching": True,
    "quantization": "none",
    "chunked_prefill": True,
    "speculative": "none",
    "kv_cache_dtype": "auto",
    "tensor_parallel": 1,
    "pipeline_parallel": 1,
}
#: `... INFO reference_engine: engine config: model=..., dtype=bfloat16, max_model_len=4096,
#: max_num_seqs=256, max_num_batched_tokens=8192, ..., block_size=16, enable_prefix_caching=True,
#: enforce_eager=False, quantization=none, device=cuda`; with several front ends,
#: `... INFO reference_engine.server: 4 front-end processes share the port` (one says nothing)
REFERENCE_CONFIG = [
    config_line(
        r"reference_engine: engine config:",
        dtype=r"\bdtype=(\w+)",
        max_model_len=r"\bmax_model_len=(\d+)",
        max_num_seqs=r"\bmax_num_seqs=(\d+)",
        max_batched_tokens=r"\bmax_num_batched_tokens=(\d+)",
        block_size=r"\bblock_size=(\d+)",
        quantization=r"\bquantization=(\w+)",
        enforce_eager=r"\benforce_eager=(True|False)",
        prefix_caching=r"\benable_prefix_caching=(True|False)",
    ),
    config_line(r"\d+ front-end processes share the port", api_servers=r"(\d+) front-end processes"),
]
#: our server's flags for the audited settings (named as vLLM's)
REFERENCE_SETTING_FLAGS: SettingFlags = {
    "api_servers": ("--api-server-count",),
    "max_num_seqs": ("--max-num-seqs",),
    "max_batched_tokens": ("--max-num-batched-tokens",),
    "gpu_memory_utilization": ("--gpu-memory-utilization",),
    "block_size": ("--block-size",),
}


def reference_serving_defaults(gpu: bool) -> dict[str, int]:
    """Our server's documented front-end count and batch limits on this machine, unasked (its front ends:
    4 with an NVIDIA GPU and 16 or more cores, else 1)."""
    from reference_engine.config import DEFAULT_MAX_NUM_BATCHED_TOKENS, DEFAULT_MAX_NUM_SEQS
    from reference_engine.serving.options import default_api_server_count

    kind = "cuda" if gpu else "cpu"
    return {
        "api_servers": default_api_server_count(kind, True),
        "max_num_seqs": DEFAULT_MAX_NUM_SEQS[kind],
        "max_batched_tokens": DEFAULT_MAX_NUM_BATCHED_TOKENS[kind],
    }


#: a named Docker volume for the CUDA image's /cache, where Triton keeps the kernels it compiled: a container
#: started on a host that ran one before loads them instead of compiling (docker/reference-cuda.Dockerfile)
REFERENCE_CACHE_VOLUME = "llm-compare-reference-cache"


class _ReferenceLaunch(Adapter):
    """How to start our server, and what its launch and log declare."""

    server_family = "reference"
    declared_defaults = REFERENCE_DEFAULTS
    setting_flags = REFERENCE_SETTING_FLAGS
    info_metrics: ClassVar[InfoMetrics] = {}  # not vLLM's gauges
    config_lines = REFERENCE_CONFIG
    # every capability set here, as the vLLM launch mixin after this one in the MRO has its own values
    executable_option: ClassVar[str | None] = None  # the Python running the comparison, not an option
    executable_hint: ClassVar[str] = ""
    runs_from_checkout = True
    cpu_image_built_here = True
    variant_by_device = True
    eager_on_cpu = True  # whatever the variant (the selection says so)
    vllm_style_flags = True
    api_servers_default: ClassVar[ApiServersDefault | None] = "one_unless_logged"
    gpu_memory_default = 0.9
    serving_matchable = True

    @classmethod
    def serving_defaults(cls, gpu: bool) -> dict[str, int]:
        return reference_serving_defaults(gpu)

    @classmethod
    def launch_spec(
        cls,
        model: ModelSource,
        variant: Variant,
        port: int,
        *,
        workdir: Path,
        gpu: bool,
        executable: str | None = None,
    ) -> LaunchSpec:
        flags = [
            "--served-model-name",
            model.served_name,
            "--shutdown-timeout",
            "5",
            *reference_flags(model, variant),
        ]
        cache = {REFERENCE_CACHE_VOLUME: {"bind": "/cache", "mode": "rw"}} if gpu else {}
        return LaunchSpec(
            cls.name,
            [
                executable or sys.executable,
                "-m",
                "reference_engine.server",
                "--model",
                model.model,
                "--host",
                "127.0.0.1",
                "--port",
                str(port),
                *flags,
            ],
            REFERENCE_IMAGES["cuda" if gpu else "cpu"],
            ["--model", model.in_container(), *flags],
            port,
            health_path=cls.health_path,
            env={"HF_HUB_OFFLINE": "1"} if model.local else {},
            gpus=gpu,
            shm_size="16g" if gpu else "1g",
            volumes={**model.volumes(), **cache},
        )


class ReferenceAdapter(_ReferenceLaunch, VLLMCompletionsAdapter):
    name = "reference"
    metric_names = REFERENCE_METRICS
    startup_patterns = REFERENCE_STARTUP
    log_clock = REFERENCE_CLOCK


class ReferenceChatAdapter(_ReferenceLaunch, VLLMChatAdapter):
    name = "reference-chat"
    metric_names = REFERENCE_METRICS
    startup_patterns = REFERENCE_STARTUP
    log_clock = REFERENCE_CLOCK


class ReferenceTGIAdapter(_ReferenceLaunch, TGIAdapter):
    name = "reference-tgi"
    metric_names = REFERENCE_METRICS
    startup_patterns = REFERENCE_STARTUP
    log_clock = REFERENCE_CLOCK
