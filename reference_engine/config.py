"""The engine's two configuration objects: how the engine runs, and how one request samples."""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field, replace

_SIZE_RE = re.compile(r"^\s*([0-9]*\.?[0-9]+)\s*([KMGT]i?B?|B)?\s*$", re.IGNORECASE)
_UNITS = {
    "": 1,
    "b": 1,
    "k": 1000,
    "kb": 1000,
    "m": 1000**2,
    "mb": 1000**2,
    "g": 1000**3,
    "gb": 1000**3,
    "t": 1000**4,
    "tb": 1000**4,
    "ki": 1024,
    "kib": 1024,
    "mi": 1024**2,
    "mib": 1024**2,
    "gi": 1024**3,
    "gib": 1024**3,
    "ti": 1024**4,
    "tib": 1024**4,
}


def parse_bytes(value: int | str) -> int:
    """Parse a memory size such as 4294967296, "4GiB" or "512MB" into bytes."""
    if isinstance(value, int):
        return value
    match = _SIZE_RE.match(value)
    if not match:
        raise ValueError(f"cannot read {value!r} as a memory size (examples: 2GiB, 512MiB, 1000000)")
    number, unit = match.groups()
    return int(float(number) * _UNITS[(unit or "").lower()])


def cpu_threads(given: int | None) -> int:
    """Torch threads for an engine serving on the CPU: as given, else one fewer than the cores, as vLLM's CPU
    build keeps one for its API server (OpenMP threads that share a core with the event loop stall each
    other)."""
    return given or max(1, (os.cpu_count() or 2) - 1)


@dataclass
class EngineConfig:
    """Everything that decides how the engine loads a model and schedules work.

    `model` is a checkpoint directory, a hub id, a built-in name (`smollm2-135m`) or `random:<shape>`.
    KV memory is given either as a block count (`num_kv_blocks`) or a byte budget (`kv_cache_memory`);
    with neither, the CPU gets enough blocks for every sequence at full length (capped at 1 GiB) and a
    GPU gets `gpu_memory_utilization` of its memory minus what the weights and activations take.
    """

    model: str = "smollm2-135m"
    tokenizer: str | None = None
    dtype: str = "auto"  # auto: float32 on CPU, bfloat16 on CUDA
    device: str = "auto"  # auto: cuda when available
    block_size: int = 16
    num_kv_blocks: int | None = None
    kv_cache_memory: int | str | None = None
    gpu_memory_utilization: float = 0.90
    max_num_seqs: int | None = None  # None: DEFAULT_MAX_NUM_SEQS for the device
    max_num_batched_tokens: int | None = None  # None: DEFAULT_MAX_NUM_BATCHED_TOKENS for the device
    # Prompt tokens a step may carry beside running decodes; None: a share of max_num_batched_tokens in
    # proportion to the sequences on their prompt against those decoding (scheduler.py says why)
    mixed_prefill_tokens: int | None = None
    # How that share falls as decodes outnumber prompts: "linear" (in proportion) or "quadratic" (as the
    # square of the prompts' fraction, so a moderate cohort among many decodes gets the minimum)
    mixed_prefill_share: str = "linear"
    max_model_len: int | None = None  # None: the model's own limit, capped at 4096
    enable_prefix_caching: bool = True
    enforce_eager: bool = False
    cuda_graph_batch_sizes: list[int] | None = None  # None: the default buckets up to max_num_seqs
    # Context bounds to capture every decode graph for besides max_model_len (cuda_graphs.py says why).
    # None: 1024 and each four times the last below max_model_len; []: max_model_len only
    cuda_graph_context_bounds: list[int] | None = None
    # Token counts to capture the pieces between attention calls for, for steps that carry prompt tokens
    # (piecewise_graphs.py). None: 16 ... 1024 (DEFAULT_TOKEN_SIZES) up to max_num_batched_tokens; []: none
    mixed_cuda_graph_sizes: list[int] | None = None
    kernels: str = "auto"  # auto: Triton on CUDA, torch on CPU; or force "torch" / "triton"
    cpu_linear: str = "onednn"  # float32 linears on a CPU: oneDNN on packed weights, or "torch" (F.linear)
    seed: int = 0
    # Overlapped decode: queue decode step N+1 (its token ids copied on the device from step N's samples)
    # before reading step N's tokens, so the GPU does not wait for the host between steps. None: on for
    # CUDA, off on a CPU, where the model runs in the calling thread and nothing could overlap.
    async_scheduling: bool | None = None
    # Run every kind of eager step once before serving (kernel compiles, allocator growth): None means on for
    # CUDA, where first sight costs up to seconds, off on a CPU, where there is nothing to compile.
    warm_up: bool | None = None

    def __post_init__(self) -> None:
        if self.cpu_linear not in ("onednn", "torch"):
            raise ValueError(f"cpu_linear must be onednn or torch, got {self.cpu_linear!r}")
        if self.block_size < 1:
            raise ValueError(f"block_size must be >= 1, got {self.block_size}")
        if self.max_num_seqs is not None and self.max_num_seqs < 1:
            raise ValueError(f"max_num_seqs must be >= 1, got {self.max_num_seqs}")
        if self.max_num_batched_tokens is not None and self.max_num_batched_tokens < 1:
            raise ValueError(f"max_num_batched_tokens must be >= 1, got {self.max_num_batched_tokens}")
        if self.mixed_prefill_tokens is not None and self.mixed_prefill_tokens < 1:
            raise ValueError(f"mixed_prefill_tokens must be >= 1, got {self.mixed_prefill_tokens}")
        if self.mixed_prefill_share not in ("linear", "quadratic"):
            raise ValueError(
                f"mixed_prefill_share must be linear or quadratic, got {self.mixed_prefill_share!r}"
            )
        if self.num_kv_blocks is not None and self.num_kv_blocks < 1:
            raise ValueError(f"num_kv_blocks must be >= 1, got {self.num_kv_blocks}")
        if self.max_model_len is not None and self.max_model_len < 2:
            raise ValueError(f"max_model_len must be >= 2, got {self.max_model_len}")
        if any(bound < 1 for bound in self.cuda_graph_context_bounds or []):
            raise ValueError(f"cuda_graph_context_bounds must be >= 1, got {self.cuda_graph_context_bounds}")
        if not 0.0 < self.gpu_memory_utilization <= 1.0:
            raise ValueError(f"gpu_memory_utilization must be in (0, 1], got {self.gpu_memory_utilization}")
        if self.kv_cache_memory is not None:
            self.kv_cache_memory = parse_bytes(self.kv_cache_memory)

    def for_device(self, device_type: str) -> EngineConfig:
        """This configuration with the scheduling limits left unset filled in for the device ("cuda" or
        "cpu")."""
        kind = "cuda" if device_type == "cuda" else "cpu"
        return replace(
            self,
            max_num_seqs=self.max_num_seqs or DEFAULT_MAX_NUM_SEQS[kind],
            max_num_batched_tokens=self.max_num_batched_tokens or DEFAULT_MAX_NUM_BATCHED_TOKENS[kind],
        )


