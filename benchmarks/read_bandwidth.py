"""How fast the GPU can read, and how fast cuBLAS reads weights in a decode step's matrix products: the floor
under a memory-bound decode step, to set beside its TPOT.

    python benchmarks/read_bandwidth.py --out read-bandwidth.json
    python benchmarks/read_bandwidth.py --gemv-only --rows 1 --out read-bandwidth-gemv-pdl.json

- copy: device-to-device copy, bytes read + written per second (the roofline's bandwidth in decode_latency);
- read: a Triton kernel that only reads (sums a 4 GiB buffer), and torch.sum over the same buffer;
- gemm: y = x @ W.T in bf16 for each linear of the Llama-3.2-1B, Llama-2-7B and Llama-2-13B shapes at the rows
  asked (1 and 64 by default), weights read per second: cuBLAS as the model calls it, cuBLAS on the transposed
  layout; at one row torch.mv, the engine's GEMV over a few tilings, each launched plainly, with programmatic
  dependent launch (PDL), and with PDL and the first 2 KB (or the whole) of each row asked into L2 before the
  wait, and a GEMV for the transposed layout; above one row a Triton skinny GEMM (`--gemv-only`: cuBLAS as
  called and the engine's GEMV only; `--splitk-only`: cuBLAS as called and a split-K Triton GEMM, checked
  against a float32 product first). Eight copies of each weight in turn, so that none is served from L2,
  captured in a CUDA graph as a decode step is (so each GEMV launch follows another, as in a step).

read-bandwidth.json and read-bandwidth-rows16-64.json (benchmarks/results/h200) were measured by this script
as it was in commits bbe4cb2 and bb4c48b, whose GEMV was a copy of the engine's with the input length a
run-time argument; it now launches the engine's kernel itself (read-bandwidth-gemv-pdl.json, at 1579df6).
"""

from __future__ import annotations

import argparse
import functools
import json
import statistics
import sys
from pathlib import Path

import torch
import triton
import triton.language as tl

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from decode_latency import copy_bandwidth

from reference_engine.kernels.triton_kernels import _gemv_kernel
from reference_engine.model_config import named_shape


@triton.jit
def _read_kernel(x_ptr, out_ptr, n, BLOCK: tl.constexpr, ITERS: tl.constexpr):
    """Each program reads ITERS consecutive blocks and writes one partial sum (so the reads cannot be
    elided)."""
    base = tl.program_id(0).to(tl.int64) * BLOCK * ITERS
    acc = tl.zeros([BLOCK], tl.float32)
    for i in range(ITERS):
        offs = base + i * BLOCK + tl.arange(0, BLOCK)
        acc += tl.load(x_ptr + offs, mask=offs < n, other=0.0).to(tl.float32)
    tl.store(out_ptr + tl.program_id(0), tl.sum(acc, axis=0))


@triton.jit
def _gemv_in_major_kernel(
    wt_ptr, x_ptr, y_ptr, n, k, stride_wt, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, SPLIT_K: tl.constexpr
):
    """y = x W with W stored (in, out): each program reads BLOCK_N columns over 1/SPLIT_K of the rows; split
    programs add into a float32 y (atomics: order-dependent rounding, a probe of the speed only)."""
    cols = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    k_len = tl.cdiv(k, SPLIT_K)
    k_start = tl.program_id(1) * k_len
    acc = tl.zeros([BLOCK_K, BLOCK_N], tl.float32)
    for k0 in range(k_start, k_start + k_len, BLOCK_K):
        ks = k0 + tl.arange(0, BLOCK_K)
        k_mask = ks < k
        w = tl.load(
            wt_ptr + ks[:, None].to(tl.int64) * stride_wt + cols[None, :],
            mask=k_mask[:, None] & (cols[None, :] < n),
            other=0.0,
        )
        acc += w.to(tl.float32) * tl.load(x_ptr + ks, mask=k_mask, other=0.0).to(tl.float32)[:, None]
    y = tl.sum(acc, axis=0)
    if SPLIT_K == 1:
        tl.store(y_ptr + cols, y.to(y_ptr.dtype.element_ty), mask=cols < n)
    else:
        tl.atomic_add(y_ptr + cols, y, mask=cols < n)


