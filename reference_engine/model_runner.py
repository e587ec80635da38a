"""Turns a scheduled batch into tensors, runs the model over the paged KV cache, and returns the logits to sample.

The flat batch puts single-token steps (decodes) first and prefill chunks after, so a decode-only batch is a
contiguous prefix that a CUDA graph can replay.
"""

from __future__ import annotations

import torch

from reference_engine.attention import AttentionBatch, PrefillChunk, TorchPagedAttention, decode_mask
from reference_engine.loader import ResolvedModel, build_model
from reference_engine.sequence import Sequence


class ModelRunner:
    def __init__(self, resolved: ResolvedModel, device: torch.device, dtype: torch.dtype, max_model_len: int,
                 block_size: int, seed: int) -> None:
        self.device, self.dtype, self.block_size = device, dtype, block_size
        self.spec = resolved.spec
        self.backend = TorchPagedAttention()
        self.model = build_model(resolved, max_model_len, device, dtype, self.backend, seed)
        self.num_blocks = 0

    def kv_bytes_per_block(self) -> int:
        return self.spec.kv_bytes_per_token(torch.finfo(self.dtype).bits // 8) * self.block_size

    def allocate_kv_cache(self, num_blocks: int) -> None:
        """One K and one V tensor per layer, [num_blocks, block_size, kv_heads, head_dim], zeroed so that
        masked-out padding rows can never inject NaN into attention."""
        spec = self.spec
        shape = (num_blocks, self.block_size, spec.num_kv_heads, spec.head_dim)
        for layer in self.model.layers:
            layer.self_attn.k_cache = torch.zeros(shape, dtype=self.dtype, device=self.device)
            layer.self_attn.v_cache = torch.zeros(shape, dtype=self.dtype, device=self.device)
        self.num_blocks = num_blocks

    def prepare(self, items: list[tuple[Sequence, int]]
                ) -> tuple[torch.Tensor, torch.Tensor, AttentionBatch, list[int], list[Sequence]]:
        """Flat input ids, positions, attention metadata, and which rows/sequences sample a token."""
        bs = self.block_size
        ordered = [it for it in items if it[1] == 1] + [it for it in items if it[1] > 1]
        input_ids: list[int] = []
        positions: list[int] = []
        slots: list[int] = []
        sample_rows: list[int] = []
        sample_seqs: list[Sequence] = []
        prefills: list[PrefillChunk] = []
        num_decode = 0
        for seq, n in ordered:
            start = seq.num_computed_tokens
            table = seq.block_table
            offset = len(input_ids)
            input_ids.extend(seq.token_ids[start:start + n])
            positions.extend(range(start, start + n))
            slots.extend(table[p // bs] * bs + p % bs for p in range(start, start + n))
            if n == 1:
                num_decode += 1
            else:
                prefills.append(PrefillChunk(offset, n, start + n, torch.tensor(table, device=self.device)))
            if start + n == len(seq):
                sample_rows.append(offset + n - 1)
                sample_seqs.append(seq)
        dev = self.device
        batch = AttentionBatch(slot_mapping=torch.tensor(slots, device=dev), num_decode=num_decode,
                               prefills=prefills)
        if num_decode:
            decodes = [seq for seq, _ in ordered[:num_decode]]
            width = max(len(seq.block_table) for seq in decodes)
            tables = [seq.block_table + [0] * (width - len(seq.block_table)) for seq in decodes]
            batch.decode_block_tables = torch.tensor(tables, device=dev)
            batch.decode_context_lens = torch.tensor([seq.num_computed_tokens + 1 for seq in decodes], device=dev)
            batch.decode_mask = decode_mask(batch.decode_context_lens, width * bs)
        return (torch.tensor(input_ids, device=dev), torch.tensor(positions, device=dev), batch,
                sample_rows, sample_seqs)

    def execute(self, items: list[tuple[Sequence, int]]) -> tuple[torch.Tensor, list[Sequence]]:
        """Run one step; return float32 logits for the sequences that sample, in the order returned."""
        input_ids, positions, batch, sample_rows, sample_seqs = self.prepare(items)
        hidden = self.model(input_ids, positions, batch)
        if not sample_rows:
            return torch.empty(0, self.spec.vocab_size, device=self.device), []
        rows = torch.tensor(sample_rows, device=self.device)
        return self.model.logits(hidden.index_select(0, rows)), sample_seqs
