"""What the HTTP front end needs to know about an engine, without holding the engine itself: its request
limits (to answer 400 before a request is queued), the tokenizer to load, its start-up report and its
counters. Plain data, no torch: a front end starts without importing it.

The engine may live in this process (`EngineInfo.of(engine)`) or in an engine-core process that sends this
object, pickled, once it is ready; the front end treats both alike.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING

from reference_engine.config import SamplingParams
from reference_engine.model_config import ModelSpec
from reference_engine.tokenizer import load_tokenizer

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

    from reference_engine.engine import Engine


@dataclass
class EngineStartup:
    """What starting the engine cost: phase durations (seconds) and memory (bytes)."""

    phases: dict[str, float] = field(default_factory=dict)
    num_kv_blocks: int = 0
    kv_cache_bytes: int = 0
    weights_bytes: int = 0
    cuda_graph_buckets: list[int] = field(default_factory=list)
    cuda_graph_warmup_seconds: float = 0.0
    cuda_graph_capture_seconds: dict[int, float] = field(default_factory=dict)
    cuda_graph_pool_bytes: int = 0
    mixed_graph_sizes: list[int] = field(default_factory=list)  # token counts of the piecewise graphs
    mixed_graph_pool_bytes: int = 0
    device: str = ""
    dtype: str = ""

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass
class EngineStats:
    running: int
    waiting: int
    kv_blocks_total: int
    kv_blocks_used: int
    kv_blocks_free: int
    prefix_queried_tokens: int
    prefix_hit_tokens: int
    preemptions: int


@dataclass(frozen=True)
class RequestLimits:
    """The bounds a request must fit in; the engine checks the same ones on `add_request`."""

    vocab_size: int
    max_model_len: int
    block_size: int
    num_kv_blocks: int

    def validate(self, prompt: list[int], params: SamplingParams) -> None:
        """Raise ValueError, with a message fit for a client, for a request the engine cannot serve."""
        if not prompt:
            raise ValueError("the prompt is empty")
        vocab = self.vocab_size
        bad = [t for t in prompt if not isinstance(t, int) or not 0 <= t < vocab]
        if bad:
            raise ValueError(f"prompt token ids must be integers in [0, {vocab}); got {bad[:5]}")
        if len(prompt) >= self.max_model_len:
            raise ValueError(
                f"prompt has {len(prompt)} tokens; max_model_len is {self.max_model_len}, "
                "which leaves no room for an output token"
            )
        total = len(prompt) + params.max_tokens
        if total > self.max_model_len:
            raise ValueError(
                f"prompt ({len(prompt)} tokens) + max_tokens ({params.max_tokens}) = {total} "
                f"exceeds max_model_len {self.max_model_len}"
            )
        need = -(-total // self.block_size)
        if need > self.num_kv_blocks:
            raise ValueError(
                f"the request needs {need} KV blocks but the cache holds only {self.num_kv_blocks}"
            )
        bad_stop = [t for t in params.stop_token_ids if not 0 <= t < vocab]
        if bad_stop:
            raise ValueError(f"stop_token_ids must be in [0, {vocab}); got {bad_stop[:5]}")


@dataclass(frozen=True)
class EngineInfo:
    limits: RequestLimits
    spec: ModelSpec
    # what the engine loaded its tokenizer from; None: synthetic (random weights)
    tokenizer_source: str | None
    device_type: str  # "cuda" or "cpu"
    max_num_seqs: int
    setup: EngineStartup

    @classmethod
    def of(cls, engine: Engine) -> EngineInfo:
        limits = RequestLimits(
            engine.spec.vocab_size, engine.max_model_len, engine.block_size, engine.block_manager.num_blocks
        )
        return cls(
            limits,
            engine.spec,
            engine.tokenizer_source,
            engine.device.type,
            engine.config.max_num_seqs,
            engine.setup,
        )

    @property
    def max_model_len(self) -> int:
        return self.limits.max_model_len

    @property
    def eos_token_ids(self) -> tuple[int, ...]:
        return tuple(self.spec.eos_token_ids)

    def load_tokenizer(self) -> PreTrainedTokenizerBase:
        """The tokenizer the engine uses, loaded again here (a checkpoint's own, or the synthetic one)."""
        return load_tokenizer(None, self.spec, self.tokenizer_source)
