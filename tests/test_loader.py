"""Checkpoint loading (`loader.load_checkpoint_weights`): every parameter gets the checkpoint's values, read
through a memory map (registered with CUDA on a GPU), whatever the model's dtype, and a sharded checkpoint
that lacks a tensor, holds one of the wrong shape or ends early is refused with the tensor's name."""

from __future__ import annotations

import random

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


def checkpoint_tensors(checkpoint) -> dict[str, torch.Tensor]:
    tensors = {}
    for shard in checkpoint.glob("*.safetensors"):
        tensors.update(load_file(str(shard)))
    return tensors


@pytest.mark.parametrize(
    "device",
    [
        "cpu",
        pytest.param(
            "cuda",
            marks=[
                pytest.mark.gpu,
                pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
            ],
        ),
    ],
)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_every_parameter_holds_the_checkpoints_values(tmp_path, dtype, device):
    """Random weights saved in float32: a float32 model copies them as they are, a bfloat16 one casts on the
    way; on a GPU the copies run asynchronously from the registered mapping, which must outlive them."""
    checkpoint = make_checkpoint(tmp_path / "ckpt", "llama", seed=random.randrange(1 << 20), shard=True)
    model = build_model(resolve_model(str(checkpoint)), 256, torch.device(device), dtype, TorchOps())
    params = {name: param.cpu() for name, param in model.named_parameters()}
    saved = checkpoint_tensors(checkpoint)
    layer = "model.layers.1"
    fused_qkv = torch.cat([saved[f"{layer}.self_attn.{p}_proj.weight"] for p in "qkv"])
    assert torch.equal(params["layers.1.self_attn.qkv_proj.weight"], fused_qkv.to(dtype))
    o_proj = saved[f"{layer}.self_attn.o_proj.weight"]
    assert torch.equal(params["layers.1.self_attn.o_proj.weight"], o_proj.to(dtype))
    assert torch.equal(params["embed_tokens.weight"], saved["model.embed_tokens.weight"].to(dtype))
    assert torch.equal(params["norm.weight"], saved["model.norm.weight"].to(dtype))


def test_a_truncated_shard_is_refused(tmp_path):
    checkpoint = make_checkpoint(tmp_path / "ckpt", "llama", shard=True)
    shard = max(checkpoint.glob("*.safetensors"), key=lambda p: p.stat().st_size)
    shard.write_bytes(shard.read_bytes()[:-100])
    with pytest.raises(ValueError, match="the file ends inside the tensor's data"):
        built(checkpoint)


def test_a_tied_lm_head_stays_the_embedding_after_allocation(tmp_path):
    """Parameters are allocated one by one from the meta-device model (`loader.allocate_empty`); a tensor two
    modules share (the tied LM head) must stay one tensor, filled once, and every buffer must be allocated."""
    checkpoint = make_checkpoint(tmp_path / "tied", "qwen2", seed=random.randrange(1 << 20))  # tied
    model = build_model(resolve_model(str(checkpoint)), 256, torch.device("cpu"), torch.bfloat16, TorchOps())
    assert model.lm_head.weight is model.embed_tokens.weight
    saved = checkpoint_tensors(checkpoint)
    assert torch.equal(model.lm_head.weight, saved["model.embed_tokens.weight"].to(torch.bfloat16))
    tensors = [*model.parameters(), *model.buffers()]
    assert all(not t.is_meta for t in tensors)
    assert len({t.data_ptr() for t in model.parameters()}) == len(list(model.parameters()))  # no others share
    assert model.rotary.cos.dtype == torch.float32 and torch.isfinite(model.rotary.cos).all()