@triton.jit
def _splitk_gemm_kernel(
    x_ptr,
    w_ptr,
    y_ptr,
    part_ptr,
    count_ptr,
    m,
    n,
    stride_x,
    stride_w,
    stride_y,
    K: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    SPLIT_K: tl.constexpr,
):
    """y = x W^T for a few rows x (all in one BLOCK_M tile), W stored (out, in), on the tensor cores; K a
    multiple of BLOCK_K. Program (tile, split) streams BLOCK_N rows of W once, over 1/SPLIT_K of the input, so
    that even a 4096-wide output gives every SM programs (SPLIT_K = 1: the plain skinny GEMM). With SPLIT_K >
    1 each writes its float32 partial sums; the last of a tile's programs to finish (an atomic count, which it
    resets) adds them in split order: the same bits whichever finished last, and no second kernel. A row's
    result does not depend on the other rows (no choice by row count)."""
    tile = tl.program_id(0)
    split = tl.program_id(1)
    offs_m = tl.arange(0, BLOCK_M)
    offs_n = tile * BLOCK_N + tl.arange(0, BLOCK_N)
    m_mask = offs_m < m
    n_mask = offs_n < n
    acc = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
    k_len: tl.constexpr = (K // BLOCK_K + SPLIT_K - 1) // SPLIT_K * BLOCK_K
    for k0 in range(0, k_len, BLOCK_K):
        offs_k = split * k_len + k0 + tl.arange(0, BLOCK_K)
        if K % (SPLIT_K * BLOCK_K) == 0:  # every split the same length
            x_mask = m_mask[:, None]
            w_mask = n_mask[:, None]
        else:  # the last split is shorter: its steps past K load nothing (and add zeros)
            x_mask = m_mask[:, None] & (offs_k[None, :] < K)
            w_mask = n_mask[:, None] & (offs_k[None, :] < K)
        x = tl.load(x_ptr + offs_m[:, None] * stride_x + offs_k[None, :], mask=x_mask, other=0.0)
        w = tl.load(w_ptr + offs_n[:, None].to(tl.int64) * stride_w + offs_k[None, :], mask=w_mask, other=0.0)
        acc = tl.dot(x, tl.trans(w), acc)
    y_rows = y_ptr + offs_m[:, None] * stride_y + offs_n[None, :]
    y_mask = m_mask[:, None] & n_mask[None, :]
    if SPLIT_K == 1:
        tl.store(y_rows, acc.to(y_ptr.dtype.element_ty), mask=y_mask)
    else:
        parts = part_ptr + offs_m[:, None] * n + offs_n[None, :]  # [SPLIT_K, BLOCK_M, n], float32
        tl.store(parts + split * BLOCK_M * n, acc, mask=y_mask)
        # Publish: every thread's stores, then one release by the counter (the CTA barrier orders the other
        # threads' stores before it). The program that brings the count to SPLIT_K adds the partial sums.
        tl.debug_barrier()
        if tl.atomic_add(count_ptr + tile, 1, sem="acq_rel") == SPLIT_K - 1:
            total = tl.load(parts, mask=y_mask, other=0.0, cache_modifier=".cg")
            for s in tl.static_range(1, SPLIT_K):
                total += tl.load(parts + s * BLOCK_M * n, mask=y_mask, other=0.0, cache_modifier=".cg")
            tl.store(y_rows, total.to(y_ptr.dtype.element_ty), mask=y_mask)
            # ready for the next launch (a graph replays the same counters)
            tl.atomic_xchg(count_ptr + tile, 0)


SKINNY_CONFIGS = (
    (32, 128, 4, 4),
    (64, 128, 4, 4),
    (64, 64, 4, 5),
    (32, 256, 4, 3),
    (64, 256, 4, 3),
    (128, 64, 4, 5),
    (128, 128, 8, 3),
    (16, 256, 4, 4),
)


IN_MAJOR_CONFIGS = (
    (32, 256, 4, 3, 1),
    (16, 256, 4, 3, 1),
    (64, 128, 4, 3, 1),
    (32, 128, 4, 4, 1),
    (32, 512, 8, 3, 1),
    (64, 256, 4, 3, 2),
    (128, 128, 4, 3, 4),
    (64, 128, 4, 4, 4),
    (128, 64, 4, 4, 8),
)


# (rows, columns a step, warps, stages, launch): launch "plain", "pdl" (programmatic dependent launch) or
# "pdl_prefetch" (PDL, and each program's rows asked into L2 before it waits for the kernel before it).
GEMV_TILINGS = ((8, 512, 4, 3), (4, 512, 4, 3), (2, 1024, 4, 3), (16, 512, 4, 3))
GEMV_CONFIGS = (
    *((*tiling, launch) for tiling in GEMV_TILINGS for launch in ("plain", "pdl", "pdl_prefetch")),
    (8, 512, 4, 3, "pdl_prefetch_whole"),
)
GEMV_PREFETCH_BYTES = 2048  # of each row, in "pdl_prefetch"


def gpu_seconds(fn, repeats: int = 30, warmup: int = 5) -> float:
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end) / 1e3)
    return statistics.median(times)


