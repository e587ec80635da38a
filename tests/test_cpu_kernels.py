"""The C decode-attention kernel (reference_engine/cpu_kernels.py) against the torch path on fresh random caches:
GQA and MHA, block sizes that do and do not divide the contexts, ragged lengths, scattered block tables."""

from __future__ import annotations

import random

import pytest
import torch

from reference_engine import Engine, EngineConfig
from reference_engine.attention import AttentionBatch, decode_attention, decode_mask
from reference_engine.cpu_kernels import CPUOps, load_kernel
from reference_engine.cpu_kernels import decode_attention as c_decode_attention

LIB = load_kernel()
pytestmark = pytest.mark.skipif(LIB is None, reason="no C compiler here: the engine keeps the torch path")


def random_batch(rng: random.Random, num_seqs: int, heads: int, kv_heads: int, head_dim: int, block_size: int):
    lens = [rng.choice([1, block_size - 1, block_size, block_size + 1, rng.randint(1, 300)]) for _ in range(num_seqs)]
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
    batch = AttentionBatch(slot_mapping=torch.zeros(num_seqs, dtype=torch.long), num_decode=num_seqs,
                           decode_block_tables=padded, decode_context_lens=context_lens,
                           decode_max_context=max(lens), decode_mask=decode_mask(context_lens, width * block_size))
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
