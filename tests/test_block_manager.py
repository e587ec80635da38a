"""Property tests of the KV block manager: ownership, reference counts and prefix sharing."""

from __future__ import annotations

from collections import Counter

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from reference_engine.block_manager import BlockManager
from reference_engine.config import SamplingParams
from reference_engine.sequence import Sequence

BLOCK_SIZE = 4
NUM_BLOCKS = 24
# A tiny alphabet and shared stems make prefix hits common.
STEMS = [[1, 2, 3, 4, 5, 6, 7, 8], [1, 2, 3, 4, 9, 9, 9, 9], [5, 5, 5, 5, 5, 5, 5, 5, 5, 5, 5, 5]]


class BlockManagerMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.bm = BlockManager(NUM_BLOCKS, BLOCK_SIZE)
        self.live: list[Sequence] = []
        self.count = 0

    @rule(stem=st.sampled_from(STEMS), tail=st.lists(st.integers(1, 3), max_size=9))
    def admit(self, stem, tail):
        tokens = stem + tail
        seq = Sequence(str(self.count), tokens, SamplingParams(), self.count, None)
        self.count += 1
        hits, hashes = self.bm.match_prefix(tokens)
        assert len(hits) * BLOCK_SIZE < len(tokens), "a prefix hit must leave a token to compute"
        for i, b in enumerate(hits):
            assert self.bm.blocks[b].token_ids == tuple(tokens[i * BLOCK_SIZE : (i + 1) * BLOCK_SIZE])
        assert len(hits) >= self._longest_indexed_common_prefix(tokens), "a shared prefix was not reused"
        if self.bm.admission_cost(hits, len(tokens)) > self.bm.num_free_blocks:
            return
        self.bm.admit(seq, hits, hashes, len(tokens))
        seq.num_computed_tokens = len(tokens)  # as if the model ran
        self.bm.register_full_blocks(seq)
        self.live.append(seq)

    def _longest_indexed_common_prefix(self, tokens: list[int]) -> int:
        """Full blocks at the start of `tokens` that some live sequence holds, computed and indexed."""
        cap = (len(tokens) - 1) // BLOCK_SIZE
        best = 0
        for seq in self.live:
            j = 0
            while (
                j < cap
                and (j + 1) * BLOCK_SIZE <= seq.num_computed_tokens
                and seq.token_ids[: (j + 1) * BLOCK_SIZE] == tokens[: (j + 1) * BLOCK_SIZE]
                and self.bm.cached.get(self.bm.blocks[seq.block_table[j]].hash) == seq.block_table[j]
            ):
                j += 1
            best = max(best, j)
        return best

    @precondition(lambda self: self.live)
    @rule(data=st.data(), token=st.integers(1, 3))
    def decode(self, data, token):
        seq = data.draw(st.sampled_from(self.live))
        if self.bm.blocks_for(len(seq) + 1) - len(seq.block_table) > self.bm.num_free_blocks:
            return
        self.bm.grow(seq, len(seq) + 1)
        seq.token_ids.append(token)
        seq.num_computed_tokens += 1
        self.bm.register_full_blocks(seq)

    @precondition(lambda self: self.live)
    @rule(data=st.data())
    def release(self, data):
        seq = data.draw(st.sampled_from(self.live))
        self.live.remove(seq)
        self.bm.release(seq)

    @invariant()
    def reference_counts_equal_owners(self):
        owners = Counter(b for seq in self.live for b in seq.block_table)
        for block in self.bm.blocks:
            assert block.ref_count == owners.get(block.block_id, 0)
            assert (block.ref_count == 0) == (block.block_id in self.bm.free)
        assert len(self.bm.free) + len(owners) == NUM_BLOCKS

    @invariant()
    def no_block_owned_twice_unless_shared_identical(self):
        holders: dict[int, list[tuple[int, ...]]] = {}
        for seq in self.live:
            assert len(set(seq.block_table)) == len(seq.block_table), "a sequence holds a block twice"
            assert len(seq.block_table) * BLOCK_SIZE >= len(seq)
            for i, b in enumerate(seq.block_table):
                holders.setdefault(b, []).append(tuple(seq.token_ids[i * BLOCK_SIZE : (i + 1) * BLOCK_SIZE]))
        for b, contents in holders.items():
            if len(contents) > 1:
                block = self.bm.blocks[b]
                assert block.hash is not None, "a shared block must be a registered full block"
                assert all(c == block.token_ids for c in contents), "sharers disagree about a block's tokens"

    @invariant()
    def cache_index_points_at_matching_blocks(self):
        for h, b in self.bm.cached.items():
            assert self.bm.blocks[b].hash == h

    def teardown(self):
        for seq in self.live:
            self.bm.release(seq)
        assert all(block.ref_count == 0 for block in self.bm.blocks)
        assert len(self.bm.free) == NUM_BLOCKS


TestBlockManager = BlockManagerMachine.TestCase
TestBlockManager.settings = settings(
    max_examples=150, stateful_step_count=40, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)


def test_shared_prefix_reuses_blocks_and_counts_hits():
    bm = BlockManager(16, 4)
    a = Sequence("a", [1, 2, 3, 4, 5, 6, 7, 8, 9], SamplingParams(), 0, None)
    hits, hashes = bm.match_prefix(a.token_ids)
    assert hits == []
    bm.admit(a, hits, hashes, len(a))
    a.num_computed_tokens = len(a)
    bm.register_full_blocks(a)
    b = Sequence("b", [1, 2, 3, 4, 5, 6, 7, 8, 10, 11], SamplingParams(), 1, None)
    hits, hashes = bm.match_prefix(b.token_ids)
    assert hits == a.block_table[:2]
    bm.admit(b, hits, hashes, len(b))
    assert b.block_table[:2] == a.block_table[:2] and b.block_table[2] != a.block_table[2]
    assert bm.blocks[a.block_table[0]].ref_count == 2
    assert bm.prefix_hit_tokens == 8
    # A prompt that is exactly two cached blocks still leaves its last block to compute.
    c = Sequence("c", [1, 2, 3, 4, 5, 6, 7, 8], SamplingParams(), 2, None)
    assert bm.match_prefix(c.token_ids)[0] == a.block_table[:1]
    bm.release(a)
    bm.release(b)
    assert bm.num_free_blocks == 16
    # Freed blocks stay findable until the free list hands them out again.
    shared = bm.match_prefix([1, 2, 3, 4, 5, 6, 7, 8, 0])[0]
    assert len(shared) == 2 and all(bm.blocks[blk].ref_count == 0 for blk in shared)
    e = Sequence("e", list(range(100, 163)), SamplingParams(), 4, None)
    bm.admit(e, [], [], len(e))  # takes all 16 blocks, evicting the cached ones
    assert bm.match_prefix([1, 2, 3, 4, 5, 6, 7, 8, 0])[0] == []


def test_hash_collision_is_a_miss_not_a_wrong_hit(monkeypatch):
    from reference_engine import block_manager

    monkeypatch.setattr(block_manager, "chain_hash", lambda parent, tokens: 42)  # everything collides
    bm = BlockManager(8, 2)
    a = Sequence("a", [1, 2, 3], SamplingParams(), 0, None)
    bm.admit(a, [], [], 3)
    a.num_computed_tokens = 3
    bm.register_full_blocks(a)
    hits, _ = bm.match_prefix([7, 8, 9])
    assert hits == []