def graph_seconds(fn, repeats: int = 30) -> float:
    """GPU time of fn from replays of a CUDA graph of it: without the host's launch cost, which at these sizes
    is longer than the kernels."""
    fn()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    return gpu_seconds(graph.replay, repeats)


def read_bandwidths(gib: float = 4.0) -> dict[str, float]:
    n = int(gib * 2**30) // 2
    x = torch.randn(n, dtype=torch.bfloat16, device="cuda")
    best = {}
    for block, iters, warps in ((4096, 8, 8), (8192, 4, 8), (2048, 16, 4), (8192, 16, 16)):
        grid = triton.cdiv(n, block * iters)
        out = torch.empty(grid, dtype=torch.float32, device="cuda")
        launch = functools.partial(
            _read_kernel[(grid,)], x, out, n, BLOCK=block, ITERS=iters, num_warps=warps
        )
        best[f"triton_read_{block}x{iters}_w{warps}"] = 2 * n / gpu_seconds(launch)
    best["torch_sum"] = 2 * n / gpu_seconds(x.sum)
    return best


def linear_shapes(shape: str) -> dict[str, tuple[int, int]]:
    """(out_features, in_features) of each decode-step linear, fused the way our model fuses them."""
    spec = named_shape(shape)
    return {
        "qkv": ((spec.num_heads + 2 * spec.num_kv_heads) * spec.head_dim, spec.hidden_size),
        "o": (spec.hidden_size, spec.num_heads * spec.head_dim),
        "gate_up": (2 * spec.intermediate_size, spec.hidden_size),
        "down": (spec.hidden_size, spec.intermediate_size),
        "lm_head": (spec.vocab_size, spec.hidden_size),
    }


# (columns of W a program, input a step, splits of the input, warps, stages) for the split-K GEMM
SPLITK_CONFIGS = (
    (64, 128, 1, 4, 4),
    (64, 128, 2, 4, 4),
    (64, 128, 4, 4, 4),
    (64, 64, 4, 4, 6),
    (64, 128, 8, 4, 4),
    (128, 128, 2, 4, 3),
    (128, 128, 4, 4, 3),
    (128, 64, 4, 8, 4),
    (32, 128, 2, 4, 4),
    (32, 128, 4, 4, 4),
)


