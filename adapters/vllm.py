"""vLLM's OpenAI-compatible server (`vllm serve`).

What differs from plain OpenAI: `ignore_eos` and `min_tokens` force the output length;
`stream_options.continuous_usage_stats` puts cumulative usage on every chunk, so the tokens of each
event are known exactly (a chunk can carry several tokens, or a token whose text is empty because it ends
inside a multi-byte character); the chat stream opens with a role-only chunk. Every other chunk carries at
least one token, including the closing one whose text may be empty (an EOS that decodes to nothing).
Shapes: `vllm/entrypoints/openai/protocol.py`, `serving_completion.py`, `serving_chat.py`.
"""

from __future__ import annotations

import ast
import hashlib
import os
import re
import tempfile
from pathlib import Path
from typing import Any, ClassVar

from adapters.base import Adapter, ApiServersDefault, InfoMetrics, SettingFlags
from adapters.launch_spec import LaunchSpec, ModelSource, Variant, needs_gpu
from adapters.openai import OpenAIChatAdapter, OpenAICompletionsAdapter
from adapters.startup_log import clock, config_line, pattern

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


#: vLLM's start-up log lines (V1 engine; the GPU worker and the CPU worker word some of them differently).
#: `init engine` spans profiling, KV-cache allocation, torch.compile and graph capture, so it overlaps them.
VLLM_STARTUP = [
    pattern(
        "engine_config",
        r"Initializing a V1 LLM engine .*?\bdtype=(?:torch\.)?(?P<dtype>\w+)"
        r"(?:.*?\bdevice_config=(?P<device>\w+))?",
    ),
    pattern(
        "model_init",
        r"Initializing model took (?P<seconds>[\d.]+) seconds",
        phase="model_init",
        detail="building the model",
    ),
    pattern("checkpoint_size", r"Checkpoint size: (?P<gib>[\d.]+) GiB", memory="weights", weak=True),
    pattern(
        "weights_loaded",
        r"Loading weights took (?P<seconds>[\d.]+) seconds",
        phase="weights",
        detail="loading weights",
    ),
    pattern(
        "model_loaded",
        r"Model loading took (?P<gib>[\d.]+) GiB(?: memory)? and (?P<seconds>[\d.]+) "
        r"seconds",
        phase="model_load",
        memory="weights",
        detail="model built and weights loaded",
    ),
    pattern(
        "torch_compile",
        r"torch\.compile took (?P<seconds>[\d.]+) s in total",
        phase="compile",
        detail="torch.compile",
    ),
    pattern(
        "profile_run",
        r"Initial profiling/warmup run took (?P<seconds>[\d.]+) s",
        phase="profile",
        detail="profiling run",
    ),
    pattern("kv_cache_memory", r"Available KV cache memory: (?P<gib>[\d.]+) GiB", memory="kv_cache"),
    pattern("kv_cache_set", r"set \((?P<gib>[\d.]+)/[\d.]+\) GiB for KV cache", memory="kv_cache"),
    pattern("kv_cache_tokens", r"(?:GPU|CPU) KV cache size: (?P<tokens>[\d,]+) tokens", memory="kv_tokens"),
    pattern(
        "graphs_captured",
        r"Graph capturing finished in (?P<seconds>[\d.]+) secs?, took (?P<gib>[\d.]+) "
        r"GiB",
        phase="cuda_graphs",
        memory="graph_pool",
        detail="CUDA-graph capture",
    ),
    pattern(
        "engine_ready",
        r"init engine \(profile, create kv cache, warmup model\) took (?P<seconds>[\d.]+) s",
        phase="init_engine",
        detail="profile, KV cache, warm-up",
    ),
    pattern("server_ready", r"Starting vLLM (?:API )?server on|Application startup complete", ready=True),
]
#: the API server's arguments that differ from vLLM's defaults, as common setting names (its start-up line
#: `non-default args: {'model_tag': ..., 'max_num_seqs': 8, 'api_server_count': 2, ...}`: a Python dict)
VLLM_ARG_NAMES = {
    "api_server_count": "api_servers",
    "data_parallel_size": "data_parallel",
    "max_num_seqs": "max_num_seqs",
    "max_num_batched_tokens": "max_batched_tokens",
    "enable_chunked_prefill": "chunked_prefill",
    "speculative_config": "speculative",
    "kv_cache_dtype": "kv_cache_dtype",
    "tensor_parallel_size": "tensor_parallel",
    "pipeline_parallel_size": "pipeline_parallel",
    "gpu_memory_utilization": "gpu_memory_utilization",
    "quantization": "quantization",
    "dtype": "dtype",
    "max_model_len": "max_model_len",
    "enable_prefix_caching": "prefix_caching",
    "enforce_eager": "enforce_eager",
    "block_size": "block_size",
}


