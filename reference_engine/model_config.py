"""The shape of a Llama-family model, read from a Hugging Face config.json or named for random weights."""

from __future__ import annotations

import json
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

SUPPORTED_ARCHITECTURES = {
    "LlamaForCausalLM": "llama",
    "MistralForCausalLM": "mistral",
    "Qwen2ForCausalLM": "qwen2",
}
SUPPORTED_ROPE_TYPES = ("default", "linear", "llama3")


class UnsupportedModelError(ValueError):
    """The checkpoint is a model this engine does not implement."""


@dataclass(frozen=True)
class ModelSpec:
    """Every number the model code needs; nothing else."""

    architecture: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float = 1e-5
    rope_theta: float = 10000.0
    rope_scaling: dict[str, Any] | None = None
    max_position_embeddings: int = 4096
    tie_word_embeddings: bool = False
    qkv_bias: bool = False
    sliding_window: int | None = None
    bos_token_id: int | None = None
    eos_token_ids: tuple[int, ...] = field(default_factory=tuple)

    def __post_init__(self) -> None:
        if self.num_heads % self.num_kv_heads:
            raise UnsupportedModelError(
                f"num_attention_heads ({self.num_heads}) must be a multiple of num_key_value_heads "
                f"({self.num_kv_heads})"
            )
        rope_type = (self.rope_scaling or {}).get("rope_type", "default")
        if rope_type not in SUPPORTED_ROPE_TYPES:
            raise UnsupportedModelError(
                f"rope scaling type {rope_type!r} is not supported "
                f"(supported: {', '.join(SUPPORTED_ROPE_TYPES)})"
            )

    def num_parameters(self) -> int:
        """Parameter count, to size memory and the bandwidth roofline."""
        attn = self.hidden_size * (self.num_heads + 2 * self.num_kv_heads) * self.head_dim
        attn += self.num_heads * self.head_dim * self.hidden_size
        if self.qkv_bias:
            attn += (self.num_heads + 2 * self.num_kv_heads) * self.head_dim
        mlp = 3 * self.hidden_size * self.intermediate_size
        per_layer = attn + mlp + 2 * self.hidden_size
        embed = self.vocab_size * self.hidden_size
        head = 0 if self.tie_word_embeddings else embed
        return self.num_layers * per_layer + embed + head + self.hidden_size

    def kv_bytes_per_token(self, dtype_bytes: int) -> int:
        return 2 * self.num_layers * self.num_kv_heads * self.head_dim * dtype_bytes


def _rope_from_hf(cfg: dict[str, Any]) -> tuple[float, dict[str, Any] | None]:
    """Rope theta and scaling from either config style (transformers 4 `rope_scaling`, 5
    `rope_parameters`)."""
    params = cfg.get("rope_parameters")
    if isinstance(params, dict):
        theta = float(params.get("rope_theta", cfg.get("rope_theta", 10000.0)))
        scaling = {k: v for k, v in params.items() if k != "rope_theta"}
    else:
        theta = float(cfg.get("rope_theta", 10000.0))
        scaling = dict(cfg.get("rope_scaling") or {})
    if "type" in scaling and "rope_type" not in scaling:
        scaling["rope_type"] = scaling.pop("type")
    if not scaling or scaling.get("rope_type", "default") == "default":
        return theta, None
    return theta, scaling


def spec_from_hf_config(cfg: dict[str, Any], generation_cfg: dict[str, Any] | None = None) -> ModelSpec:
    """Build a ModelSpec from a parsed config.json (and generation_config.json, for extra EOS ids)."""
    archs = cfg.get("architectures") or []
    arch = next((SUPPORTED_ARCHITECTURES[a] for a in archs if a in SUPPORTED_ARCHITECTURES), None)
    if arch is None:
        named = ", ".join(archs) or f"model_type={cfg.get('model_type')!r}"
        raise UnsupportedModelError(
            f"unsupported architecture {named}; this engine serves {', '.join(SUPPORTED_ARCHITECTURES)}"
        )
    if cfg.get("hidden_act", "silu") != "silu":
        raise UnsupportedModelError(f"unsupported activation {cfg.get('hidden_act')!r} (only silu)")
    num_heads = int(cfg["num_attention_heads"])
    head_dim = cfg.get("head_dim") or int(cfg["hidden_size"]) // num_heads
    theta, scaling = _rope_from_hf(cfg)
    sliding = cfg.get("sliding_window")
    if arch == "qwen2" and not cfg.get("use_sliding_window", False):
        sliding = None
    eos: list[int] = []
    for source in (cfg, generation_cfg or {}):
        value = source.get("eos_token_id")
        for token in value if isinstance(value, list) else [value]:
            if isinstance(token, int) and token not in eos:
                eos.append(token)
    return ModelSpec(
        architecture=arch,
        vocab_size=int(cfg["vocab_size"]),
        hidden_size=int(cfg["hidden_size"]),
        intermediate_size=int(cfg["intermediate_size"]),
        num_layers=int(cfg["num_hidden_layers"]),
        num_heads=num_heads,
        num_kv_heads=int(cfg.get("num_key_value_heads") or num_heads),
        head_dim=int(head_dim),
        rms_norm_eps=float(cfg.get("rms_norm_eps", 1e-6)),
        rope_theta=theta,
        rope_scaling=scaling,
        max_position_embeddings=int(cfg.get("max_position_embeddings", 4096)),
        tie_word_embeddings=bool(cfg.get("tie_word_embeddings", False)),
        qkv_bias=arch == "qwen2" or bool(cfg.get("attention_bias", False)),
        sliding_window=int(sliding) if sliding else None,
        bos_token_id=cfg.get("bos_token_id") if isinstance(cfg.get("bos_token_id"), int) else None,
        eos_token_ids=tuple(eos),
    )


