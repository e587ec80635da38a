"""oneDNN-packed float32 linears (reference_engine/kernels/cpu_linear.py) against F.linear on fresh random
inputs."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from reference_engine import Engine, EngineConfig
from reference_engine.kernels.cpu_linear import PackedLinear, onednn_linear_available, pack_linears

pytestmark = pytest.mark.skipif(
    not onednn_linear_available(torch.device("cpu"), torch.float32), reason="this torch build has no oneDNN"
)


@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("rows", [1, 3, 8, 257])
def test_packed_linear_matches_f_linear(rows, bias):
    gen = torch.Generator().manual_seed(torch.seed())
    linear = nn.Linear(96, 200, bias=bias)
    with torch.no_grad():
        linear.weight.copy_(torch.randn(200, 96, generator=gen))
        if bias:
            linear.bias.copy_(torch.randn(200, generator=gen))
    x = torch.randn(rows, 96, generator=gen)
    want = F.linear(x, linear.weight, linear.bias)
    packed = PackedLinear(linear)
    got = packed(x)
    assert got.shape == want.shape
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-4)
    # leading dimensions are kept
    torch.testing.assert_close(packed(x.view(1, rows, 96)), want.view(1, rows, 200), rtol=1e-5, atol=1e-4)


def test_pack_linears_replaces_every_linear_and_keeps_a_tied_embedding_dense():
    model = nn.Module()
    model.embed = nn.Embedding(50, 16)
    model.inner = nn.Sequential(nn.Linear(16, 32), nn.Linear(32, 16, bias=False))
    model.head = nn.Linear(16, 50, bias=False)
    model.head.weight = model.embed.weight
    x = torch.randn(4, 16)
    want = model.head(model.inner(x))
    assert pack_linears(model) == 3
    assert not any(isinstance(m, nn.Linear) for m in model.modules())
    torch.testing.assert_close(model.head(model.inner(x)), want, rtol=1e-5, atol=1e-4)
    assert model.embed.weight.layout == torch.strided  # row lookups still read the dense table


def test_engine_counts_the_packed_copy_of_a_tied_head(llama_dir):
    packed = Engine(EngineConfig(model=str(llama_dir), device="cpu", dtype="float32", num_kv_blocks=8))
    plain = Engine(
        EngineConfig(model=str(llama_dir), device="cpu", dtype="float32", num_kv_blocks=8, cpu_linear="torch")
    )
    assert plain.runner.packed_linears == 0
    assert packed.runner.packed_linears == 4 * packed.spec.num_layers + 1
    head = packed.spec.vocab_size * packed.spec.hidden_size * 4
    extra = head if packed.spec.tie_word_embeddings else 0
    assert packed.setup.weights_bytes == plain.setup.weights_bytes + extra


def test_unknown_cpu_linear_is_refused():
    with pytest.raises(ValueError, match="cpu_linear"):
        EngineConfig(model="random:tiny", cpu_linear="mkl")