# Scheduling limits by device. A GPU takes 256 sequences a step, so that 128 concurrent streams are all
# served rather than half of them queued, and prefill chunks of up to 8192 tokens: on the H200 the 1B's
# closed loop at 64 streams carried 17.2-20.2k tokens/s at 2048, 20.0-21.3k at 4096 and 20.2-21.0k at 8192,
# and a larger budget prefills a burst of arrivals in fewer mixed steps (each of which also runs every
# decode). A 7B step of 8192 tokens is about 110 TFLOP of products: under a quarter second on an H200. A CPU
# keeps the smaller limits its steps are sized for.
DEFAULT_MAX_NUM_SEQS = {"cuda": 256, "cpu": 64}
DEFAULT_MAX_NUM_BATCHED_TOKENS = {"cuda": 8192, "cpu": 2048}


@dataclass
class SamplingParams:
    """How one request chooses its tokens and when it stops (names and defaults as in vLLM)."""

    max_tokens: int = 16
    min_tokens: int = 0
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0  # 0 or -1: no top-k
    seed: int | None = None
    stop_token_ids: list[int] = field(default_factory=list)
    ignore_eos: bool = False
    logprobs: bool = False  # report each sampled token's log-probability under the model's raw distribution

    def __post_init__(self) -> None:
        if not isinstance(self.max_tokens, int) or self.max_tokens < 1:
            raise ValueError(f"max_tokens must be an integer >= 1, got {self.max_tokens!r}")
        if self.min_tokens < 0 or self.min_tokens > self.max_tokens:
            raise ValueError(
                f"min_tokens must be in [0, max_tokens={self.max_tokens}], got {self.min_tokens}"
            )
        if self.temperature < 0.0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")
        if not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.top_k == -1:
            self.top_k = 0
        if self.top_k < 0:
            raise ValueError(f"top_k must be -1, 0 (off) or a positive integer, got {self.top_k}")
        self.stop_token_ids = list(self.stop_token_ids)

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0 or self.top_k == 1
