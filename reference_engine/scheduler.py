"""Continuous batching: each step mixes running sequences' decodes and prefill chunks with newly admitted
ones.

Every step has a token budget (max_num_batched_tokens) and a sequence cap (max_num_seqs). Running sequences
go first, oldest first; a long prompt is prefilled in chunks that fit the budget. A step that decodes running
sequences carries fewer prompt tokens, so that streams already answering do not wait behind a wave of
arrivals: `mixed_prefill_tokens` when given, else a share of the budget in proportion to the sequences still
on their prompt against those decoding (at least MIN_SHARED_PREFILL_TOKENS), or in proportion to that
fraction's square (`mixed_prefill_share="quadratic"`). A burst of arrivals beside few streams is drained in a
few long steps; a cohort replacing a few finished requests among many running ones is prefilled over several
short steps instead of stalling them all for one long one. The square shrinks a moderate cohort's share
faster (16 prompts among 64 sequences: 2048 tokens linear, the minimum quadratic) while a burst keeps most of
the budget (112 of 128: 7168 linear, 6272 quadratic): steady streams see shorter mixed steps, and prompts
arriving together are spread over more steps, so later rounds arrive less bunched. When KV
blocks run out, the newest running sequence is preempted: its blocks are released and it waits at the head of
the queue to be recomputed (its blocks often still sit in the prefix cache, so the recompute is mostly cache
hits).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from reference_engine.block_manager import BlockManager
from reference_engine.sequence import Sequence, Status

# The fewest prompt tokens a step that decodes gives prompts when they share its budget
MIN_SHARED_PREFILL_TOKENS = 1024
# mixed_prefill_share: the power of the prompts' fraction of the sequences that sets their share
SHARE_EXPONENTS = {"linear": 1, "quadratic": 2}


@dataclass
class ScheduledBatch:
    """Sequences to run this step with their number of new tokens; `preempted` were sent back to waiting."""

    items: list[tuple[Sequence, int]] = field(default_factory=list)
    preempted: list[Sequence] = field(default_factory=list)

    @property
    def num_tokens(self) -> int:
        return sum(n for _, n in self.items)


class Scheduler:
    def __init__(
        self,
        block_manager: BlockManager,
        max_num_seqs: int,
        max_num_batched_tokens: int,
        mixed_prefill_tokens: int | None = None,
        share_exponent: int = 1,
    ) -> None:
        self.block_manager = block_manager
        self.max_num_seqs = max_num_seqs
        self.max_num_batched_tokens = max_num_batched_tokens
        self.mixed_prefill_tokens = mixed_prefill_tokens  # None: a share of the budget (module docstring)
        self.share_exponent = share_exponent
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []  # in admission order: the last is the newest
        self.num_preemptions = 0

    def add(self, seq: Sequence) -> None:
        self.waiting.append(seq)

    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    def remove(self, seq: Sequence) -> None:
        """Take a finished or aborted sequence out of the queues and release its blocks."""
        if seq.status is Status.RUNNING:
            self.running.remove(seq)
        elif seq in self.waiting:
            self.waiting.remove(seq)
        self.block_manager.release(seq)

    def schedule(self) -> ScheduledBatch:
        batch = ScheduledBatch()
        budget = self.max_num_batched_tokens
        bm = self.block_manager
        prompt_budget = self._prompt_budget()
        queue = deque(self.running)
        still_running: list[Sequence] = []
        while queue:
            seq = queue.popleft()
            prompt = not decoding(seq)
            n = min(seq.num_uncomputed_tokens, budget, prompt_budget if prompt else budget)
            if n == 0:
                still_running.append(seq)
                continue
            need = bm.blocks_for(seq.num_computed_tokens + n) - len(seq.block_table)
            while need > bm.num_free_blocks and queue:
                self._preempt(queue.pop(), batch)
            if need > bm.num_free_blocks:
                self._preempt(seq, batch)
                continue
            bm.grow(seq, seq.num_computed_tokens + n)
            batch.items.append((seq, n))
            still_running.append(seq)
            budget -= n
            prompt_budget -= n if prompt else 0
        self.running = still_running
        if not batch.preempted:
            self._admit(batch, min(budget, prompt_budget))
        return batch

    def admit_beside_decodes(self, num_decodes: int) -> list[tuple[Sequence, int]]:
        """Admissions for a step queued behind the one in flight whose rows are a decode of every running
        sequence (`num_decodes` tokens): what `schedule` would admit after those decodes, never preempting."""
        batch = ScheduledBatch()
        self._admit(batch, min(self.max_num_batched_tokens - num_decodes, self._prompt_budget()))
        return batch.items

    def _prompt_budget(self) -> int:
        """Prompt tokens this step may carry: the whole budget when nothing decodes (module docstring)."""
        decoders = sum(map(decoding, self.running))
        if not decoders:
            return self.max_num_batched_tokens
        if self.mixed_prefill_tokens is not None:
            return self.mixed_prefill_tokens
        prompts = len(self.waiting) + len(self.running) - decoders
        share = int(self.max_num_batched_tokens * (prompts / (prompts + decoders)) ** self.share_exponent)
        return min(self.max_num_batched_tokens, max(MIN_SHARED_PREFILL_TOKENS, share))

    def _admit(self, batch: ScheduledBatch, budget: int) -> None:
        bm = self.block_manager
        while self.waiting and budget > 0 and len(self.running) < self.max_num_seqs:
            seq = self.waiting[0]
            hit_blocks, hit_hashes = bm.match_prefix(seq.token_ids)
            cached = len(hit_blocks) * bm.block_size
            n = min(len(seq) - cached, budget)
            if bm.admission_cost(hit_blocks, cached + n) > bm.num_free_blocks:
                break
            self.waiting.popleft()
            bm.admit(seq, hit_blocks, hit_hashes, cached + n)
            seq.num_computed_tokens = cached
            if seq.num_preemptions == 0:
                seq.num_cached_prompt_tokens = min(cached, seq.prompt_len)
            seq.status = Status.RUNNING
            self.running.append(seq)
            batch.items.append((seq, n))
            budget -= n

    def _preempt(self, seq: Sequence, batch: ScheduledBatch) -> None:
        self.block_manager.release(seq)
        seq.num_computed_tokens = 0
        seq.num_preemptions += 1
        seq.status = Status.WAITING
        self.waiting.appendleft(seq)
        self.num_preemptions += 1
        batch.preempted.append(seq)


def decoding(seq: Sequence) -> bool:
    """Whether the sequence's prompt is all computed (a recomputed, preempted one is prefilling again)."""
    return seq.num_computed_tokens >= seq.prompt_len
