"""Paged attention (through shuffled block tables) against dense causal attention on contiguous tensors."""

from __future__ import annotations

import math
import random
from functools import partial

import pytest
import torch
import torch.nn.functional as F

from reference_engine.kernels.attention import (
    AttentionBatch,
    PrefillBatch,
    PrefillChunk,
    decode_mask,
    prefill_batch_lists,
    write_kv,
)
from reference_engine.kernels.ops import TorchOps


def dense_attention(q, k, v, scale):
    """q: [n, H, d] queries at the last n positions of k/v [ctx, KVH, d]; plain causal softmax attention."""
    n, heads, _ = q.shape
    ctx, kv_heads, _ = k.shape
    group = heads // kv_heads
    k = k.repeat_interleave(group, dim=1).double()
    v = v.repeat_interleave(group, dim=1).double()
    scores = torch.einsum("qhd,khd->hqk", q.double(), k) * scale
    qpos = torch.arange(ctx - n, ctx)[:, None]
    scores = scores.masked_fill(torch.arange(ctx)[None, :] > qpos, float("-inf"))
    return torch.einsum("hqk,khd->qhd", F.softmax(scores, dim=-1), v)


def scatter_into_cache(num_blocks, block_size, seqs_kv, rng):
    """Place each sequence's K/V in randomly chosen, non-contiguous blocks; return caches and block tables."""
    kv_heads, head_dim = seqs_kv[0][0].shape[1:]
    k_cache = torch.randn(num_blocks, block_size, kv_heads, head_dim)  # garbage where nothing is written
    v_cache = torch.randn(num_blocks, block_size, kv_heads, head_dim)
    free = list(range(num_blocks))
    rng.shuffle(free)
    tables = []
    for k, v in seqs_kv:
        n_blocks = math.ceil(k.shape[0] / block_size)
        table = [free.pop() for _ in range(n_blocks)]
        tables.append(table)
        for i in range(k.shape[0]):
            b, off = table[i // block_size], i % block_size
            k_cache[b, off], v_cache[b, off] = k[i], v[i]
    return k_cache, v_cache, tables


DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")


def prefill_batch(
    rows: list[tuple[int, int, int, list[int]]], tile_tokens: int | None, device: torch.device
) -> PrefillBatch | None:
    """The chunks as the model runner hands them to a one-launch prefill kernel (None where the ops have
    none)."""
    if tile_tokens is None or not rows:
        return None
    chunks, tables, tiles, width = prefill_batch_lists(rows, tile_tokens)
    as_tensor = partial(torch.tensor, dtype=torch.int32, device=device)
    return PrefillBatch(
        as_tensor(chunks).view(-1, 3),
        as_tensor(tables).view(-1, width),
        as_tensor(tiles).view(-1, 2),
        max(ctx for _, _, ctx, _ in rows),
    )


@pytest.fixture(params=["torch", "triton"])
def ops(request):
    """Both implementations; Triton runs compiled on a GPU and under its interpreter on the CPU."""
    if request.param == "torch":
        return TorchOps()
    pytest.importorskip("triton")
    from reference_engine.kernels.triton_ops import TritonOps

    return TritonOps()


DTYPES = [torch.float32, torch.bfloat16] if DEVICE.type == "cuda" else [torch.float32]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("block_size", [1, 7, 16])
@pytest.mark.parametrize("heads,kv_heads", [(4, 4), (8, 2), (6, 1)])
def test_decode_and_prefill_match_dense(ops, block_size, heads, kv_heads, dtype):
    rng = random.Random()
    # Ragged contexts; each sequence has some tokens already cached and some new this step.
    specs = [(rng.randint(1, 70), 1) for _ in range(5)]
    specs += [(rng.randint(0, 40), rng.randint(2, 30)) for _ in range(4)]
    check_against_dense(ops, specs, block_size, heads, kv_heads, 16, dtype, rng)


@pytest.mark.parametrize("heads,kv_heads,head_dim", [(4, 4, 32), (8, 2, 64)])
def test_long_prefill_chunks_match_dense(ops, heads, kv_heads, head_dim):
    """Chunks longer than a prefill kernel's tile (several programs per chunk, the causal limit inside a
    tile), one starting a sequence and one continuing a long cached prefix, beside a few decodes."""
    rng = random.Random()
    specs = [(rng.randint(1, 300), 1) for _ in range(3)] + [
        (0, rng.randint(65, 160)),
        (rng.randint(100, 200), rng.randint(65, 130)),
    ]
    check_against_dense(ops, specs, 16, heads, kv_heads, head_dim, DTYPES[-1], rng)


def check_against_dense(
    ops,
    specs: list[tuple[int, int]],
    block_size: int,
    heads: int,
    kv_heads: int,
    head_dim: int,
    dtype: torch.dtype,
    rng: random.Random,
) -> None:
    """`ops.attend` over a flat batch of (cached, new) token counts per sequence (decodes first) against dense
    causal attention per sequence."""
    scale = head_dim**-0.5
    seqs = []
    for cached, new in specs:
        ctx = cached + new
        seqs.append(
            (
                torch.randn(ctx, kv_heads, head_dim),
                torch.randn(ctx, kv_heads, head_dim),
                torch.randn(new, heads, head_dim),
                cached,
                new,
            )
        )
    total_blocks = sum(math.ceil((c + n) / block_size) for c, n in specs) + 5
    # The cache holds only the already-cached tokens; the new ones are written by the attention call.
    prior = [(k[:cached], v[:cached]) for k, v, _, cached, _ in seqs]
    placeholders = [
        (torch.zeros(c + n, kv_heads, head_dim), torch.zeros(c + n, kv_heads, head_dim)) for c, n in specs
    ]
    k_cache, v_cache, tables = scatter_into_cache(total_blocks, block_size, placeholders, rng)
    for (k_prior, v_prior), table in zip(prior, tables, strict=True):
        for i in range(k_prior.shape[0]):
            k_cache[table[i // block_size], i % block_size] = k_prior[i]
            v_cache[table[i // block_size], i % block_size] = v_prior[i]
    # Flat batch: decodes (new == 1) first, then prefill chunks.
    q_rows, k_rows, v_rows, slots = [], [], [], []
    prefills, prefill_rows, decode_tables, decode_lens = [], [], [], []
    for (k, v, q, cached, new), table in zip(seqs, tables, strict=True):
        start = len(q_rows)
        for i in range(new):
            pos = cached + i
            q_rows.append(q[i])
            k_rows.append(k[pos])
            v_rows.append(v[pos])
            slots.append(table[pos // block_size] * block_size + pos % block_size)
        if new == 1:
            decode_tables.append(table)
            decode_lens.append(cached + 1)
        else:
            prefills.append(PrefillChunk(start, new, cached + new, torch.tensor(table)))
            prefill_rows.append((start, new, cached + new, table))
    width = max(len(t) for t in decode_tables)
    dev = DEVICE
    lens = torch.tensor(decode_lens, dtype=torch.int32, device=dev)
    for chunk in prefills:
        chunk.block_table = chunk.block_table.to(dev)
    batch = AttentionBatch(
        slot_mapping=torch.tensor(slots, device=dev),
        num_decode=len(decode_tables),
        decode_block_tables=torch.tensor(
            [t + [0] * (width - len(t)) for t in decode_tables], dtype=torch.int32, device=dev
        ),
        decode_context_lens=lens,
        decode_max_context=max(decode_lens),
        decode_mask=decode_mask(lens, width * block_size),
        prefills=prefills,
        prefill_batch=prefill_batch(prefill_rows, ops.prefill_tile_tokens(heads // kv_heads), dev),
    )
    k_cache, v_cache = k_cache.to(dev, dtype), v_cache.to(dev, dtype)
    write_kv(
        k_cache,
        v_cache,
        torch.stack(k_rows).to(dev, dtype),
        torch.stack(v_rows).to(dev, dtype),
        batch.slot_mapping,
    )
    out = ops.attend(torch.stack(q_rows).to(dev, dtype), k_cache, v_cache, batch, scale).cpu()
    tol = 1e-5 if dtype == torch.float32 else 2e-2
    row = 0
    for k, v, q, _cached, new in seqs:
        # The reference sees the same (rounded) inputs the kernels see.
        k, v, q = (t.to(dtype).double() for t in (k, v, q))
        ref = dense_attention(q, k, v, scale)
        got = out[row : row + new].double()
        assert torch.allclose(got, ref, rtol=tol, atol=tol), (got - ref).abs().max()
        row += new
