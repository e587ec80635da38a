"""Building an engine, phase by phase: device and dtype, the model's weights, the KV cache sized to the
memory left, CUDA graphs, a warm-up. Each phase is timed into `EngineStartup` and logged as one line, which
is what a comparison reads as this backend's set-up cost (`adapters/reference.py` parses the lines).

`Engine.__init__` calls `build_engine` and then only wires the serving parts (block manager, scheduler,
sampler) around what it returns, so the engine's own file reads as its loop.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass

import torch

from reference_engine.config import EngineConfig
from reference_engine.engine_info import EngineStartup
from reference_engine.loader import resolve_dtype, resolve_model
from reference_engine.model_config import ModelSpec
from reference_engine.model_runner import ModelRunner

log = logging.getLogger("reference_engine")

DEFAULT_MAX_MODEL_LEN = 4096
DEFAULT_CPU_KV_BUDGET = 1024**3


@dataclass
class BuiltEngine:
    """What the start-up made: the model on its device with its KV cache (and graphs), and the report of
    how long each phase took."""

    config: EngineConfig  # as adjusted for the device
    device: torch.device
    dtype: torch.dtype
    spec: ModelSpec
    max_model_len: int
    tokenizer_source: str | None  # loaded on first use: an engine core serves token ids only
    runner: ModelRunner
    num_kv_blocks: int
    setup: EngineStartup


def build_engine(config: EngineConfig) -> BuiltEngine:
    """Run every start-up phase of an engine for `config`; raises ValueError for a config it cannot serve."""
    setup = EngineStartup()
    t0 = time.perf_counter()
    device = resolve_device(config.device)
    config = config.for_device(device.type)
    dtype = resolve_dtype(config.dtype, device)
    resolved = resolve_model(config.model)
    spec = resolved.spec
    max_model_len = model_len(config, spec)
    checkpoint = str(resolved.checkpoint) if resolved.checkpoint is not None else None
    t1 = time.perf_counter()
    _phase(setup, "resolve_model", t1 - t0, f"model {config.model} resolved")
    # what a comparison needs to check that backends were set up alike (adapters/reference.py reads it)
    eager = config.enforce_eager or device.type != "cuda"
    log.info(
        "engine config: model=%s, dtype=%s, max_model_len=%d, max_num_seqs=%d, "
        "max_num_batched_tokens=%d, mixed_prefill_tokens=%s, block_size=%d, "
        "enable_prefix_caching=%s, enforce_eager=%s, quantization=none, device=%s",
        config.model,
        str(dtype).removeprefix("torch."),
        max_model_len,
        config.max_num_seqs,
        config.max_num_batched_tokens,
        config.mixed_prefill_tokens or f"shared ({config.mixed_prefill_share})",
        config.block_size,
        config.enable_prefix_caching,
        eager,
        device,
    )
    torch.manual_seed(config.seed)
    runner = ModelRunner(
        resolved,
        device,
        dtype,
        max_model_len,
        config.block_size,
        config.seed,
        config.kernels,
        config.cpu_linear,
    )
    setup.weights_bytes = runner.weights_bytes
    t2 = time.perf_counter()
    _phase(
        setup,
        "load_weights",
        t2 - t1,
        f"weights loaded: {setup.weights_bytes / 2**30:.3f} GiB, {dtype} on {device}",
    )
    num_blocks = kv_blocks(config, runner, device, max_model_len)
    runner.allocate_kv_cache(num_blocks)
    setup.num_kv_blocks = num_blocks
    setup.kv_cache_bytes = num_blocks * runner.kv_bytes_per_block()
    t3 = time.perf_counter()
    _phase(
        setup,
        "allocate_kv_cache",
        t3 - t2,
        f"KV cache allocated: {num_blocks} blocks of {config.block_size} tokens, "
        f"{setup.kv_cache_bytes / 2**30:.3f} GiB",
    )
    if device.type == "cuda" and not config.enforce_eager:
        _capture_graphs(config, runner, setup)
    if config.warm_up if config.warm_up is not None else device.type == "cuda":
        t4 = time.perf_counter()
        steps = runner.warm_up(config.max_num_seqs, config.max_num_batched_tokens)
        _phase(setup, "warm_up", time.perf_counter() - t4, f"eager steps warmed up: {steps} step shapes")
    setup.device, setup.dtype = str(device), str(dtype).removeprefix("torch.")
    built = BuiltEngine(
        config, device, dtype, spec, max_model_len, config.tokenizer or checkpoint, runner, num_blocks, setup
    )
    setup.phases["total"] = time.perf_counter() - t0
    return built


def _capture_graphs(config: EngineConfig, runner: ModelRunner, setup: EngineStartup) -> None:
    """Decode graphs per batch-size bucket, then the pieces of steps that carry prompt tokens."""
    report = runner.capture_cuda_graphs(
        config.max_num_seqs, config.cuda_graph_batch_sizes, config.cuda_graph_context_bounds
    )
    setup.cuda_graph_buckets = sorted(report.seconds_per_bucket)
    setup.cuda_graph_warmup_seconds = report.warmup_seconds
    setup.cuda_graph_capture_seconds = dict(report.seconds_per_bucket)
    setup.cuda_graph_pool_bytes = report.pool_bytes
    _phase(
        setup,
        "capture_cuda_graphs",
        report.total_seconds,
        f"CUDA graphs captured: {len(report.seconds_per_bucket)} buckets "
        f"{setup.cuda_graph_buckets}, pool {report.pool_bytes / 2**30:.3f} GiB",
    )
    log.info(
        "CUDA graphs: first-use warm-up %.3f s, then per bucket %s; context bounds %s",
        report.warmup_seconds,
        ", ".join(f"{size}: {sec:.3f} s" for size, sec in report.seconds_per_bucket.items()),
        report.context_bounds,
    )
    mixed = runner.capture_mixed_graphs(config.max_num_batched_tokens, config.mixed_cuda_graph_sizes)
    setup.mixed_graph_sizes, setup.mixed_graph_pool_bytes = mixed.sizes, mixed.pool_bytes
    _phase(
        setup,
        "capture_mixed_graphs",
        mixed.seconds,
        f"CUDA graphs for steps with prompt tokens: {mixed.graphs} pieces over token counts "
        f"{mixed.sizes}, pool {mixed.pool_bytes / 2**30:.3f} GiB",
    )


def _phase(setup: EngineStartup, name: str, seconds: float, message: str) -> None:
    setup.phases[name] = seconds
    log.info("%s in %.3f s", message, seconds)


def model_len(config: EngineConfig, spec: ModelSpec) -> int:
    """The longest sequence served: the config's, within what the model's positions (and, unimplemented,
    its sliding window) allow; by default at most `DEFAULT_MAX_MODEL_LEN`."""
    limit = spec.max_position_embeddings
    if spec.sliding_window:
        limit = min(limit, spec.sliding_window)
    if config.max_model_len is None:
        return min(limit, DEFAULT_MAX_MODEL_LEN)
    if config.max_model_len > limit:
        why = (
            "sliding-window attention is not implemented"
            if spec.sliding_window == limit
            else "the model's max_position_embeddings"
        )
        raise ValueError(f"max_model_len {config.max_model_len} exceeds {limit} ({why})")
    return config.max_model_len


def kv_blocks(config: EngineConfig, runner: ModelRunner, device: torch.device, max_model_len: int) -> int:
    """KV-cache blocks: as many as asked, or as fit in the budget; on a GPU, the memory left at
    `gpu_memory_utilization` after the weights, the peak activations of the largest step and a reserve for
    the graphs; on a CPU, room for every sequence at full length, capped at `DEFAULT_CPU_KV_BUDGET`."""
    per_block = runner.kv_bytes_per_block()
    if config.num_kv_blocks is not None:
        return config.num_kv_blocks
    if config.kv_cache_memory is not None:
        budget = int(config.kv_cache_memory)
    elif device.type == "cuda":
        activations = runner.profile_activation_bytes(config.max_num_batched_tokens)
        free, total = torch.cuda.mem_get_info(device)
        graphs_reserve = 0 if config.enforce_eager else 1024**3
        budget = int(total * config.gpu_memory_utilization - (total - free) - activations - graphs_reserve)
        log.info(
            "memory: %.2f GiB total, %.2f GiB in use, %.2f GiB peak activations -> KV budget %.2f GiB",
            total / 2**30,
            (total - free) / 2**30,
            activations / 2**30,
            budget / 2**30,
        )
    else:
        full = -(-max_model_len // config.block_size) * config.max_num_seqs * per_block
        budget = min(full, DEFAULT_CPU_KV_BUDGET)
    blocks = budget // per_block
    if blocks < 1:
        raise ValueError(f"KV cache budget of {budget} bytes holds no {per_block}-byte block")
    return blocks


def resolve_device(device: str) -> torch.device:
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dev = torch.device(device)
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ValueError("device cuda was asked for but no CUDA device is visible")
    return dev