def non_default_args(line: str) -> dict[str, str]:
    """The settings of vLLM's `non-default args: {...}` line, as strings under common names (a speculative
    config as its method, else `on`); {} where the dict cannot be read."""
    start = line.find("{", line.find("non-default args:"))
    try:
        args = ast.literal_eval(line[start:]) if start >= 0 else None
    except (ValueError, SyntaxError):
        return {}
    out: dict[str, str] = {}
    for name, value in (args or {}).items() if isinstance(args, dict) else ():
        common = VLLM_ARG_NAMES.get(name)
        if common == "speculative" and isinstance(value, dict):
            value = value.get("method") or ("draft" if value.get("model") else "on")
        if common is not None and value is not None:
            out[common] = str(value)
    return out


_CHUNKED = re.compile(r"Chunked prefill is enabled with max_num_batched_tokens=(\d+)")


def chunked_prefill_line(line: str) -> dict[str, str]:
    """vLLM's scheduler line `Chunked prefill is enabled with max_num_batched_tokens=8192.`: both settings."""
    match = _CHUNKED.search(line)
    return {"chunked_prefill": "True", "max_batched_tokens": match.group(1)} if match else {}


#: vLLM's configuration lines: the API server's non-default arguments and its scheduler's chunked-prefill
#: line, then the engine's (the engine's, the
#: settings as resolved, read last, so they win): `... with config: model='...', speculative_config=None,
#: tokenizer='...', dtype=torch.float32, max_seq_len=1024, ..., tensor_parallel_size=1,
#: pipeline_parallel_size=1, data_parallel_size=1, ..., quantization=None, enforce_eager=True, ...,
#: kv_cache_dtype=auto, ..., enable_prefix_caching=True, enable_chunked_prefill=True, ...`
VLLM_CONFIG = [
    config_line(r"non-default args: \{", read=non_default_args),
    config_line(_CHUNKED.pattern, read=chunked_prefill_line),
    config_line(
        r"Initializing a V1 LLM engine .*with config:",
        tokenizer=r"\btokenizer='([^']*)'",
        dtype=r"\bdtype=(?:torch\.)?(\w+)",
        max_model_len=r"\bmax_seq_len=(\d+)",
        quantization=r"\bquantization=(\w+)",
        enforce_eager=r"\benforce_eager=(True|False)",
        prefix_caching=r"\benable_prefix_caching=(True|False)",
        chunked_prefill=r"\benable_chunked_prefill=(True|False)",
        speculative=r"\bspeculative_config=(?:SpeculativeConfig\((?:method=)?'?)?(\w+)",
        kv_cache_dtype=r"\bkv_cache_dtype=(\w+)",
        tensor_parallel=r"\btensor_parallel_size=(\d+)",
        pipeline_parallel=r"\bpipeline_parallel_size=(\d+)",
        data_parallel=r"\bdata_parallel_size=(\d+)",
    ),
]
#: settings in the labels of vLLM's `*_info` gauges on `/metrics` (`vllm:cache_config_info{block_size="16",
#: cache_dtype="auto",enable_prefix_caching="True",gpu_memory_utilization="0.9",...} 1.0`), common names
VLLM_INFO_METRICS: InfoMetrics = {
    "vllm:cache_config_info": {
        "block_size": "block_size",
        "cache_dtype": "kv_cache_dtype",
        "enable_prefix_caching": "prefix_caching",
        "gpu_memory_utilization": "gpu_memory_utilization",
    }
}
#: vLLM's defaults that have not changed across its versions, for a server we launched (an endpoint's flags
#: are not known). Not here, because vLLM's own default depends on its version, the GPU or the checkpoint:
#: max_num_seqs and max_num_batched_tokens (by GPU memory and usage context), chunked prefill, the GPU
#: memory fraction, quantisation (a checkpoint's quantization_config). The API-server count defaults to the
#: data-parallel size (`vllm/entrypoints/cli/serve.py`), 1 unless --data-parallel-size says otherwise.
VLLM_DEFAULTS = {
    "kv_cache_dtype": "auto",
    "speculative": "none",
    "tensor_parallel": 1,
    "pipeline_parallel": 1,
}
#: vLLM's flags for the audited settings (short aliases as its argument parser has them)
VLLM_SETTING_FLAGS: SettingFlags = {
    "api_servers": ("--api-server-count", "-asc"),
    "data_parallel": ("--data-parallel-size", "-dp"),
    "max_num_seqs": ("--max-num-seqs",),
    "max_batched_tokens": ("--max-num-batched-tokens",),
    "kv_cache_dtype": ("--kv-cache-dtype",),
    "tensor_parallel": ("--tensor-parallel-size", "-tp"),
    "pipeline_parallel": ("--pipeline-parallel-size", "-pp"),
    "gpu_memory_utilization": ("--gpu-memory-utilization",),
    "speculative": ("--speculative-config",),
    "block_size": ("--block-size",),
}
#: `(APIServer pid=1) INFO 05-12 10:00:01 [file.py:12] ...`: no year, local time
VLLM_CLOCK = clock(
    r"^(?:\(\w+ pid=\d+\)\s*)?(?:INFO|WARNING|DEBUG|ERROR)\s+(\d\d-\d\d \d\d:\d\d:\d\d)",
    "%m-%d %H:%M:%S",
    year=False,
)


