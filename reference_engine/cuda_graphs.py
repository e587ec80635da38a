"""CUDA-graph capture and replay of decode steps.

One graph per padded batch-size bucket, captured largest first into one shared memory pool (the smaller
graphs reuse the largest one's activation memory). Inputs live in static buffers; a batch of n sequences
replays the smallest bucket >= n, and the padded rows use slot -1 (their K/V are written nowhere) and a
one-token context. A graph fixes its kernels' grids, so decode attention is launched for a bound on the
context: max_model_len, so that one capture serves every length. With shorter bounds (`context_bounds`,
the server's --cudagraph-context-bounds; by default 1024 and each four times the last below max_model_len),
each batch size is captured again for each, and a step replays
the smallest bound that holds its longest context: attention's programs grow with the bound, and at
max_model_len 4096 and a 600-token context six in seven of them find no context. Every bound cuts a sequence
into the same partitions (sized by max_model_len), so the bits do not depend on the bound. The LM head runs
inside the graph; sampling runs outside it. Capture time per bucket and the pool's memory are measured for
the setup report.
"""

from __future__ import annotations

import gc
import logging
import time
from dataclasses import dataclass, field

import torch

from reference_engine.kernels.attention import AttentionBatch
from reference_engine.model import LlamaModel

log = logging.getLogger("reference_engine")

# Decode batch sizes captured by default: fine steps where padding a batch costs most, coarser above 64,
# where a decode step reads the weights once for all rows and 31 padded rows add little; and max_num_seqs.
DEFAULT_BUCKETS = (1, 2, 4, 8, 16, 24, 32, 48, 64)


# Context bounds captured by default: 1024 tokens, then four times the last, below max_model_len. Measured on
# an H200 (Llama-2-7B shape, max_model_len 4096, 512-token prompts, 128 new tokens, served by compare run):
# the 1024 bound raised output tokens/s by 22% at 64 streams and 20% at 128; capture: 1.5 s, 2.0 s without.
DEFAULT_FIRST_CONTEXT_BOUND = 1024
CONTEXT_BOUND_RATIO = 4


def graph_context_bounds(max_model_len: int, requested: list[int] | None) -> list[int]:
    """The context bounds graphs are captured for, shortest first: those requested (None: the default ladder)
    below max_model_len, and max_model_len. Each costs one more capture of every batch size at start-up."""
    if requested is None:
        requested, bound = [], DEFAULT_FIRST_CONTEXT_BOUND
        while bound < max_model_len:
            requested.append(bound)
            bound *= CONTEXT_BOUND_RATIO
    return sorted({bound for bound in requested if bound < max_model_len} | {max_model_len})


def graph_batch_sizes(max_num_seqs: int, explicit: list[int] | None = None) -> list[int]:
    """Buckets 1, 2, 4, 8, 16, 24, 32, 48, 64, then steps of 32 up to max_num_seqs, and max_num_seqs itself
    (or the sizes given)."""
    sizes = explicit or [*DEFAULT_BUCKETS, *range(96, max_num_seqs + 1, 32), max_num_seqs]
    return sorted({s for s in sizes if 1 <= s <= max_num_seqs})


@dataclass
class CaptureReport:
    warmup_seconds: float = 0.0  # eager steps at the largest and smallest size first: kernel compiles, cuBLAS
    # each bucket's own warm-up step + capture
    seconds_per_bucket: dict[int, float] = field(default_factory=dict)  # a batch size, all its bounds
    pool_bytes_per_bucket: dict[int, int] = field(default_factory=dict)  # pool growth when capturing each
    context_bounds: list[int] = field(default_factory=list)
    total_seconds: float = 0.0
    pool_bytes: int = 0


