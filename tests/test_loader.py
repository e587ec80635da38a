"""Checkpoint loading (`loader.load_checkpoint_weights`): a sharded checkpoint that lacks a tensor or holds
one of the wrong shape is refused with the tensor's name."""

from __future__ import annotations

import pytest
import torch
from checkpoints import make_checkpoint
from safetensors.torch import load_file, save_file

from reference_engine.kernels.ops import TorchOps
from reference_engine.loader import build_model, resolve_model


def built(checkpoint) -> None:
    build_model(resolve_model(str(checkpoint)), 256, torch.device("cpu"), torch.float32, TorchOps())


def rewrite_one_shard(checkpoint, change) -> str:
    """Apply `change` to the tensors of the shard holding the first layer's q projection; return its key."""
    key = "model.layers.0.self_attn.q_proj.weight"
    for shard in checkpoint.glob("*.safetensors"):
        tensors = load_file(str(shard))
        if key in tensors:
            change(tensors, key)
            save_file(tensors, str(shard), metadata={"format": "pt"})
            return key
    raise AssertionError(f"no shard holds {key}")


def test_a_missing_or_misshapen_tensor_is_refused_by_name(tmp_path):
    checkpoint = make_checkpoint(tmp_path / "missing", "llama", shard=True)
    key = rewrite_one_shard(checkpoint, lambda tensors, key: tensors.pop(key))
    with pytest.raises(ValueError, match=f"lacks 1 tensors, e.g. {key}"):
        built(checkpoint)

    checkpoint = make_checkpoint(tmp_path / "shape", "llama", shard=True)

    def truncate(tensors, key):
        tensors[key] = tensors[key][:-1].contiguous()

    key = rewrite_one_shard(checkpoint, truncate)
    with pytest.raises(ValueError, match=f"{key}: checkpoint shape"):
        built(checkpoint)