VLLM_IMAGE = "vllm/vllm-openai:latest"  # pin a tag for results you keep
#: what vLLM's CPU build needs on a machine without a GPU (docs/vllm_cpu.md): float32 (bf16 falls back to
#: slow kernels on AVX2), eager, and a fixed KV cache (its default asks for 92% of a NUMA node's memory)
VLLM_CPU_FLAGS = ["--kv-cache-memory-bytes", "1G"]


def vllm_flags(model: ModelSource, variant: Variant, gpu: bool) -> tuple[list[str], list[str]]:
    """vLLM's serve flags for a variant (and notes on what the machine changed)."""
    flags, notes = [], []
    if variant.graphs is False or not gpu:
        flags.append("--enforce-eager")
        if gpu is False and variant.graphs:
            notes.append("no GPU: vLLM's CPU build runs eager whatever the variant")
    if variant.graph_sizes and gpu:
        flags += ["--cudagraph-capture-sizes", *map(str, variant.graph_sizes)]
    if variant.block_size:
        flags += ["--block-size", str(variant.block_size)]
    if variant.max_num_seqs:
        flags += ["--max-num-seqs", str(variant.max_num_seqs)]
    max_len = model.max_model_len or (None if gpu else 1024)
    if max_len:
        flags += ["--max-model-len", str(max_len)]
    dtype = model.dtype if model.dtype != "auto" else (None if gpu else "float32")
    if dtype:
        flags += ["--dtype", dtype]
    if not gpu:
        flags += VLLM_CPU_FLAGS
    return flags, notes