class CUDAGraphRunner:
    def __init__(
        self,
        model: LlamaModel,
        max_model_len: int,
        block_size: int,
        device: torch.device,
        context_bounds: list[int] | None = None,
    ) -> None:
        self.model = model
        self.max_model_len = max_model_len
        self.device = device
        self.max_blocks = -(-max_model_len // block_size)
        self.context_bounds = graph_context_bounds(max_model_len, context_bounds)
        # keyed by (batch size, context bound)
        self.graphs: dict[tuple[int, int], torch.cuda.CUDAGraph] = {}
        self.logits: dict[tuple[int, int], torch.Tensor] = {}
        self.report = CaptureReport()
        self.max_batch = 0

    def _alloc(self, max_batch: int) -> None:
        dev = self.device
        self.max_batch = max_batch
        # Token ids, positions, slots, context lengths and the rows to gather token ids from share one buffer:
        # one host-to-device copy a step.
        self.rows = torch.zeros(5, max_batch, dtype=torch.long, device=dev)
        self.rows[2] = -1
        self.rows[3] = 1
        (self.input_ids, self.positions, self.slot_mapping, self.context_lens, self.gather_rows) = (
            self.rows.unbind(0)
        )
        self.block_tables = torch.zeros(max_batch, self.max_blocks, dtype=torch.int32, device=dev)
        # Host staging, pinned so that the copies are asynchronous; two sets, used in turn, because with
        # overlapped decode the host fills the next step's while the last one's copy may still be queued.
        pin = dev.type == "cuda"  # (the staging logic also runs on a CPU, under tests, with stand-in graphs)
        self.host_rows = [torch.zeros(5, max_batch, dtype=torch.long, pin_memory=pin) for _ in range(2)]
        self.host_tables = [
            torch.zeros(max_batch, self.max_blocks, dtype=torch.int32, pin_memory=pin) for _ in range(2)
        ]
        self.num_runs = 0

    def _batch(self, size: int, bound: int) -> AttentionBatch:
        return AttentionBatch(
            slot_mapping=self.slot_mapping[:size],
            num_decode=size,
            decode_block_tables=self.block_tables[:size],
            decode_context_lens=self.context_lens[:size],
            decode_max_context=bound,
            decode_split_context=self.max_model_len,
        )

    def _forward(self, size: int, bound: int) -> torch.Tensor:
        hidden = self.model(self.input_ids[:size], self.positions[:size], self._batch(size, bound))
        return self.model.logits(hidden)

    @torch.inference_mode()
    def capture(self, sizes: list[int]) -> CaptureReport:
        # free unreachable tensors now, not during the capture, where they would read as negative growth
        gc.collect()
        self._alloc(max(sizes))
        pool = torch.cuda.graph_pool_handle()
        start = time.perf_counter()
        # First use of every kernel (Triton compiles or loads them, cuBLAS sets up) is start-up work of its
        # own, measured apart so that a bucket's time is what that bucket costs. The smallest size too: one
        # row runs kernels of its own (the single-row GEMV).
        for size in sorted({max(sizes), min(sizes)}, reverse=True):
            self._forward(size, self.max_model_len)
        torch.cuda.synchronize(self.device)
        self.report.warmup_seconds = time.perf_counter() - start
        for bound in reversed(self.context_bounds):
            for size in sorted(sizes, reverse=True):
                self._capture(size, bound, pool)
        self.report.context_bounds = list(self.context_bounds)
        self.report.total_seconds = time.perf_counter() - start
        self.report.pool_bytes = sum(self.report.pool_bytes_per_bucket.values())
        return self.report

    def _capture(self, size: int, bound: int, pool: tuple) -> None:
        t0 = time.perf_counter()
        torch.cuda.empty_cache()  # what stays reserved after this is the graphs' pool (and their outputs)
        reserved = torch.cuda.memory_reserved(self.device)
        self._forward(size, bound)  # warm-up: compiles kernels and sizes workspaces outside the capture
        torch.cuda.synchronize(self.device)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=pool):
            self.logits[size, bound] = self._forward(size, bound)
        torch.cuda.synchronize(self.device)
        torch.cuda.empty_cache()
        self.graphs[size, bound] = graph
        report = self.report
        report.seconds_per_bucket[size] = report.seconds_per_bucket.get(size, 0.0) + time.perf_counter() - t0
        report.pool_bytes_per_bucket[size] = (
            report.pool_bytes_per_bucket.get(size, 0) + torch.cuda.memory_reserved(self.device) - reserved
        )

    def bucket_for(self, n: int) -> int | None:
        """The smallest captured batch size that holds n rows (None: run eager)."""
        return min((size for size, _ in self.graphs if size >= n), default=None)

    def bound_for(self, longest_context: int) -> int:
        """The smallest captured context bound that holds the batch's longest context."""
        return next(bound for bound in self.context_bounds if bound >= longest_context)

    def run(
        self,
        input_ids: list[int],
        positions: list[int],
        slots: list[int],
        tables: list[list[int]],
        context_lens: list[int],
        gather: tuple[torch.Tensor, list[int]] | None = None,
    ) -> torch.Tensor:
        """Replay the bucket that fits these n decode rows; returns logits [n, vocab] (a view, valid until
        the next replay). With `gather` (tokens on the device, and a row of them for each of the first k input
        rows), those rows' token ids are taken from there on the device instead of from `input_ids`.

        Two runs may be queued at once (overlapped decode): the host staging alternates, and the caller
        must have waited for a run's outputs before the run after next."""
        n = len(input_ids)
        size = self.bucket_for(n)
        key = size, self.bound_for(max(context_lens))
        rows = self.host_rows[self.num_runs % 2]
        host_tables = self.host_tables[self.num_runs % 2]
        self.num_runs += 1
        rows[:4, :n] = torch.tensor([input_ids, positions, slots, context_lens])
        rows[2, n:size] = -1  # padded rows: no cache write, a one-token context over block 0
        rows[3, n:size] = 1
        if gather is not None:
            rows[4, : len(gather[1])] = torch.tensor(gather[1])
        width = max(len(t) for t in tables)
        host_tables[:n, :width] = torch.tensor(
            [t + [0] * (width - len(t)) for t in tables], dtype=torch.int32
        )
        host_tables[n:size, :width] = 0
        # Whole rows, so that both copies are contiguous: a strided one goes through a pageable temporary,
        # which can make the host wait for the device (stale entries past a row's length are never read).
        self.rows.copy_(rows, non_blocking=True)
        self.block_tables[:size].copy_(host_tables[:size], non_blocking=True)
        if gather is not None:
            k = len(gather[1])
            torch.index_select(gather[0], 0, self.gather_rows[:k], out=self.input_ids[:k])
        self.graphs[key].replay()
        return self.logits[key][:n]
