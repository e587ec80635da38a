"""From a model name to weights on a device: checkpoint directories, hub ids, built-ins and random shapes."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors import safe_open

from reference_engine.builtin_models import BUILTIN_MODELS, builtin_checkpoint
from reference_engine.model import LlamaModel
from reference_engine.model_config import ModelSpec, named_shape, read_spec

RANDOM_PREFIX = "random:"


@dataclass
class ResolvedModel:
    """Where a model's shape, weights and tokenizer come from."""

    name: str
    spec: ModelSpec
    checkpoint: Path | None  # None: random weights


def resolve_model(name: str) -> ResolvedModel:
    """`random:<shape>`, a built-in name, a local checkpoint directory, or a hub id (network permitting)."""
    if name.startswith(RANDOM_PREFIX):
        return ResolvedModel(name, named_shape(name[len(RANDOM_PREFIX):]), None)
    if name in BUILTIN_MODELS:
        path = builtin_checkpoint(name)
        return ResolvedModel(name, read_spec(path), path)
    path = Path(name).expanduser()
    if path.is_dir():
        return ResolvedModel(name, read_spec(path), path)
    if path.exists() or name.startswith((".", "/", "~")) or name.count("/") != 1:
        raise FileNotFoundError(
            f"model {name!r} is neither a checkpoint directory, a hub id (org/name), a built-in "
            f"({', '.join(BUILTIN_MODELS)}) nor random:<shape>")
    path = _download(name)
    return ResolvedModel(name, read_spec(path), path)


def _download(repo_id: str) -> Path:
    from huggingface_hub import snapshot_download

    try:
        return Path(snapshot_download(repo_id, allow_patterns=[
            "*.json", "*.safetensors", "tokenizer*", "*.jinja", "*.model"]))
    except Exception as exc:  # the hub raises many kinds: offline, gated, missing
        raise FileNotFoundError(f"could not fetch {repo_id!r} from the Hugging Face hub: {exc}") from exc


def resolve_dtype(dtype: str, device: torch.device) -> torch.dtype:
    if dtype == "auto":
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    table = {"float32": torch.float32, "fp32": torch.float32, "float": torch.float32,
             "bfloat16": torch.bfloat16, "bf16": torch.bfloat16, "float16": torch.float16,
             "fp16": torch.float16, "half": torch.float16}
    if dtype not in table:
        raise ValueError(f"unknown dtype {dtype!r}; use auto, float32, bfloat16 or float16")
    return table[dtype]


def _checkpoint_parts(spec: ModelSpec, ours: str) -> list[tuple[str, slice]]:
    """The Hugging Face tensors that make up one of our parameters, and the rows each fills."""
    kv = spec.num_kv_heads * spec.head_dim
    fused = {"self_attn.qkv_proj": [("self_attn.q_proj", spec.num_heads * spec.head_dim),
                                    ("self_attn.k_proj", kv), ("self_attn.v_proj", kv)],
             "mlp.gate_up_proj": [("mlp.gate_proj", spec.intermediate_size),
                                  ("mlp.up_proj", spec.intermediate_size)]}
    hf = ours if ours.startswith("lm_head") else "model." + ours
    for fused_name, parts in fused.items():
        if fused_name in hf:
            out, lo = [], 0
            for part, rows in parts:
                out.append((hf.replace(fused_name, part), slice(lo, lo + rows)))
                lo += rows
            return out
    return [(hf, slice(None))]


def load_checkpoint_weights(model: LlamaModel, checkpoint: Path) -> None:
    """Copy every parameter from single or sharded safetensors, fusing q/k/v and gate/up as we go."""
    index_path = checkpoint / "model.safetensors.index.json"
    if index_path.is_file():
        files = sorted(set(json.loads(index_path.read_text())["weight_map"].values()))
    else:
        files = [p.name for p in sorted(checkpoint.glob("*.safetensors"))]
    if not files:
        raise FileNotFoundError(f"{checkpoint} holds no *.safetensors weights")
    targets: dict[str, torch.Tensor] = {}
    for name, param in model.named_parameters():  # a tied lm_head is the embedding and is listed once
        for hf_name, rows in _checkpoint_parts(model.spec, name):
            targets[hf_name] = param.data[rows]
    loaded: set[str] = set()
    for file in files:
        with safe_open(str(checkpoint / file), framework="pt", device="cpu") as f:
            for key in f.keys():  # noqa: SIM118 (safe_open is not a mapping)
                if key not in targets:
                    continue
                tensor = f.get_tensor(key)
                if targets[key].shape != tensor.shape:
                    raise ValueError(
                        f"{key}: checkpoint shape {tuple(tensor.shape)} != model {tuple(targets[key].shape)}")
                targets[key].copy_(tensor)
                loaded.add(key)
    missing = sorted(set(targets) - loaded)
    if missing:
        raise ValueError(f"{checkpoint} lacks {len(missing)} tensors, e.g. {', '.join(missing[:4])}")


def init_random_weights(model: LlamaModel, seed: int) -> None:
    """Random normal weights (std 0.02), unit norms: the right shapes and realistic magnitudes for latency
    work."""
    gen = torch.Generator(device=next(model.parameters()).device).manual_seed(seed)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith("layernorm.weight") or name == "norm.weight":
                param.fill_(1.0)
            else:
                param.normal_(0.0, 0.02, generator=gen)


def build_model(resolved: ResolvedModel, max_len: int, device: torch.device, dtype: torch.dtype,
                ops, seed: int = 0) -> LlamaModel:
    """Allocate the model straight on its device (no CPU copy of random weights) and fill its weights."""
    with torch.device("meta"):
        model = LlamaModel(resolved.spec, max_len, ops)
    model = model.to_empty(device=device).to(dtype)
    if resolved.spec.tie_word_embeddings:
        model.lm_head.weight = model.embed_tokens.weight
    model.rotary.reset_tables()  # float32, computed on the device, after the dtype cast
    if resolved.checkpoint is None:
        init_random_weights(model, seed)
    else:
        load_checkpoint_weights(model, resolved.checkpoint)
    return model.eval().requires_grad_(False)