def vllm_env(workdir: Path) -> tuple[dict[str, str], list[str]]:
    """Every cache and temporary file of vLLM inside the launch's folder; no usage reporting. vLLM binds
    ZeroMQ unix sockets under TMPDIR, whose paths may not pass 107 bytes: a deep run directory gets a short
    TMPDIR of its own under the system's, which is removed after the stop (returned as scratch)."""
    env, scratch = {}, []
    for var, sub in (
        ("VLLM_CACHE_ROOT", "vllm-cache"),
        ("TORCHINDUCTOR_CACHE_DIR", "inductor"),
        ("XDG_CACHE_HOME", "xdg-cache"),
        ("TMPDIR", "tmp"),
    ):
        env[var] = str(workdir / sub)
    if len(str(Path(env["TMPDIR"]).resolve())) > 60:  # as vLLM sees it: a relative run directory is resolved
        digest = hashlib.sha1(str(workdir.resolve()).encode()).hexdigest()[:12]
        env["TMPDIR"] = str(Path(tempfile.gettempdir()) / f"llm-compare-vllm-{digest}")
        scratch.append(env["TMPDIR"])
    return env, scratch


class _VLLMLaunch(Adapter):
    """How to start vLLM, and what its launch and `/metrics` declare."""

    server_family = "vllm"
    declared_defaults = VLLM_DEFAULTS
    setting_flags = VLLM_SETTING_FLAGS
    info_metrics = VLLM_INFO_METRICS
    executable_option: ClassVar[str | None] = "vllm_bin"
    executable_hint = " (--vllm-bin PATH or LLM_COMPARE_VLLM)"
    vllm_style_flags = True
    api_servers_default: ClassVar[ApiServersDefault | None] = "per_data_parallel_rank"
    serving_matchable = True

    @classmethod
    def serving_defaults(cls, gpu: bool) -> dict[str, int]:
        """One HTTP front end (one per data-parallel rank); its batch limits change with its version and the
        GPU's memory, so they are not fixed."""
        return {"api_servers": 1}

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
        flags, notes = vllm_flags(model, variant, gpu)
        served = ["--served-model-name", model.served_name]
        exe = executable or os.environ.get("LLM_COMPARE_VLLM") or "vllm"
        env = {"VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1"}
        if model.local:
            env["HF_HUB_OFFLINE"] = "1"
        process_env, scratch = vllm_env(workdir)
        return LaunchSpec(
            cls.name,
            [exe, "serve", model.model, "--host", "127.0.0.1", "--port", str(port), *served, *flags],
            VLLM_IMAGE,
            # the image's entrypoint is vLLM's OpenAI server; --model works for `vllm serve` and the older
            # `python -m vllm.entrypoints.openai.api_server` alike
            ["--model", model.in_container(), *served, "--host", "0.0.0.0", "--port", "8000", *flags],
            port,
            health_path=cls.health_path,
            env=env,
            process_env=process_env,
            dirs=list(process_env.values()),
            scratch=scratch,
            gpus=gpu,
            shm_size="16g",
            volumes=model.volumes(),
            container_error=None if gpu else needs_gpu("vllm"),
            notes=notes,
        )


class _VLLMMixin(OpenAICompletionsAdapter):
    """vLLM's routes, metric names and start-up log; its token rule for chunks without token ids."""

    health_path = "/health"
    info_path = "/v1/models"
    metric_names = VLLM_METRICS
    startup_patterns = VLLM_STARTUP
    config_lines = VLLM_CONFIG
    log_clock = VLLM_CLOCK

    def estimate_tokens(self, text: str | None, role_only: bool, finish: str | None) -> int:
        return 0 if role_only or text is None else 1


class VLLMCompletionsAdapter(_VLLMLaunch, _VLLMMixin, OpenAICompletionsAdapter):
    name = "vllm"

    def __init__(
        self,
        model: str | None = None,
        *,
        continuous_usage: bool = True,
        force_output_length: bool = True,
        **options: Any,
    ) -> None:
        super().__init__(
            model, continuous_usage=continuous_usage, force_output_length=force_output_length, **options
        )


class VLLMChatAdapter(_VLLMLaunch, _VLLMMixin, OpenAIChatAdapter):
    name = "vllm-chat"

    def __init__(
        self,
        model: str | None = None,
        *,
        continuous_usage: bool = True,
        force_output_length: bool = True,
        **options: Any,
    ) -> None:
        super().__init__(
            model, continuous_usage=continuous_usage, force_output_length=force_output_length, **options
        )
