"""Triton implementations of the model's hot-path operations (CUDA; imported only there, or on the CPU under
TRITON_INTERPRET=1 for tests). Prefill attention reads the whole context, cached prefix included, back from
the paged cache: every chunk of a step in one kernel launch."""

from __future__ import annotations

import functools
import os

import torch
import triton
from torch import nn

from reference_engine.kernels import attention, triton_kernels
from reference_engine.kernels.attention import AttentionBatch
from reference_engine.kernels.ops import TorchOps, replace_linears

INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1"
DECODE_PARTITION = 64  # context tokens per decode program (at least; see decode_partition)
MAX_PARTITIONS = 64  # partitions one merge program can hold
DECODE_BLOCK_N = 64  # context tokens per inner step of decode attention
DECODE_NUM_WARPS = 2  # fewer, fuller warps: 15-20% faster than 4 on the H200 at batch 1 and 64 (7B, 13B)
DECODE_NUM_STAGES = 2
# Prefill attention: query rows (new tokens x the GQA group's heads) and keys per program step. All prefill
# chunks of a step go in one launch per layer: the per-chunk SDPA calls it replaced (with their gathers and
# masks) cost more host time than the GPU spent on the whole mixed step.
BATCHED_PREFILL = True  # False: one torch SDPA call per chunk and layer, as before (for A/B runs)
PREFILL_TILE_ROWS = 64
PREFILL_BLOCK_N = 64
PREFILL_NUM_WARPS, PREFILL_NUM_STAGES = 4, 2
GEMV_NUM_WARPS, GEMV_NUM_STAGES = 4, 3
USE_PDL = True  # programmatic dependent launch where the GPU has it (Hopper or later)
# Not for decode attention: PDL slowed its steps on the H200, both when it let the next kernel launch at its
# start (4-40% per call, decode_attention.py) and at its end (batch 64 +2%, 1B batch 1 +2%;
# attention-pdl-end.jsonl).
ATTENTION_PDL = False
# Batch 1 with GQA: the partition kernel, launched without PDL, lets the merge launch (with PDL) once all its
# programs have started, and the merge lets the next kernel (the o projection's GEMV) launch at its start
# (MERGE_LETS_NEXT_START). On the H200 (merge-pdl*.jsonl) the 1B's TPOT fell 2% (0.878 -> 0.858 ms); with MHA
# the 7B's and 13B's rose 2.6-4%, and at batch 64 every shape's rose 1.4-2.3%: hence one sequence and GQA
# only.
MERGE_PDL = True
MERGE_LETS_NEXT_START = True
# decode programs head-fastest: 1% faster steps at batch 64 (7B, 13B), same at batch 1
DECODE_HEADS_FIRST = True
GEMV_EPILOGUES = True  # at one row, SiLU * up and rotary + cache write run in the GEMV before them
# Products of more than one row through cuBLASLt rather than cuBLAS's default choice, for models at least this
# wide: batch-64 steps on the H200 1.0% (7B) and 1.9% (13B) faster, the 1B's (hidden 2048) 1.5% slower
# (cublaslt*.jsonl). torch's setting is the process's: `choose_blas_library` sets it for the model built last.
CUBLASLT_MIN_HIDDEN = 4096
# The GEMV loads its first step's tile of W before it waits for the kernel before it (with PDL, during that
# kernel's tail) where its rows are at least this long: on the H200 (gemv-preload.jsonl) batch-1 TPOT fell
# 0.5% for the 7B and 0.6% for the 13B (8-10 KB rows) and rose 0.5% for the 1B (4 KB rows, every product
# preloaded).
GEMV_PRELOAD_MIN_ROW_BYTES = 8192


@functools.cache
def _has_pdl(device_index: int) -> bool:
    return torch.cuda.get_device_capability(device_index)[0] >= 9


def _pdl(t: torch.Tensor, allowed: bool = True) -> dict:
    """The launch arguments for a kernel over tensors on t's device: programmatic dependent launch on Hopper
    or later, compiled (not under Triton's interpreter). Every kernel here takes the PDL flag; launch_pdl is
    Triton's launch option."""
    on = (
        allowed
        and USE_PDL
        and triton_kernels.HAS_PDL
        and t.is_cuda
        and not INTERPRETED
        and _has_pdl(t.device.index if t.device.index is not None else torch.cuda.current_device())
    )
    return {"PDL": True, "launch_pdl": True} if on else {"PDL": False}


