"""CUDA graphs for steps that carry prompt tokens: everything but attention, replayed in pieces.

A decode step's whole forward pass is one graph (cuda_graphs.py): its shape is fixed by the number of
sequences and a context bound. A step with prompt chunks beside its decodes is not: how its tokens divide into
sequences changes attention's launch (decode rows, chunks, tiles) every step. Everything else in a layer (the
projections, norms, MLP, rotary and the cache write) sees only a flat batch of tokens. So, as vLLM does, the
forward pass is cut at attention into pieces (`LlamaModel.first_piece` / `piece`), each captured once per
token-count bucket; a step pads its tokens to the smallest bucket that holds them, replays piece 0, then for
each layer runs attention eagerly on the real rows and replays the next piece. Launching one graph per piece
instead of every kernel in it took the host's share out of such steps: served on the H200, a step carrying a
prompt ran eagerly at 2-2.5x a graphed decode step of the same batch (benchmarks/results/h200/...).

The pieces read and write fixed buffers: the token ids, positions and cache slots of the bucket (one host
copy), q (written by each piece, read by attention), attention's output (read by the next piece) and the
residual stream. Padded rows write no cache slot (slot -1) and are never attended; their rows of q and
attention's output hold stale, finite values that no real row reads (every op in a piece works row by row).
Steps larger than the largest bucket run eagerly: there the GPU's work outlasts the host's launches anyway.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from reference_engine.host_copy import to_device
from reference_engine.kernels.attention import AttentionBatch
from reference_engine.model import LlamaModel

log = logging.getLogger("reference_engine")

# Token counts captured by default: steps of a prompt chunk beside up to a few hundred decodes. Padding costs
# little where a step reads the weights once for all its rows (below a few hundred tokens), so the steps are
# coarser above 256; steps above 1024 tokens run eagerly (their GPU time hides the host's).
DEFAULT_TOKEN_SIZES = (16, 32, 64, 96, 128, 192, 256, 320, 384, 512, 640, 768, 1024)


def mixed_graph_sizes(max_num_batched_tokens: int, explicit: list[int] | None = None) -> list[int]:
    """The token counts to capture (the sizes given, else the defaults), up to max_num_batched_tokens and
    at least 2 (a step with a prompt chunk carries at least two tokens)."""
    sizes = DEFAULT_TOKEN_SIZES if explicit is None else explicit
    return sorted({s for s in sizes if 2 <= s <= max_num_batched_tokens})


@dataclass
class PiecewiseReport:
    sizes: list[int] = field(default_factory=list)
    graphs: int = 0
    seconds: float = 0.0
    pool_bytes: int = 0


class PiecewiseGraphRunner:
    """Captures and replays the model's pieces for each token-count bucket (one pool for all)."""

    def __init__(self, model: LlamaModel, device: torch.device, sizes: list[int]) -> None:
        self.model, self.device, self.sizes = model, device, sorted(sizes)
        spec, largest = model.spec, max(sizes)
        dtype = model.embed_tokens.weight.dtype
        # ids, positions and slots of the bucket: flat[:3 * size] viewed as [3, size], so that the one host
        # copy of a step lands in contiguous memory whatever its bucket
        self.flat_inputs = torch.zeros(3 * largest, dtype=torch.long, device=device)
        self.q = torch.zeros(largest, spec.num_heads, spec.head_dim, dtype=dtype, device=device)
        self.attended = torch.zeros_like(self.q)
        self.residual = torch.zeros(largest, spec.hidden_size, dtype=dtype, device=device)
        self.graphs: dict[int, list] = {}  # per bucket, one replayable graph per piece
        self.hidden: dict[int, torch.Tensor] = {}  # per bucket, the last piece's output (in the pool)
        self.report = PiecewiseReport(sizes=list(self.sizes))

    def inputs(self, size: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The bucket's token ids, positions and cache slots."""
        ids, positions, slots = self.flat_inputs[: 3 * size].view(3, size).unbind(0)
        return ids, positions, slots

    def run_piece(self, size: int, index: int) -> None:
        """Piece `index` of a step of `size` tokens, from and into the fixed buffers (what a graph holds)."""
        model = self.model
        ids, positions, slots = self.inputs(size)
        model.ops.begin_step()
        if index == 0:
            out, residual = model.first_piece(ids, positions, slots)
        else:
            out, residual = model.piece(index, self.attended[:size], self.residual[:size], positions, slots)
        if index == len(model.layers):
            self.hidden[size] = out
            return
        self.q[:size].copy_(out)
        if residual.data_ptr() != self.residual.data_ptr():  # the Triton norm adds into the buffer in place
            self.residual[:size].copy_(residual)

    @torch.inference_mode()
    def capture(self) -> PiecewiseReport:
        """Every piece of every bucket, largest bucket first, into one memory pool."""
        start = time.perf_counter()
        torch.cuda.synchronize(self.device)
        torch.cuda.empty_cache()
        reserved = torch.cuda.memory_reserved(self.device)
        pool = torch.cuda.graph_pool_handle()
        stream = torch.cuda.Stream(self.device)
        pieces = len(self.model.layers) + 1
        for size in reversed(self.sizes):
            # The warm-up runs below write no cache slot; token ids and positions stay 0 (the buckets' views
            # overlap, but taken largest first, no bucket's ids or positions lie where a larger one's slots
            # do).
            self.inputs(size)[2].fill_(-1)
            graphs = []
            for index in range(pieces):
                self.run_piece(size, index)  # first use outside the capture: workspaces, kernel selection
                graph = torch.cuda.CUDAGraph()
                # Begun and ended by hand, not through torch.cuda.graph, which collects garbage and empties
                # the cache at every capture: for hundreds of small graphs that would be most of the time.
                stream.wait_stream(torch.cuda.current_stream(self.device))
                with torch.cuda.stream(stream):
                    graph.capture_begin(pool=pool)
                    try:
                        self.run_piece(size, index)
                    finally:
                        graph.capture_end()
                torch.cuda.current_stream(self.device).wait_stream(stream)
                graphs.append(graph)
            self.graphs[size] = graphs
        torch.cuda.synchronize(self.device)
        report = self.report
        report.graphs = pieces * len(self.sizes)
        report.seconds = time.perf_counter() - start
        report.pool_bytes = torch.cuda.memory_reserved(self.device) - reserved
        return report

    def bucket_for(self, num_tokens: int) -> int | None:
        """The smallest captured bucket holding num_tokens (None: run eagerly)."""
        return next((size for size in self.sizes if size >= num_tokens and size in self.graphs), None)

    def run(
        self,
        input_ids: list[int],
        positions: list[int],
        slots: list[int],
        batch_for: Callable[[torch.Tensor], AttentionBatch],
        gather: tuple[torch.Tensor, list[int]] | None = None,
    ) -> torch.Tensor:
        """Hidden states [n, hidden] of a step of n tokens (a view, valid until the next replay):
        `batch_for(slot_mapping)` gives its attention batch (the rows' paging), built once for every
        layer. With `gather` (tokens on the device, and a row of them for each of the first k input rows),
        those rows' token ids are taken from there on the device (decodes queued behind the step in
        flight)."""
        n = len(input_ids)
        size = self.bucket_for(n)
        assert size is not None, f"no piecewise bucket holds {n} tokens"
        pad = size - n
        host = torch.tensor(
            [*input_ids, *[0] * pad, *positions, *[0] * pad, *slots, *[-1] * pad],
            dtype=torch.long,
            pin_memory=self.device.type == "cuda",
        )
        self.flat_inputs[: 3 * size].copy_(host, non_blocking=True)  # pinned: the caching allocator waits
        if gather is not None:
            rows = to_device(gather[1], self.device, torch.long)
            torch.index_select(gather[0], 0, rows, out=self.inputs(size)[0][: len(gather[1])])
        batch = batch_for(self.inputs(size)[2][:n])
        graphs = self.graphs[size]
        graphs[0].replay()
        for index, layer in enumerate(self.model.layers, start=1):
            layer.self_attn.attend(self.q[:n], batch, out=self.attended[:n])
            graphs[index].replay()
        return self.hidden[size][:n]
