"""Turns a scheduled batch into tensors, runs the model over the paged KV cache, and returns the logits to
sample.

The flat batch puts single-token steps (decodes) first and prefill chunks after. A decode-only batch that fits
a captured bucket replays a CUDA graph; everything else runs eagerly. Either way the step's host lists reach
the device through pinned memory without a stream synchronisation, so the host queues step N+1 while the
device still runs step N.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from reference_engine.cuda_graphs import CaptureReport, CUDAGraphRunner, graph_batch_sizes
from reference_engine.host_copy import lists_to_device, to_device
from reference_engine.kernels.attention import (
    AttentionBatch,
    PrefillBatch,
    PrefillChunk,
    decode_mask,
    prefill_batch_lists,
)
from reference_engine.kernels.cpu_linear import onednn_linear_available, pack_linears
from reference_engine.kernels.dispatch import ops_for
from reference_engine.loader import ResolvedModel, build_model
from reference_engine.piecewise_graphs import PiecewiseGraphRunner, PiecewiseReport, mixed_graph_sizes
from reference_engine.sequence import Sequence

# decode attention's partition: contexts 64 * 2^k reach every partition count it compiles
DECODE_WARM_CONTEXT = 64


@dataclass
class StepInputs:
    """One step's inputs as host lists, in flat-batch order (decodes first)."""

    input_ids: list[int] = field(default_factory=list)
    positions: list[int] = field(default_factory=list)
    slots: list[int] = field(default_factory=list)
    decode_tables: list[list[int]] = field(default_factory=list)
    decode_lens: list[int] = field(default_factory=list)
    prefills: list[tuple[int, int, int, list[int]]] = field(default_factory=list)  # start, n, context, table
    sample_rows: list[int] = field(default_factory=list)
    sample_seqs: list[Sequence] = field(default_factory=list)

    def add(self, token_ids: list[int], start: int, table: list[int], block_size: int) -> int:
        """Append one sequence's new tokens at positions start, start+1, ... (a decode for one token, else a
        prefill chunk); returns the flat row of its last token."""
        bs, n = block_size, len(token_ids)
        offset = len(self.input_ids)
        self.input_ids.extend(token_ids)
        self.positions.extend(range(start, start + n))
        self.slots.extend(table[p // bs] * bs + p % bs for p in range(start, start + n))
        if n == 1:
            self.decode_tables.append(table)
            self.decode_lens.append(start + 1)
        else:
            self.prefills.append((offset, n, start + n, table))
        return offset + n - 1


def step_inputs(items: list[tuple[Sequence, int]], block_size: int) -> StepInputs:
    ordered = [it for it in items if it[1] == 1] + [it for it in items if it[1] > 1]
    step = StepInputs()
    for seq, n in ordered:
        start = seq.num_computed_tokens
        last = step.add(seq.token_ids[start : start + n], start, seq.block_table, block_size)
        if start + n == len(seq):
            step.sample_rows.append(last)
            step.sample_seqs.append(seq)
    return step


def lookahead_inputs(
    seqs: list[Sequence], block_size: int, admitted: list[tuple[Sequence, int]] | None = None
) -> StepInputs:
    """A decode step for sequences whose next token is still being sampled on the device: each feeds the
    token at position `num_computed_tokens`, whose id the device fills in (overlapped decode); positions,
    slots and block tables do not depend on it. `admitted`: requests admitted beside them with their number
    of new prompt tokens (known on the host), after the decode rows (one-token chunks first, as decodes)."""
    bs = block_size
    step = StepInputs()
    for row, seq in enumerate(seqs):
        pos = seq.num_computed_tokens
        table = seq.block_table
        step.input_ids.append(0)
        step.positions.append(pos)
        step.slots.append(table[pos // bs] * bs + pos % bs)
        step.decode_tables.append(table)
        step.decode_lens.append(pos + 1)
        step.sample_rows.append(row)
        step.sample_seqs.append(seq)
    for seq, n in sorted(admitted or [], key=lambda item: item[1] > 1):
        start = seq.num_computed_tokens
        last = step.add(seq.token_ids[start : start + n], start, seq.block_table, bs)
        if start + n == len(seq):
            step.sample_rows.append(last)
            step.sample_seqs.append(seq)
    return step


class ModelRunner:
    def __init__(
        self,
        resolved: ResolvedModel,
        device: torch.device,
        dtype: torch.dtype,
        max_model_len: int,
        block_size: int,
        seed: int,
        kernels: str = "auto",
        cpu_linear: str = "onednn",
    ) -> None:
        self.device, self.dtype, self.block_size = device, dtype, block_size
        self.max_model_len = max_model_len
        self.spec = resolved.spec
        self.ops = ops_for(device, kernels, dtype)
        self.model = build_model(resolved, max_model_len, device, dtype, self.ops, seed)
        self.weights_bytes = sum(p.numel() * p.element_size() for p in self.model.parameters())
        self.packed_linears = 0
        if self.ops.name == "triton":  # on CUDA, or under Triton's interpreter on the CPU (tests)
            from reference_engine.kernels.triton_ops import choose_blas_library, use_gemv_for_single_rows

            use_gemv_for_single_rows(self.model)
            choose_blas_library(self.spec.hidden_size)
        elif cpu_linear == "onednn" and onednn_linear_available(device, dtype):
            tied = self.model.lm_head.weight is self.model.embed_tokens.weight
            self.packed_linears = pack_linears(self.model)
            if tied:  # the LM head's packed copy is memory the dense embedding does not share
                self.weights_bytes += self.model.lm_head.weight_bytes
        self.num_blocks = 0
        self.graphs: CUDAGraphRunner | None = None
        self.mixed_graphs: PiecewiseGraphRunner | None = None

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

    @torch.inference_mode()
    def profile_activation_bytes(self, max_num_batched_tokens: int) -> int:
        """Peak memory of the largest step the scheduler may run (a prefill of max_num_batched_tokens, split
        into sequences of at most max_model_len), beyond weights and its own small KV cache; measured, not
        estimated, so the KV cache can take the rest of the GPU."""
        lengths = []
        left = max_num_batched_tokens
        while left > 0:
            lengths.append(min(left, self.max_model_len))
            left -= lengths[-1]
        blocks = [-(-n // self.block_size) for n in lengths]
        self.allocate_kv_cache(sum(blocks))
        torch.cuda.synchronize(self.device)
        torch.cuda.reset_peak_memory_stats(self.device)
        base = torch.cuda.memory_allocated(self.device)
        step, first = StepInputs(), 0
        for n, nb in zip(lengths, blocks, strict=True):
            table = list(range(first, first + nb))
            offset = len(step.input_ids)
            step.input_ids.extend([1] * n)
            step.positions.extend(range(n))
            step.slots.extend(
                table[p // self.block_size] * self.block_size + p % self.block_size for p in range(n)
            )
            step.prefills.append((offset, n, n, table))
            step.sample_rows.append(offset + n - 1)
            first += nb
        self.run(step)  # prefills never replay a graph: the eager step the scheduler may run
        torch.cuda.synchronize(self.device)
        peak = torch.cuda.max_memory_allocated(self.device) - base
        self.allocate_kv_cache(0)
        torch.cuda.empty_cache()
        return peak

    @torch.inference_mode()
    def warm_up(self, max_num_seqs: int, max_num_batched_tokens: int) -> int:
        """Run each kind of eager step the scheduler can make once, before serving, so that no request pays
        for a kernel compiled on first sight: without it the first mixed steps served on the H200 took
        0.7-1.8 s (Triton compiling decode attention for eager batches). Decode attention compiles a variant
        per number of partitions of the longest context (a power of two) and for one sequence or several; the
        token count's parity moves the positions' alignment; prefill chunks start a sequence (causal) or
        continue it (masked). The largest step leaves the allocator holding the memory such steps need. The
        cache's contents are zeroed again afterwards. Returns the number of steps run."""
        bs = self.block_size
        limit = min(self.max_model_len, self.num_blocks * bs)
        contexts = sorted({min(DECODE_WARM_CONTEXT << k, limit) for k in range(limit.bit_length())} - {0})
        chunk = min(16, limit // 2)
        prefills = [(0, chunk), (chunk, chunk)] if chunk else []
        shapes: list[tuple[int, int, list[tuple[int, int]]]] = []  # (decode rows, their context, prefills)
        if prefills:
            shapes.append((0, 0, prefills))
        for ctx in contexts:
            for rows in (1, 2):
                shapes.append((rows, ctx, []))
                if prefills:
                    shapes.append((rows, ctx, prefills))
        rows = max(1, min(max_num_seqs - 1, max_num_batched_tokens // 2))
        rest = min(max_num_batched_tokens - rows, limit)
        if rest > 1:
            shapes.append((rows, limit, [(0, rest)]))
            shapes.append((0, 0, [(0, rest)]))
            if limit - rest > 0:
                shapes.append((rows, limit, [(limit - rest, rest)]))
        graphs, self.graphs = self.graphs, None  # eager steps only: graph replays were warmed at capture
        try:
            for decodes, ctx, prefills in shapes:
                self.run(self._synthetic_step(decodes, ctx, prefills))
        finally:
            self.graphs = graphs
        for layer in self.model.layers:
            layer.self_attn.k_cache.zero_()
            layer.self_attn.v_cache.zero_()
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        return len(shapes)

    def _synthetic_step(self, decodes: int, context: int, prefills: list[tuple[int, int]]) -> StepInputs:
        """A step of `decodes` sequences at `context` tokens and prefill chunks (start, tokens), every
        sequence on the cache's first blocks; token ids drawn at random."""
        bs = self.block_size
        step = StepInputs()
        for start, n in [(context - 1, 1)] * decodes + prefills:
            table = list(range(-(-(start + n) // bs)))
            step.sample_rows.append(
                step.add(torch.randint(self.spec.vocab_size, (n,)).tolist(), start, table, bs)
            )
        return step

    def capture_cuda_graphs(
        self, max_num_seqs: int, sizes: list[int] | None = None, context_bounds: list[int] | None = None
    ) -> CaptureReport:
        self.graphs = CUDAGraphRunner(
            self.model, self.max_model_len, self.block_size, self.device, context_bounds
        )
        return self.graphs.capture(graph_batch_sizes(max_num_seqs, sizes))

    def capture_mixed_graphs(
        self, max_num_batched_tokens: int, sizes: list[int] | None = None
    ) -> PiecewiseReport:
        """Graphs of the pieces between attention calls, for steps that carry prompt tokens."""
        chosen = mixed_graph_sizes(max_num_batched_tokens, sizes)
        if not chosen:
            return PiecewiseReport()
        self.mixed_graphs = PiecewiseGraphRunner(self.model, self.device, chosen)
        return self.mixed_graphs.capture()

    def execute(self, items: list[tuple[Sequence, int]]) -> tuple[torch.Tensor, list[Sequence]]:
        """Run one step; return float32 logits for the sequences that sample, in the order returned."""
        step = step_inputs(items, self.block_size)
        return self.run(step), step.sample_seqs

    def run(self, step: StepInputs, gather: tuple[torch.Tensor, list[int]] | None = None) -> torch.Tensor:
        """Logits of the step's sampling rows. `gather`: token ids on the device and, for each of the step's
        first k rows (decodes queued behind the step in flight), which of them is its input, so that the host
        need not wait for them; the other rows' ids are the step's own."""
        if self.graphs is not None and not step.prefills and self.graphs.bucket_for(len(step.input_ids)):
            logits = self.graphs.run(
                step.input_ids, step.positions, step.slots, step.decode_tables, step.decode_lens, gather
            )
            rows = step.sample_rows
            if len(rows) < logits.shape[0]:
                logits = logits[to_device(rows, self.device, torch.long)]
            return logits
        if self.mixed_graphs is not None and self.mixed_graphs.bucket_for(len(step.input_ids)):
            hidden = self.mixed_graphs.run(
                step.input_ids,
                step.positions,
                step.slots,
                lambda slots: self.attention_batch(step, slots),
                gather,
            )
            return self._sampled_logits(hidden, step.sample_rows)
        gathered = gather[1] if gather is not None else []
        input_ids, positions, slots, sample_rows, gather_rows = lists_to_device(
            [step.input_ids, step.positions, step.slots, step.sample_rows, gathered], self.device, torch.long
        )
        if gather is not None:
            input_ids[: len(gathered)] = gather[0].index_select(0, gather_rows)
        hidden = self.model(input_ids, positions, self.attention_batch(step, slots))
        return self._sampled_logits(hidden, sample_rows)

    def _sampled_logits(self, hidden: torch.Tensor, rows: torch.Tensor | list[int]) -> torch.Tensor:
        if not len(rows):
            return torch.empty(0, self.spec.vocab_size, device=self.device)
        if isinstance(rows, list):
            rows = to_device(rows, self.device, torch.long)
        return self.model.logits(hidden.index_select(0, rows))

    def attention_batch(self, step: StepInputs, slot_mapping: torch.Tensor) -> AttentionBatch:
        """The step's paging on the device: block tables, context lengths and prefill chunks (int32), in one
        copy."""
        dev = self.device
        width = max((len(t) for t in step.decode_tables), default=0)
        tables = [block for t in step.decode_tables for block in t + [0] * (width - len(t))]
        tile_tokens = self.ops.prefill_tile_tokens(self.spec.num_heads // self.spec.num_kv_heads)
        if step.prefills and tile_tokens is not None:  # the ops attend every chunk in one launch
            chunks, prefill_tables, tiles, prefill_width = prefill_batch_lists(step.prefills, tile_tokens)
            tables, decode_lens, chunks, prefill_tables, tiles = lists_to_device(
                [tables, step.decode_lens, chunks, prefill_tables, tiles], dev, torch.int32
            )
            prefill_tables = prefill_tables.view(len(step.prefills), prefill_width)
            batch = AttentionBatch(
                slot_mapping=slot_mapping,
                num_decode=len(step.decode_lens),
                prefills=[
                    PrefillChunk(start, n, ctx, prefill_tables[i, : len(table)])
                    for i, (start, n, ctx, table) in enumerate(step.prefills)
                ],
                prefill_batch=PrefillBatch(
                    chunks.view(-1, 3),
                    prefill_tables,
                    tiles.view(-1, 2),
                    max(ctx for _, _, ctx, _ in step.prefills),
                ),
            )
        else:
            prefill_tables = [table for _, _, _, table in step.prefills]
            tables, decode_lens, *prefill_tables = lists_to_device(
                [tables, step.decode_lens, *prefill_tables], dev, torch.int32
            )
            batch = AttentionBatch(
                slot_mapping=slot_mapping,
                num_decode=len(step.decode_lens),
                prefills=[
                    PrefillChunk(start, n, ctx, table)
                    for (start, n, ctx, _), table in zip(step.prefills, prefill_tables, strict=True)
                ],
            )
        if step.decode_lens:
            batch.decode_block_tables = tables.view(len(step.decode_tables), width)
            batch.decode_context_lens = decode_lens
            batch.decode_max_context = max(step.decode_lens)
            if self.ops.name == "torch":
                batch.decode_mask = decode_mask(batch.decode_context_lens, width * self.block_size)
        return batch