def _query_rows(group: int) -> int:
    """Query rows per decode program: 1 for MHA (a vector kernel), else the GQA group padded to tl.dot's
    16."""
    if group == 1:
        return 1
    return max(16, triton.next_power_of_2(group))


def decode_partition(max_context: int) -> int:
    """Context tokens per program: a fixed split (64 tokens up to 4096 of context), so that a sequence is cut
    the same way whatever the batch, padded or not, eager or graph-captured, and its attention is the same to
    the bit. Small partitions cost little at large batch (the merge reads 1/64 of what the split reads) and
    give a batch of one enough programs to keep the GPU busy."""
    return max(DECODE_PARTITION, triton.next_power_of_2(-(-max_context // MAX_PARTITIONS)))


class TritonOps(TorchOps):
    name = "triton"

    def rms_norm(self, x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
        out = torch.empty_like(x)
        rows, cols = x.shape
        triton_kernels._rms_norm_kernel[(rows,)](
            x,
            x,
            weight,
            out,
            x.stride(0),
            x.stride(0),
            out.stride(0),
            cols,
            eps,
            HAS_RESIDUAL=False,
            BLOCK=triton.next_power_of_2(cols),
            **_pdl(x),
        )
        return out

    def add_rms_norm(
        self, x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Writes x + residual into `residual` (in place) and returns (its norm, residual)."""
        out = torch.empty_like(x)
        rows, cols = x.shape
        triton_kernels._rms_norm_kernel[(rows,)](
            x,
            residual,
            weight,
            out,
            x.stride(0),
            residual.stride(0),
            out.stride(0),
            cols,
            eps,
            HAS_RESIDUAL=True,
            BLOCK=triton.next_power_of_2(cols),
            **_pdl(x),
        )
        return out, residual

    def rope_and_write_kv(
        self,
        qkv: torch.Tensor,
        positions: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        slot_mapping: torch.Tensor,
        num_heads: int,
        num_kv_heads: int,
    ) -> torch.Tensor:
        tokens = qkv.shape[0]
        head_dim = k_cache.shape[-1]
        q = torch.empty(tokens, num_heads, head_dim, dtype=qkv.dtype, device=qkv.device)
        triton_kernels._rope_write_kv_kernel[(tokens,)](
            qkv,
            positions,
            cos,
            sin,
            q,
            k_cache,
            v_cache,
            slot_mapping,
            qkv.stride(0),
            cos.stride(0),
            q.stride(0),
            q.stride(1),
            k_cache.stride(0),
            k_cache.stride(1),
            k_cache.stride(2),
            NUM_HEADS=num_heads,
            NUM_KV_HEADS=num_kv_heads,
            HEADS_P2=triton.next_power_of_2(num_heads),
            KV_HEADS_P2=triton.next_power_of_2(num_kv_heads),
            HEAD_DIM=head_dim,
            BLOCK_SIZE=k_cache.shape[1],
            **_pdl(qkv),
        )
        return q

    def attend(
        self,
        q: torch.Tensor,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        batch: AttentionBatch,
        scale: float,
        out: torch.Tensor | None = None,
    ) -> torch.Tensor:
        out = torch.empty_like(q) if out is None else out
        nd = batch.num_decode
        if nd:
            self.decode_attention(
                q[:nd],
                k_cache,
                v_cache,
                batch.decode_block_tables,
                batch.decode_context_lens,
                batch.decode_max_context,
                scale,
                out[:nd],
                split_context=batch.decode_split_context,
            )
        if batch.prefill_batch is not None:
            self.prefill_attention(q, k_cache, v_cache, batch.prefill_batch, scale, out)
        else:
            for chunk in batch.prefills:
                rows = slice(chunk.start, chunk.start + chunk.num_tokens)
                out[rows] = attention.prefill_attention(q[rows], k_cache, v_cache, chunk, scale)
        return out

    def prefill_tile_tokens(self, group: int) -> int | None:
        return max(1, PREFILL_TILE_ROWS // triton.next_power_of_2(group)) if BATCHED_PREFILL else None

    def prefill_attention(
        self,
        q: torch.Tensor,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        prefills: attention.PrefillBatch,
        scale: float,
        out: torch.Tensor,
    ) -> None:
        """Every prefill chunk's queries over their paged contexts in one launch, into their rows of `out`."""
        kv_heads, head_dim = k_cache.shape[2], k_cache.shape[3]
        group = q.shape[1] // kv_heads
        tile_tokens = self.prefill_tile_tokens(group)
        tables = prefills.block_tables
        triton_kernels._prefill_attention_kernel[(prefills.tiles.shape[0], kv_heads)](
            q,
            k_cache,
            v_cache,
            out,
            tables,
            prefills.chunks,
            prefills.tiles,
            scale,
            prefills.max_context,
            q.stride(0),
            q.stride(1),
            k_cache.stride(0),
            k_cache.stride(1),
            k_cache.stride(2),
            tables.stride(0),
            out.stride(0),
            out.stride(1),
            BLOCK_SIZE=k_cache.shape[1],
            HEAD_DIM=head_dim,
            GROUP=group,
            GROUP_ROWS=triton.next_power_of_2(group),
            TILE_TOKENS=tile_tokens,
            BLOCK_N=PREFILL_BLOCK_N,
            DYNAMIC_LOOP=not INTERPRETED,
            PRECISION="ieee" if k_cache.dtype == torch.float32 else "tf32",
            num_warps=PREFILL_NUM_WARPS,
            num_stages=PREFILL_NUM_STAGES,
        )

    @staticmethod
    def decode_attention(
        q: torch.Tensor,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        block_tables: torch.Tensor,
        context_lens: torch.Tensor,
        max_context: int,
        scale: float,
        out: torch.Tensor,
        split_context: int = 0,
    ) -> None:
        """One query token per sequence over its paged context; `max_context` bounds the partitions launched
        (a CUDA graph passes the bound it was captured for); `split_context`, if given, sets the partition
        size in its place (graphs pass max_model_len, so that every capture cuts a sequence alike)."""
        seqs, heads, head_dim = q.shape
        kv_heads = k_cache.shape[2]
        group = heads // kv_heads
        block_n = DECODE_BLOCK_N
        partition = decode_partition(split_context or max_context)
        parts = triton.cdiv(max_context, partition)
        single = parts == 1
        part_out = torch.empty(
            seqs, heads, 1 if single else parts, head_dim, dtype=torch.float32, device=q.device
        )
        part_lse = torch.empty(seqs, heads, 1 if single else parts, dtype=torch.float32, device=q.device)
        launch = _pdl(q, ATTENTION_PDL)
        merge_launch = _pdl(q, ATTENTION_PDL or (MERGE_PDL and seqs == 1 and group > 1 and not single))
        # the partition kernel lets it launch at its start
        merge_early = merge_launch["PDL"] and not launch["PDL"]
        grid = (kv_heads, seqs, parts) if DECODE_HEADS_FIRST else (seqs, kv_heads, parts)
        triton_kernels._decode_partition_kernel[grid](
            q,
            k_cache,
            v_cache,
            block_tables,
            context_lens,
            part_out,
            part_lse,
            out,
            scale,
            q.stride(0),
            q.stride(1),
            k_cache.stride(0),
            k_cache.stride(1),
            k_cache.stride(2),
            block_tables.stride(0),
            part_out.stride(0),
            part_out.stride(1),
            part_out.stride(2),
            part_lse.stride(0),
            part_lse.stride(1),
            out.stride(0),
            out.stride(1),
            BLOCK_SIZE=k_cache.shape[1],
            HEAD_DIM=head_dim,
            GROUP=group,
            QUERY_ROWS=_query_rows(group),
            PARTITION=partition,
            BLOCK_N=min(block_n, partition),
            SINGLE=single,
            DYNAMIC_LOOP=not INTERPRETED,
            PRECISION="ieee" if k_cache.dtype == torch.float32 else "tf32",
            HEADS_FIRST=DECODE_HEADS_FIRST,
            MERGE_EARLY=merge_early,
            num_warps=DECODE_NUM_WARPS,
            num_stages=DECODE_NUM_STAGES,
            **launch,
        )
        if not single:
            triton_kernels._merge_partitions_kernel[(seqs, heads)](
                part_out,
                part_lse,
                context_lens,
                out,
                part_out.stride(0),
                part_out.stride(1),
                part_out.stride(2),
                part_lse.stride(0),
                part_lse.stride(1),
                out.stride(0),
                out.stride(1),
                HEAD_DIM=head_dim,
                PARTITION=partition,
                MAX_PARTS=triton.next_power_of_2(parts),
                NEXT_EARLY=merge_launch["PDL"] and MERGE_LETS_NEXT_START,
                **merge_launch,
            )

    def project_rope_and_write_kv(
        self,
        qkv_proj: nn.Module,
        x: torch.Tensor,
        positions: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        slot_mapping: torch.Tensor,
        num_heads: int,
        num_kv_heads: int,
    ) -> torch.Tensor:
        if GEMV_EPILOGUES and isinstance(qkv_proj, GemvLinear) and qkv_proj.takes(x):
            return qkv_proj.rope_and_write_kv(
                x, positions, cos, sin, k_cache, v_cache, slot_mapping, num_heads, num_kv_heads
            )
        return super().project_rope_and_write_kv(
            qkv_proj, x, positions, cos, sin, k_cache, v_cache, slot_mapping, num_heads, num_kv_heads
        )

    def project_silu_and_mul(self, gate_up_proj: nn.Module, x: torch.Tensor) -> torch.Tensor:
        if (
            GEMV_EPILOGUES
            and isinstance(gate_up_proj, GemvLinear)
            and gate_up_proj.takes(x)
            and (gate_up_proj.bias is None)
        ):
            return gate_up_proj.silu_and_mul(x)
        return super().project_silu_and_mul(gate_up_proj, x)

    def silu_and_mul(self, gate_up: torch.Tensor) -> torch.Tensor:
        rows, double = gate_up.shape
        cols = double // 2
        out = torch.empty(rows, cols, dtype=gate_up.dtype, device=gate_up.device)
        block = 1024
        triton_kernels._silu_and_mul_kernel[(rows, triton.cdiv(cols, block))](
            gate_up, out, gate_up.stride(0), out.stride(0), cols, BLOCK=block, **_pdl(gate_up)
        )
        return out


def gemv_suits(linear: nn.Linear) -> bool:
    """Single-row linears of the 1B, 7B and 13B shapes ran 5-34% faster on the GEMV (PDL and the tilings of
    `gemv_tiling`) than on cuBLAS on the H200 (`benchmarks/read_bandwidth.py --gemv-only --rows 1`). Rows must
    be whole 16-byte multiples, long enough for a 512-wide step."""
    return linear.in_features >= 512 and linear.in_features % 8 == 0


def gemv_tiling(weight: torch.Tensor) -> tuple[int, int, int]:
    """(rows of W per program, columns a step, bytes of each row asked into L2 before the wait), as measured
    fastest on the H200 for the three shapes' products (`read-bandwidth-gemv-pdl.json`):
    - 2 x 1024 where whole 1024-column steps cover the input (qkv, o, gate/up, LM head, the 1B's down), with
      the first step prefetched where rows are at least 8 KB (7B and 13B: 2-7% faster with it); on the 1B's
      4 KB rows it was 2% faster for qkv but 1-3% slower for o, gate/up and down and 7% for the LM head
      (125.2 against 117.1 us), so none there;
    - 4 x 512 otherwise (the 7B and 13B down projections, 11008 and 13824 wide), without a prefetch (1-2%
      slower with one)."""
    in_features, size = weight.shape[1], weight.element_size()
    if in_features % 1024:
        return 4, 512, 0
    # the bulk prefetch needs it
    aligned = (weight.stride(0) * size) % 16 == 0 and weight.data_ptr() % 16 == 0
    prefetch = 1024 * size if aligned and in_features * size >= 8192 else 0
    return 2, 1024, prefetch


class GemvLinear(nn.Module):
    """An nn.Linear (same parameters) whose single-row calls run the Triton GEMV; more rows go to cuBLAS."""

    def __init__(self, linear: nn.Linear) -> None:
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.weight, self.bias = linear.weight, linear.bias
        self.block_n, self.block_k, self.prefetch_bytes = gemv_tiling(linear.weight)
        # The epilogue kernels take rows in pairs (gate with up, rotary partners): block_n // 2 pairs keep the
        # plain GEMV's tile, and with it its order of summation and its bits.
        self.pairs = self.block_n // 2

    @staticmethod
    def takes(x: torch.Tensor) -> bool:
        """The GEMV serves a single row; more rows go to cuBLAS."""
        return x.dim() == 2 and x.shape[0] == 1

    def _launch(self, x: torch.Tensor) -> dict:
        """Launch arguments shared by the GEMV kernels: tiling, prefetch (only with PDL, which it serves), the
        first tile's early load, PDL."""
        pdl = _pdl(x)
        preload = self.in_features * self.weight.element_size() >= GEMV_PRELOAD_MIN_ROW_BYTES
        return dict(
            K=self.in_features,
            BLOCK_K=self.block_k,
            PREFETCH=self.prefetch_bytes if pdl["PDL"] else 0,
            PRELOAD=preload,
            num_warps=GEMV_NUM_WARPS,
            num_stages=GEMV_NUM_STAGES,
            **pdl,
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.takes(x):
            return nn.functional.linear(x, self.weight, self.bias)
        x = x.contiguous()
        y = torch.empty(1, self.out_features, dtype=x.dtype, device=x.device)
        bias = self.bias if self.bias is not None else y
        triton_kernels._gemv_kernel[(triton.cdiv(self.out_features, self.block_n),)](
            self.weight,
            x,
            bias,
            y,
            self.out_features,
            self.weight.stride(0),
            HAS_BIAS=self.bias is not None,
            BLOCK_N=self.block_n,
            **self._launch(x),
        )
        return y

    def silu_and_mul(self, x: torch.Tensor) -> torch.Tensor:
        """SiLU(gate) * up of this gate/up projection of one row x, in one kernel."""
        n = self.out_features // 2
        x = x.contiguous()
        y = torch.empty(1, n, dtype=x.dtype, device=x.device)
        triton_kernels._gemv_silu_and_mul_kernel[(triton.cdiv(n, self.pairs),)](
            self.weight, x, y, n, self.weight.stride(0), BLOCK_N=self.pairs, **self._launch(x)
        )
        return y

    def rope_and_write_kv(
        self,
        x: torch.Tensor,
        positions: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        slot_mapping: torch.Tensor,
        num_heads: int,
        num_kv_heads: int,
    ) -> torch.Tensor:
        """This qkv projection of one token x, then `TritonOps.rope_and_write_kv`, in one kernel; returns
        q."""
        head_dim = k_cache.shape[-1]
        pairs = self.pairs if (head_dim // 2) % self.pairs == 0 else 1  # a program's pairs lie in one head
        x = x.contiguous()
        q = torch.empty(1, num_heads, head_dim, dtype=x.dtype, device=x.device)
        bias = self.bias if self.bias is not None else q
        grid = ((num_heads + 2 * num_kv_heads) * (head_dim // 2) // pairs,)
        triton_kernels._gemv_rope_write_kv_kernel[grid](
            self.weight,
            x,
            bias,
            positions,
            cos,
            sin,
            q,
            k_cache,
            v_cache,
            slot_mapping,
            self.weight.stride(0),
            cos.stride(0),
            q.stride(1),
            k_cache.stride(0),
            k_cache.stride(1),
            k_cache.stride(2),
            HAS_BIAS=self.bias is not None,
            NUM_HEADS=num_heads,
            NUM_KV_HEADS=num_kv_heads,
            HEAD_DIM=head_dim,
            BLOCK_SIZE=k_cache.shape[1],
            PAIRS=pairs,
            **self._launch(x),
        )
        return q

    def extra_repr(self) -> str:
        return (
            f"in_features={self.in_features}, out_features={self.out_features}, Triton GEMV for one row "
            f"({self.block_n} x {self.block_k})"
        )


def choose_blas_library(hidden_size: int) -> str:
    """cuBLASLt for the multi-row products of a model at least CUBLASLT_MIN_HIDDEN wide, cuBLAS otherwise."""
    library = "cublaslt" if hidden_size >= CUBLASLT_MIN_HIDDEN else "cublas"
    if torch.cuda.is_available():
        torch.backends.cuda.preferred_blas_library(library)
    return library


def use_gemv_for_single_rows(model: nn.Module) -> int:
    """Wrap each nn.Linear that `gemv_suits` in a GemvLinear (parameters shared: a tied LM head stays tied);
    returns how many."""
    return replace_linears(model, GemvLinear, gemv_suits)
