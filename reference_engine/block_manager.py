"""KV-cache block bookkeeping: reference counts, a free list, and prefix reuse by chained block hashes.

A full block whose K/V are computed is registered under hash(parent hash, its tokens); a later sequence whose
prompt starts with the same tokens shares those blocks (verified against the stored tokens, so a hash
collision costs a miss, never a wrong answer). Freed blocks keep their contents and hash until the free list
hands them out again, oldest-freed first, so recently used prefixes survive longest.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

from reference_engine.sequence import Sequence


class OutOfBlocksError(RuntimeError):
    """Asked for more free blocks than exist; the scheduler checks first, so this is a bug if it escapes."""


@dataclass
class Block:
    block_id: int
    ref_count: int = 0
    hash: int | None = None
    token_ids: tuple[int, ...] | None = None  # the tokens a registered block holds, to verify hash hits


def chain_hash(parent: int | None, token_ids: tuple[int, ...]) -> int:
    return hash((parent, token_ids))


class BlockManager:
    def __init__(self, num_blocks: int, block_size: int, enable_prefix_caching: bool = True) -> None:
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.enable_prefix_caching = enable_prefix_caching
        self.blocks = [Block(i) for i in range(num_blocks)]
        self.free: OrderedDict[int, None] = OrderedDict((i, None) for i in range(num_blocks))
        self.cached: dict[int, int] = {}  # chain hash -> block id
        self.prefix_queried_tokens = 0
        self.prefix_hit_tokens = 0

    @property
    def num_free_blocks(self) -> int:
        return len(self.free)

    @property
    def num_used_blocks(self) -> int:
        return self.num_blocks - len(self.free)

    def blocks_for(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)

    def match_prefix(self, token_ids: list[int]) -> tuple[list[int], list[int]]:
        """Longest chain of cached full blocks that starts `token_ids`, leaving at least one token to
        compute."""
        if not self.enable_prefix_caching:
            return [], []
        bs = self.block_size
        block_ids: list[int] = []
        hashes: list[int] = []
        parent = None
        for i in range((len(token_ids) - 1) // bs):
            chunk = tuple(token_ids[i * bs : (i + 1) * bs])
            h = chain_hash(parent, chunk)
            block_id = self.cached.get(h)
            if block_id is None or self.blocks[block_id].token_ids != chunk:
                break
            block_ids.append(block_id)
            hashes.append(h)
            parent = h
        return block_ids, hashes

    def admission_cost(self, hit_block_ids: list[int], num_tokens: int) -> int:
        """Free blocks consumed by admitting a sequence that reuses `hit_block_ids` and holds `num_tokens`."""
        revived = sum(1 for b in hit_block_ids if self.blocks[b].ref_count == 0)
        return revived + max(0, self.blocks_for(num_tokens) - len(hit_block_ids))

    def admit(self, seq: Sequence, hit_block_ids: list[int], hit_hashes: list[int], num_tokens: int) -> None:
        """Give a waiting sequence its prefix-cache hits plus fresh blocks for `num_tokens` tokens."""
        assert not seq.block_table, "admitting a sequence that already holds blocks"
        for block_id in hit_block_ids:
            block = self.blocks[block_id]
            if block.ref_count == 0:
                del self.free[block_id]
            block.ref_count += 1
            seq.block_table.append(block_id)
        seq.block_hashes = list(hit_hashes)
        self.prefix_queried_tokens += len(seq)
        self.prefix_hit_tokens += len(hit_block_ids) * self.block_size
        self.grow(seq, num_tokens)

    def grow(self, seq: Sequence, num_tokens: int) -> None:
        """Append fresh blocks until the sequence can hold `num_tokens` tokens."""
        need = self.blocks_for(num_tokens) - len(seq.block_table)
        if need > len(self.free):
            raise OutOfBlocksError(f"need {need} blocks, {len(self.free)} free")
        for _ in range(need):
            block_id, _ = self.free.popitem(last=False)
            block = self.blocks[block_id]
            if block.hash is not None and self.cached.get(block.hash) == block_id:
                del self.cached[block.hash]
            block.hash, block.token_ids, block.ref_count = None, None, 1
            seq.block_table.append(block_id)

    def register_full_blocks(self, seq: Sequence) -> None:
        """Make the sequence's newly computed full blocks findable by later prompts."""
        if not self.enable_prefix_caching:
            return
        bs = self.block_size
        parent = seq.block_hashes[-1] if seq.block_hashes else None
        for i in range(len(seq.block_hashes), seq.num_computed_tokens // bs):
            chunk = tuple(seq.token_ids[i * bs : (i + 1) * bs])
            h = chain_hash(parent, chunk)
            block = self.blocks[seq.block_table[i]]
            if block.hash is None:
                block.hash, block.token_ids = h, chunk
                self.cached.setdefault(h, block.block_id)
            seq.block_hashes.append(h)
            parent = h

    def release(self, seq: Sequence) -> None:
        """Drop the sequence's references; blocks nobody holds go to the free list, tail blocks first."""
        for block_id in reversed(seq.block_table):
            block = self.blocks[block_id]
            block.ref_count -= 1
            if block.ref_count < 0:
                raise AssertionError(f"block {block_id} released more often than taken")
            if block.ref_count == 0:
                self.free[block_id] = None
        seq.block_table = []
        seq.block_hashes = []