def gemm_bandwidths(
    shape: str, rows: int, copies: int = 8, gemv_only: bool = False, splitk_only: bool = False
) -> dict[str, dict[str, float]]:
    """Per linear and variant (see the module's docstring): GPU time and weights read per second; `gemv_only`
    measures only cuBLAS as called and the engine's GEMV, `splitk_only` cuBLAS as called and the split-K
    GEMM."""
    result = {}
    for name, (out_f, in_f) in linear_shapes(shape).items():
        weights = [torch.randn(out_f, in_f, dtype=torch.bfloat16, device="cuda") for _ in range(copies)]
        x = torch.randn(rows, in_f, dtype=torch.bfloat16, device="cuda")
        variants = {
            "linear": functools.partial(_each, functools.partial(torch.nn.functional.linear, x), weights)
        }
        y = torch.empty(rows, out_f, dtype=torch.bfloat16, device="cuda")
        transposed = []
        if splitk_only and rows > 1:
            block_m = max(16, triton.next_power_of_2(rows))
            parts = torch.empty(8 * block_m * out_f, dtype=torch.float32, device="cuda")
            counts = torch.zeros(triton.cdiv(out_f, 32), dtype=torch.int32, device="cuda")
            reference = torch.nn.functional.linear(x.float(), weights[-1].float())  # the last one launched
            for bn, bk, split, warps, stages in SPLITK_CONFIGS:
                if in_f % bk:
                    continue
                launch = functools.partial(
                    _splitk_each, x, weights, y, parts, counts, bn, bk, split, warps, stages
                )
                launch()
                err = ((y.float() - reference).norm() / reference.norm()).item()
                assert err < 1e-2, f"split-K GEMM {bn}x{bk} split {split}: relative error {err:.1e}"
                variants[f"triton_splitk_{bn}x{bk}_k{split}_w{warps}_s{stages}"] = launch
        elif not gemv_only:
            transposed = [w.t().contiguous() for w in weights]
            variants["x_at_w_kn"] = functools.partial(_each, functools.partial(torch.matmul, x), transposed)
            if rows > 1:
                for bn, bk, warps, stages in SKINNY_CONFIGS:
                    if in_f % bk:
                        continue
                    launch = functools.partial(_skinny_each, x, weights, y, bn, bk, warps, stages)
                    variants[f"triton_skinny_{bn}x{bk}_w{warps}_s{stages}"] = launch
            else:
                variants["mv"] = functools.partial(_each, lambda w, v=x[0]: torch.mv(w, v), weights)
                y32 = torch.zeros(out_f, dtype=torch.float32, device="cuda")
                for bn, bk, warps, stages, split in IN_MAJOR_CONFIGS:
                    launch = functools.partial(
                        _gemv_in_major_each,
                        transposed,
                        x[0],
                        y32 if split > 1 else y[0],
                        bn,
                        bk,
                        warps,
                        stages,
                        split,
                    )
                    variants[f"triton_in_major_{bn}x{bk}_w{warps}_s{stages}_split{split}"] = launch
        if rows == 1:
            for bn, bk, warps, stages, launch_mode in GEMV_CONFIGS:
                launch = functools.partial(
                    _gemv_each, weights, x[0], y[0], bn, bk, warps, stages, launch_mode
                )
                suffix = "" if launch_mode == "plain" else f"_{launch_mode}"
                variants[f"triton_gemv_{bn}x{bk}_w{warps}_s{stages}{suffix}"] = launch
        bytes_read = out_f * in_f * 2
        result[name] = {"bytes": bytes_read}
        for variant, fn in variants.items():
            seconds = graph_seconds(fn) / copies
            result[name][variant] = {"us": seconds * 1e6, "bytes_per_s": bytes_read / seconds}
        del weights, transposed
    return result


def _each(fn, weights) -> None:
    for w in weights:
        fn(w)


def _gemv_in_major_each(transposed, x, y, bn, bk, warps, stages, split) -> None:
    for wt in transposed:
        if split > 1:
            y.zero_()
        _gemv_in_major_kernel[(triton.cdiv(wt.shape[1], bn), split)](
            wt,
            x,
            y,
            wt.shape[1],
            wt.shape[0],
            wt.stride(0),
            BLOCK_N=bn,
            BLOCK_K=bk,
            SPLIT_K=split,
            num_warps=warps,
            num_stages=stages,
        )


def _skinny_each(x, weights, y, bn, bk, warps, stages) -> None:
    """The split-K GEMM at one split: no partial sums, so y stands in for their buffers."""
    _splitk_each(x, weights, y, y, y, bn, bk, 1, warps, stages)


