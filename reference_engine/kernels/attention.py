"""Paged attention in plain torch: every token's K/V is written into cache blocks, and every query reads its
context back through its block table, so each CPU run exercises the same paging a GPU kernel uses.

The flat token batch is ordered decodes first (one token per sequence) then prefill chunks. Decodes run as one
batched call over the gathered blocks; each prefill chunk runs on its own, reading its whole context (cached
prefix and the chunk itself) from the cache.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

# Prefill attention on CUDA: FlashAttention (causal) and the memory-efficient kernel (masked), never cuDNN's.
# Torch prefers cuDNN's attention on Hopper, which builds an execution plan for every new pair of query and
# context lengths: on the H200 that cost 1.35 ms of host time per call, 150-190 ms per mixed step, through a
# whole round of served traffic, until the chunk shapes repeated (against 0.06 ms once planned).
PREFILL_BACKENDS = [SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]


@dataclass
class PrefillChunk:
    """One sequence's new tokens in this step: rows [start, start+num_tokens) of the flat batch."""

    start: int
    num_tokens: int
    context_len: int  # tokens of context after this chunk (cached prefix + chunk)
    block_table: torch.Tensor  # [num_blocks] ids, int32 or long


@dataclass
class PrefillBatch:
    """Every prefill chunk of a step on the device at once, for a kernel that attends them in one launch
    (rather than one call per chunk and layer, whose host time set the length of mixed steps on the GPU)."""

    chunks: torch.Tensor  # [P, 3] int32: first flat row, new tokens, context after the chunk
    block_tables: torch.Tensor  # [P, max_blocks] int32, padded with block 0
    tiles: torch.Tensor  # [num_tiles, 2] int32: the chunk, the tile's first new token within it
    max_context: int  # the longest context (host int)


def prefill_batch_lists(
    prefills: list[tuple[int, int, int, list[int]]], tile_tokens: int
) -> tuple[list[int], list[int], list[int], int]:
    """`PrefillBatch`'s chunks, padded tables and tiles as flat host lists, from (start row, new tokens,
    context, block table) per chunk; returns them and the tables' width. Tiles with the most keys to read
    come first."""
    width = max(len(table) for *_, table in prefills)
    chunks = [value for start, n, ctx, _ in prefills for value in (start, n, ctx)]
    tables = [block for *_, table in prefills for block in table + [0] * (width - len(table))]
    tiles = sorted(
        ((i, first) for i, (_, n, _, _) in enumerate(prefills) for first in range(0, n, tile_tokens)),
        key=lambda tile: prefills[tile[0]][2] - prefills[tile[0]][1] + tile[1],
        reverse=True,
    )
    return chunks, tables, [value for tile in tiles for value in tile], width


@dataclass
class AttentionBatch:
    """What attention needs to know about one forward pass, shared by every layer."""

    slot_mapping: torch.Tensor  # [T] long: cache slot of each token (block_id * block_size + offset)
    num_decode: int = 0
    decode_block_tables: torch.Tensor | None = None  # [num_decode, max_blocks] int32
    decode_context_lens: torch.Tensor | None = None  # [num_decode] int32 or long (includes the new token)
    decode_max_context: int = 0  # longest decode context (host int): bounds the GPU kernel's partitions
    # the context that sets the partition size (0: decode_max_context); CUDA graphs pass max_model_len, so
    # that graphs launched for different context bounds cut a sequence the same way
    decode_split_context: int = 0
    decode_mask: torch.Tensor | None = None  # [num_decode, 1, 1, max_blocks * block_size] bool (torch path)
    prefills: list[PrefillChunk] = field(default_factory=list)
    prefill_batch: PrefillBatch | None = None  # the same chunks, for ops with a one-launch kernel


def write_kv(
    k_cache: torch.Tensor, v_cache: torch.Tensor, k: torch.Tensor, v: torch.Tensor, slot_mapping: torch.Tensor
) -> None:
    """Store each token's key and value at its slot; caches are [num_blocks, block_size, kv_heads,
    head_dim]. A slot below 0 (a padded row of a graph's bucket) is written nowhere, as in the kernels; the
    check reads the slots on the host, which this reference path may do."""
    num_kv_heads, head_dim = k_cache.shape[-2:]
    keep = slot_mapping >= 0
    if not bool(keep.all()):
        k, v, slot_mapping = k[keep], v[keep], slot_mapping[keep]
    k_cache.view(-1, num_kv_heads, head_dim).index_copy_(0, slot_mapping, k)
    v_cache.view(-1, num_kv_heads, head_dim).index_copy_(0, slot_mapping, v)