def read_spec(checkpoint_dir: Path) -> ModelSpec:
    config_path = checkpoint_dir / "config.json"
    if not config_path.is_file():
        raise FileNotFoundError(
            f"{checkpoint_dir} has no config.json; is it a Hugging Face checkpoint directory?"
        )
    cfg = json.loads(config_path.read_text())
    gen_path = checkpoint_dir / "generation_config.json"
    gen = json.loads(gen_path.read_text()) if gen_path.is_file() else None
    return spec_from_hf_config(cfg, gen)


_LLAMA3_ROPE = {
    "rope_type": "llama3",
    "factor": 32.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 8192,
}

# Shapes for random-weight runs: latency does not depend on the weights' values, only on these numbers.
NAMED_SHAPES: dict[str, ModelSpec] = {
    "tiny": ModelSpec(
        "llama",
        vocab_size=512,
        hidden_size=64,
        intermediate_size=128,
        num_layers=2,
        num_heads=4,
        num_kv_heads=2,
        head_dim=16,
        max_position_embeddings=2048,
        tie_word_embeddings=True,
        bos_token_id=1,
        eos_token_ids=(2,),
    ),
    "smollm2-135m": ModelSpec(
        "llama",
        vocab_size=49152,
        hidden_size=576,
        intermediate_size=1536,
        num_layers=30,
        num_heads=9,
        num_kv_heads=3,
        head_dim=64,
        rope_theta=100000.0,
        max_position_embeddings=8192,
        tie_word_embeddings=True,
        bos_token_id=1,
        eos_token_ids=(2,),
    ),
    "llama-3.2-1b": ModelSpec(
        "llama",
        vocab_size=128256,
        hidden_size=2048,
        intermediate_size=8192,
        num_layers=16,
        num_heads=32,
        num_kv_heads=8,
        head_dim=64,
        rope_theta=500000.0,
        rope_scaling=_LLAMA3_ROPE,
        max_position_embeddings=131072,
        tie_word_embeddings=True,
        bos_token_id=128000,
        eos_token_ids=(128001,),
    ),
    "llama-3-8b": ModelSpec(
        "llama",
        vocab_size=128256,
        hidden_size=4096,
        intermediate_size=14336,
        num_layers=32,
        num_heads=32,
        num_kv_heads=8,
        head_dim=128,
        rope_theta=500000.0,
        max_position_embeddings=8192,
        bos_token_id=128000,
        eos_token_ids=(128001,),
    ),
    "llama-2-7b": ModelSpec(
        "llama",
        vocab_size=32000,
        hidden_size=4096,
        intermediate_size=11008,
        num_layers=32,
        num_heads=32,
        num_kv_heads=32,
        head_dim=128,
        max_position_embeddings=4096,
        bos_token_id=1,
        eos_token_ids=(2,),
    ),
    "llama-2-13b": ModelSpec(
        "llama",
        vocab_size=32000,
        hidden_size=5120,
        intermediate_size=13824,
        num_layers=40,
        num_heads=40,
        num_kv_heads=40,
        head_dim=128,
        max_position_embeddings=4096,
        bos_token_id=1,
        eos_token_ids=(2,),
    ),
    "mistral-7b": ModelSpec(
        "mistral",
        vocab_size=32768,
        hidden_size=4096,
        intermediate_size=14336,
        num_layers=32,
        num_heads=32,
        num_kv_heads=8,
        head_dim=128,
        rope_theta=1000000.0,
        max_position_embeddings=32768,
        bos_token_id=1,
        eos_token_ids=(2,),
    ),
    "qwen2.5-0.5b": ModelSpec(
        "qwen2",
        vocab_size=151936,
        hidden_size=896,
        intermediate_size=4864,
        num_layers=24,
        num_heads=14,
        num_kv_heads=2,
        head_dim=64,
        rms_norm_eps=1e-6,
        rope_theta=1000000.0,
        max_position_embeddings=32768,
        tie_word_embeddings=True,
        qkv_bias=True,
        bos_token_id=None,
        eos_token_ids=(151645, 151643),
    ),
}


def named_shape(name: str) -> ModelSpec:
    if name not in NAMED_SHAPES:
        raise ValueError(f"unknown random shape {name!r}; known: {', '.join(sorted(NAMED_SHAPES))}")
    return replace(NAMED_SHAPES[name])