def _splitk_each(x, weights, y, parts, counts, bn, bk, split, warps, stages) -> None:
    for w in weights:
        _splitk_gemm_kernel[(triton.cdiv(w.shape[0], bn), split)](
            x,
            w,
            y,
            parts,
            counts,
            x.shape[0],
            w.shape[0],
            x.stride(0),
            w.stride(0),
            y.stride(0),
            K=w.shape[1],
            BLOCK_M=max(16, triton.next_power_of_2(x.shape[0])),
            BLOCK_N=bn,
            BLOCK_K=bk,
            SPLIT_K=split,
            num_warps=warps,
            num_stages=stages,
        )


def _gemv_each(weights, x, y, bn, bk, warps, stages, launch_mode) -> None:
    """The engine's single-row GEMV (reference_engine/kernels/triton_kernels.py) at one tiling and launch
    mode, without the early load of its first tile (PRELOAD; measured end to end in gemv-preload.jsonl)."""
    pdl = launch_mode != "plain"
    whole_row = weights[0].shape[1] * weights[0].element_size()
    prefetch = {"pdl_prefetch": GEMV_PREFETCH_BYTES, "pdl_prefetch_whole": whole_row}.get(launch_mode, 0)
    for w in weights:
        _gemv_kernel[(triton.cdiv(w.shape[0], bn),)](
            w,
            x,
            y,
            y,
            w.shape[0],
            w.stride(0),
            K=w.shape[1],
            HAS_BIAS=False,
            BLOCK_N=bn,
            BLOCK_K=bk,
            PDL=pdl,
            PREFETCH=prefetch,
            PRELOAD=False,
            launch_pdl=pdl,
            num_warps=warps,
            num_stages=stages,
        )


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--shapes", default="llama-3.2-1b,llama-2-7b,llama-2-13b")
    p.add_argument("--rows", default="1,64")
    p.add_argument("--out", required=True)
    p.add_argument("--gemv-only", action="store_true", help="cuBLAS as called and the engine's GEMV only")
    p.add_argument("--splitk-only", action="store_true", help="cuBLAS as called and the split-K GEMM only")
    args = p.parse_args()
    report = {
        "gpu": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "triton": triton.__version__,
        "copy_bytes_per_s": copy_bandwidth(),
        "read_bytes_per_s": read_bandwidths(),
        "gemm": {},
    }
    rows_measured = [int(r) for r in args.rows.split(",")]
    for shape in args.shapes.split(","):
        report["gemm"][shape] = {
            str(rows): gemm_bandwidths(shape, rows, gemv_only=args.gemv_only, splitk_only=args.splitk_only)
            for rows in rows_measured
        }
    Path(args.out).write_text(json.dumps(report, indent=1))
    print(f"copy {report['copy_bytes_per_s'] / 1e12:.2f} TB/s (read + write)")
    for name, bw in report["read_bytes_per_s"].items():
        print(f"read {name}: {bw / 1e12:.2f} TB/s")
    for shape, by_rows in report["gemm"].items():
        for rows, gemms in by_rows.items():
            for name, g in gemms.items():
                timings = {k: v for k, v in g.items() if k != "bytes"}
                best = min(timings, key=lambda k: timings[k]["us"])
                bests = []
                for family in ("triton_in_major", "triton_skinny", "triton_splitk"):
                    members = [k for k in timings if k.startswith(family)]
                    if members:
                        bests.append(min(members, key=lambda k: timings[k]["us"]))
                cells = ", ".join(
                    f"{k} {v['us']:.1f}"
                    for k, v in timings.items()
                    if not k.startswith("triton") or k == best or k in bests
                )
                print(
                    f"{shape} rows={rows} {name} ({g['bytes'] / 1e6:.0f} MB): {cells} us; best {best} "
                    f"{timings[best]['bytes_per_s'] / 1e12:.2f} TB/s"
                )


if __name__ == "__main__":
    main()