def gather_context(cache: torch.Tensor, block_table: torch.Tensor, context_len: int) -> torch.Tensor:
    """The first `context_len` cached rows of one sequence, in order: [context_len, kv_heads, head_dim]."""
    block_size = cache.shape[1]
    num_blocks = -(-context_len // block_size)
    rows = cache.index_select(0, block_table[:num_blocks])
    return rows.flatten(0, 1)[:context_len]


def decode_mask(context_lens: torch.Tensor, num_slots: int) -> torch.Tensor:
    """True where a decode query may attend: positions below its context length."""
    positions = torch.arange(num_slots, device=context_lens.device)
    return (positions[None, :] < context_lens[:, None])[:, None, None, :]


def paged_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    batch: AttentionBatch,
    scale: float,
    decode: Callable[..., torch.Tensor] | None = None,
    prefill: Callable[..., torch.Tensor] | None = None,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """Attention of every query in the flat batch over its cached context (already written), into `out` if
    given; `decode` and `prefill` replace the torch paths (same arguments as `decode_attention` and
    `prefill_attention`)."""
    out = torch.empty(q.shape, dtype=q.dtype, device=q.device) if out is None else out
    nd = batch.num_decode
    if nd:
        out[:nd] = (decode or decode_attention)(q[:nd], k_cache, v_cache, batch, scale)
    for chunk in batch.prefills:
        rows = slice(chunk.start, chunk.start + chunk.num_tokens)
        out[rows] = (prefill or prefill_attention)(q[rows], k_cache, v_cache, chunk, scale)
    return out


def decode_attention(
    q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, batch: AttentionBatch, scale: float
) -> torch.Tensor:
    tables = batch.decode_block_tables
    nd, kvh, hd = q.shape[0], k_cache.shape[2], k_cache.shape[3]
    # index_select on the flat block list, not k_cache[tables]: the same rows, copied about 6x faster on a CPU
    # (advanced indexing goes through a generic gather; index_select copies whole blocks).
    blocks = tables.reshape(-1)
    keys = k_cache.index_select(0, blocks).view(nd, -1, kvh, hd).transpose(1, 2)
    values = v_cache.index_select(0, blocks).view(nd, -1, kvh, hd).transpose(1, 2)
    out = F.scaled_dot_product_attention(
        q.unsqueeze(2), keys, values, attn_mask=batch.decode_mask, scale=scale, enable_gqa=True
    )
    return out.squeeze(2)


def prefill_attention(
    q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, chunk: PrefillChunk, scale: float
) -> torch.Tensor:
    """One sequence's chunk of queries over its whole context read back from the cache (prefix included)."""
    n, ctx = chunk.num_tokens, chunk.context_len
    keys = gather_context(k_cache, chunk.block_table, ctx).transpose(0, 1).unsqueeze(0)
    values = gather_context(v_cache, chunk.block_table, ctx).transpose(0, 1).unsqueeze(0)
    query = q.transpose(0, 1).unsqueeze(0)
    with sdpa_kernel(PREFILL_BACKENDS) if q.is_cuda else contextlib.nullcontext():
        if n == ctx:
            out = F.scaled_dot_product_attention(
                query, keys, values, is_causal=True, scale=scale, enable_gqa=True
            )
        else:
            # Query i sits at absolute position ctx - n + i and sees every key up to it.
            allowed = (
                torch.arange(ctx, device=q.device)[None, :]
                <= torch.arange(ctx - n, ctx, device=q.device)[:, None]
            )
            if q.is_cuda:  # the memory-efficient kernel takes the mask, but not grouped K/V heads
                group = q.shape[1] // keys.shape[1]
                keys, values = keys.repeat_interleave(group, 1), values.repeat_interleave(group, 1)
            out = F.scaled_dot_product_attention(
                query, keys, values, attn_mask=allowed, scale=scale, enable_gqa=not q.is_cuda
            )
    return out.squeeze(0).transpose(0, 1)
