"""The C kernels (reference_engine/kernels/cpu_kernels.py) against the torch path on fresh random inputs:
decode and prefill attention over scattered paged caches (GQA and MHA, block sizes that do and do not
divide the contexts, ragged lengths, prefill chunks after a cached prefix), RMSNorm with and without the
residual add, rotary embedding with the cache write, SiLU-and-mul."""

from __future__ import annotations

import random

import pytest
import torch

from reference_engine import Engine, EngineConfig
from reference_engine.kernels.attention import (
    AttentionBatch,
    PrefillChunk,
    decode_attention,
    decode_mask,
    prefill_attention,
)
from reference_engine.kernels.cpu_kernels import CPUOps, load_kernel
from reference_engine.kernels.cpu_kernels import decode_attention as c_decode_attention
from reference_engine.kernels.cpu_kernels import prefill_attention as c_prefill_attention
from reference_engine.kernels.ops import TorchOps

LIB = load_kernel()
pytestmark = pytest.mark.skipif(LIB is None, reason="no C compiler here: the engine keeps the torch path")


def random_batch(
    rng: random.Random, num_seqs: int, heads: int, kv_heads: int, head_dim: int, block_size: int
):
    lens = [
        rng.choice([1, block_size - 1, block_size, block_size + 1, rng.randint(1, 300)])
        for _ in range(num_seqs)
    ]
    blocks_per_seq = [-(-n // block_size) for n in lens]
    num_blocks = sum(blocks_per_seq) + 7
    order = list(range(num_blocks))
    rng.shuffle(order)  # blocks scattered over the cache, as after frees and reuse
    tables, at = [], 0
    for nb in blocks_per_seq:
        tables.append(order[at : at + nb])
        at += nb
    width = max(blocks_per_seq)
    padded = torch.tensor([t + [0] * (width - len(t)) for t in tables], dtype=torch.int32)
    context_lens = torch.tensor(lens, dtype=torch.int32)
    batch = AttentionBatch(
        slot_mapping=torch.zeros(num_seqs, dtype=torch.long),
        num_decode=num_seqs,
        decode_block_tables=padded,
        decode_context_lens=context_lens,
        decode_max_context=max(lens),
        decode_mask=decode_mask(context_lens, width * block_size),
    )
    k_cache = torch.randn(num_blocks, block_size, kv_heads, head_dim)
    v_cache = torch.randn(num_blocks, block_size, kv_heads, head_dim)
    q = torch.randn(num_seqs, heads, head_dim)
    return q, k_cache, v_cache, batch


@pytest.mark.parametrize(("heads", "kv_heads", "head_dim"), [(9, 3, 64), (4, 4, 32), (8, 1, 128), (6, 2, 48)])
@pytest.mark.parametrize("block_size", [16, 5])
def test_c_decode_attention_matches_torch(heads, kv_heads, head_dim, block_size):
    rng = random.Random()
    for num_seqs in (1, 3, 17):
        q, k_cache, v_cache, batch = random_batch(rng, num_seqs, heads, kv_heads, head_dim, block_size)
        scale = head_dim**-0.5
        want = decode_attention(q, k_cache, v_cache, batch, scale)
        got = c_decode_attention(LIB, q, k_cache, v_cache, batch, scale)
        torch.testing.assert_close(got, want, rtol=1e-5, atol=2e-5)


@pytest.mark.parametrize(("heads", "kv_heads", "head_dim"), [(9, 3, 64), (4, 4, 32), (8, 1, 128), (6, 2, 48)])
@pytest.mark.parametrize("block_size", [16, 5])
def test_c_prefill_attention_matches_torch(heads, kv_heads, head_dim, block_size):
    """Whole prompts and chunks after a cached prefix; q read in place from a fused qkv buffer, as the engine
    passes it; chunk lengths around the kernel's 8-query and 32-key tiles."""
    rng = random.Random()
    cases = [(1, 1), (3, 3), (8, 8), (9, 9), (33, 33), (256, 256), (1, 40), (5, 40), (17, 300), (64, 100)]
    for n, ctx in cases + [(rng.randint(1, 50), rng.randint(50, 200)) for _ in range(3)]:
        num_blocks = -(-ctx // block_size)
        order = list(range(num_blocks + 6))
        rng.shuffle(order)
        chunk = PrefillChunk(0, n, ctx, torch.tensor(order[:num_blocks]))
        k_cache = torch.randn(num_blocks + 6, block_size, kv_heads, head_dim)
        v_cache = torch.randn(num_blocks + 6, block_size, kv_heads, head_dim)
        qkv = torch.randn(n, heads + 2 * kv_heads, head_dim) * 2
        q = qkv[:, :heads]
        scale = head_dim**-0.5
        want = prefill_attention(q, k_cache, v_cache, chunk, scale)
        got = c_prefill_attention(LIB, q, k_cache, v_cache, chunk, scale)
        torch.testing.assert_close(got, want, rtol=1e-5, atol=3e-5, msg=f"{n} queries over {ctx}")


def test_c_elementwise_ops_match_torch():
    c_ops, torch_ops = CPUOps(LIB), TorchOps()
    rows, hidden, eps = 37, 96, 1e-5
    x, residual, weight = torch.randn(rows, hidden), torch.randn(rows, hidden), torch.rand(hidden) + 0.5
    torch.testing.assert_close(c_ops.rms_norm(x, weight, eps), torch_ops.rms_norm(x, weight, eps))
    got_res, want_res = residual.clone(), residual.clone()
    got = c_ops.add_rms_norm(x, got_res, weight, eps)
    want = torch_ops.add_rms_norm(x, want_res, weight, eps)
    torch.testing.assert_close(got[0], want[0])
    torch.testing.assert_close(got[1], want[1])
    gate_up = torch.randn(rows, 2 * 80) * 20  # far into both tails of the sigmoid
    torch.testing.assert_close(c_ops.silu_and_mul(gate_up), torch_ops.silu_and_mul(gate_up))
    heads, kv_heads, head_dim, block_size = 6, 2, 32, 5
    qkv = torch.randn(rows, (heads + 2 * kv_heads) * head_dim)
    positions = torch.randint(0, 500, (rows,))
    angles = torch.rand(512, head_dim // 2) * 6.3
    cos, sin = torch.cat([angles.cos()] * 2, -1), torch.cat([angles.sin()] * 2, -1)
    slots = torch.randperm(20 * block_size)[:rows]
    slots[3] = -1  # a padded row: written nowhere
    caches = [torch.randn(20, block_size, kv_heads, head_dim) for _ in range(2)]
    got_k, got_v, want_k, want_v = (c.clone() for c in caches + caches)
    got_q = c_ops.rope_and_write_kv(qkv.clone(), positions, cos, sin, got_k, got_v, slots, heads, kv_heads)
    keep = slots >= 0
    want_q = torch_ops.rope_and_write_kv(
        qkv[keep], positions[keep], cos, sin, want_k, want_v, slots[keep], heads, kv_heads
    )
    torch.testing.assert_close(got_q[keep], want_q)
    torch.testing.assert_close(got_k, want_k)
    torch.testing.assert_close(got_v, want_v)


def test_c_decode_attention_refuses_what_it_cannot_read():
    q, k_cache, v_cache, batch = random_batch(random.Random(), 2, 4, 2, 32, 16)
    with pytest.raises(ValueError, match="k_cache"):
        c_decode_attention(LIB, q, k_cache.to(torch.bfloat16), v_cache, batch, 0.1)


def test_engine_picks_the_kernel_for_float32_only(llama_dir):
    """Which path runs; that its tokens and logits match transformers is test_engine_vs_transformers's job (it
    runs the engine's defaults, so this kernel)."""

    def ops(**kwargs):
        return Engine(EngineConfig(model=str(llama_dir), device="cpu", num_kv_blocks=8, **kwargs)).runner.ops

    assert isinstance(ops(dtype="float32"), CPUOps)
    assert not isinstance(ops(dtype="float32", kernels="torch"), CPUOps)
    assert not isinstance(ops(dtype="bfloat16"), CPUOps)
