"""Paged decode attention alone on the GPU: correctness against the torch reference on fresh random inputs,
then GPU time and achieved KV bandwidth for a sweep of launch settings (context tokens per program, tokens per
inner step, warps, stages), at the model shapes and batches of `decode_latency.py`.

    python benchmarks/decode_attention.py --out attention.jsonl
    # another version's kernels:
    python benchmarks/decode_attention.py --impl-root OLD_CHECKOUT --sweep default

Contexts are ragged around 576 tokens (the mean context of a 512 + 128 decode); the kernel is launched for
max_context 1024, as a captured CUDA graph launches it. Cache blocks are scattered at random over the cache;
`--layout in-order` gives each sequence consecutive blocks, as the engine's free list hands them to a fresh
batch (it measured the same, within 1%, on the H200). Several copies of the cache are cycled so that the L2
never holds the context, as in a real step where every layer reads its own cache. The calls for all copies are
captured in one CUDA graph and timed by its replays: the GPU's time per call, without Python's launch cost.
"""

from __future__ import annotations

import argparse
import functools
import json
import sys
from pathlib import Path

SHAPES = {  # heads, kv heads, head dim (Llama-3.2-1B, Llama-2-7B, Llama-2-13B)
    "llama-3.2-1b": (32, 8, 64),
    "llama-2-7b": (32, 32, 128),
    "llama-2-13b": (40, 40, 128),
}
KNOBS = (
    "DECODE_PARTITION",
    "DECODE_BLOCK_N",
    "DECODE_NUM_WARPS",
    "DECODE_NUM_STAGES",
    "ATTENTION_PDL",
    "DECODE_HEADS_FIRST",
)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--impl-root", default=str(Path(__file__).resolve().parents[1]))
    p.add_argument("--shapes", default=",".join(SHAPES))
    p.add_argument("--batches", default="1,8,64")
    p.add_argument("--sweep", default="full", choices=["full", "default", "order"])
    p.add_argument(
        "--layout",
        default="shuffled",
        choices=["in-order", "shuffled"],
        help="cache blocks of each sequence consecutive, as the engine's free list hands them out "
        "to a fresh batch (in-order), or scattered at random over the cache (shuffled)",
    )
    p.add_argument(
        "--cache-order",
        default="token-major",
        choices=["token-major", "head-major"],
        help="within a cache block, each token's heads side by side (the engine's [blocks, "
        "block_size, kv_heads, head_dim]) or each head's tokens side by side (a [blocks, "
        "kv_heads, block_size, head_dim] tensor, passed to the kernels as its permuted view: "
        "they take any strides)",
    )
    p.add_argument("--label", default="current")
    p.add_argument("--out", default=None)
    args = p.parse_args()
    sys.path.insert(0, args.impl_root)
    import torch
    import triton.testing

    block_size, max_context, copies = 16, 1024, 8

    from reference_engine.kernels import triton_ops
    from reference_engine.kernels.attention import AttentionBatch, paged_attention

    def run(q, k_cache, v_cache, tables, ctx, scale, res, copy: int) -> None:
        triton_ops.TritonOps.decode_attention(q, k_cache, v_cache, tables[copy], ctx, max_context, scale, res)

    if args.sweep == "full":
        grid = [
            (64, 64, 4, 2),
            (64, 64, 4, 3),
            (64, 64, 2, 2),
            (64, 32, 2, 2),
            (128, 128, 4, 2),
            (128, 128, 8, 2),
            (128, 64, 4, 3),
            (256, 128, 4, 3),
            (32, 32, 2, 2),
            (32, 32, 4, 2),
        ]
        grid = [(*knobs, False, False) for knobs in grid]
    elif args.sweep == "order":  # the grid's order (heads fastest or sequences), and PDL triggered at the end
        grid = [(64, 64, 2, 2, pdl, heads_first) for pdl in (False, True) for heads_first in (False, True)]
    else:  # every knob at the engine's setting
        grid = [(None,) * len(KNOBS)]
    defaults = {name: getattr(triton_ops, name, None) for name in KNOBS}  # None: a knob that version lacks
    dev = torch.device("cuda")
    out = Path(args.out).open("a") if args.out else None  # noqa: SIM115 (closed at exit)

    def graph_time_us(call, copies: int) -> float:
        """Median GPU time of one call, from replays of a graph holding one call per cache copy."""
        for c in range(copies):  # compile and warm up outside the capture
            call(c)
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            for c in range(copies):
                call(c)
        return 1e3 * triton.testing.do_bench(graph.replay, warmup=25, rep=100, return_mode="median") / copies

    for shape in args.shapes.split(","):
        heads, kv_heads, head_dim = SHAPES[shape]
        for batch in (int(b) for b in args.batches.split(",")):
            g = torch.Generator().manual_seed(batch)
            lens = torch.randint(512, 641, (batch,), generator=g)
            blocks = [-(-int(n) // block_size) for n in lens]
            per_copy = sum(blocks)
            if args.cache_order == "token-major":
                k_cache = torch.randn(
                    per_copy * copies, block_size, kv_heads, head_dim, device=dev, dtype=torch.bfloat16
                )
                v_cache = torch.randn_like(k_cache)
            else:
                k_cache, v_cache = (
                    torch.randn(
                        per_copy * copies, kv_heads, block_size, head_dim, device=dev, dtype=torch.bfloat16
                    ).transpose(1, 2)
                    for _ in range(2)
                )
            width = max_context // block_size
            tables = []
            for c in range(copies):
                order = (
                    torch.randperm(per_copy, generator=g)
                    if args.layout == "shuffled"
                    else torch.arange(per_copy)
                )
                perm = (order + c * per_copy).tolist()
                rows, at = [], 0
                for nb in blocks:
                    rows.append(perm[at : at + nb] + [0] * (width - nb))
                    at += nb
                tables.append(torch.tensor(rows, dtype=torch.int32, device=dev))
            ctx = lens.to(dev, torch.int32)
            q = torch.randn(batch, heads, head_dim, device=dev, dtype=torch.bfloat16)
            scale = head_dim**-0.5
            ref = paged_attention(
                q,
                k_cache,
                v_cache,
                AttentionBatch(
                    slot_mapping=torch.empty(0, dtype=torch.long, device=dev),
                    num_decode=batch,
                    decode_block_tables=tables[0].long(),
                    decode_context_lens=ctx,
                    decode_max_context=max_context,
                    decode_mask=(torch.arange(width * block_size, device=dev)[None, :] < ctx[:, None])[
                        :, None, None
                    ],
                ),
                scale,
            ).float()
            kv_bytes = 2 * int(lens.sum()) * kv_heads * head_dim * 2
            for knobs in grid:
                for name, value in zip(KNOBS, knobs, strict=True):  # None: the engine's setting
                    value = defaults[name] if value is None else value
                    if value is not None:
                        setattr(triton_ops, name, value)
                knobs = tuple(getattr(triton_ops, name, None) for name in KNOBS)
                res = torch.full_like(q, float("nan"))
                triton_ops.TritonOps.decode_attention(
                    q, k_cache, v_cache, tables[0], ctx, max_context, scale, res
                )
                err = ((res.float() - ref).norm() / ref.norm()).item()
                us = graph_time_us(
                    functools.partial(run, q, k_cache, v_cache, tables, ctx, scale, res), copies
                )
                row = dict(
                    label=args.label,
                    layout=args.layout,
                    cache_order=args.cache_order,
                    shape=shape,
                    batch=batch,
                    knobs=dict(zip(KNOBS, knobs, strict=True)),
                    us=us,
                    kv_tb_s=kv_bytes / us / 1e6,
                    rel_err=err,
                )
                print(
                    f"{args.label:>8} {shape:>13} b={batch:<3} {knobs}  {us:8.1f} us  "
                    f"{row['kv_tb_s']:5.2f} TB/s  err {err:.1e}",
                    flush=True,
                )
                if out:
                    out.write(json.dumps(row) + "\n")
                    out.flush()


if __name__ == "__main__":
    main()
