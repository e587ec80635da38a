"""Where a decode step's time goes on the GPU: host time per step (with and without overlapped decode) against
the GPU time of the graph replay alone, and a per-kernel breakdown of an eager step (torch profiler).

    python benchmarks/profile_decode.py --shape llama-2-7b --batches 1,64
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from reference_engine import Engine, EngineConfig, SamplingParams


def decoding_engine(shape: str, batch: int, eager: bool, overlap: bool = False) -> Engine:
    engine = Engine(
        EngineConfig(
            model=f"random:{shape}",
            device="cuda",
            dtype="bfloat16",
            max_num_seqs=64,
            max_model_len=1024,
            max_num_batched_tokens=64 * 512,
            num_kv_blocks=64 * 64 + 64,
            enforce_eager=eager,
            async_scheduling=overlap,
        )
    )
    g = torch.Generator().manual_seed(0)
    for prompt in torch.randint(3, engine.spec.vocab_size, (batch, 512), generator=g).tolist():
        engine.add_request(prompt, SamplingParams(max_tokens=400, temperature=0.0, ignore_eos=True))
    for _ in range(3):  # prefill, then decode steps (warm)
        engine.step()
    return engine


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--shape", default="llama-2-7b")
    p.add_argument("--batches", default="1,64")
    args = p.parse_args()
    for batch in (int(b) for b in args.batches.split(",")):
        host_ms = {}
        for overlap in (True, False):  # the synchronous engine last: its graphs are replayed below
            engine = decoding_engine(args.shape, batch, eager=False, overlap=overlap)
            host = []
            for _ in range(30):
                t = time.perf_counter()
                engine.step()
                host.append(time.perf_counter() - t)
            host_ms[overlap] = 1e3 * statistics.median(host)
            if overlap:
                del engine
                torch.cuda.empty_cache()
        runner = engine.runner.graphs
        size = runner.bucket_for(batch)
        gpu = []
        for _ in range(30):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            runner.graphs[size].replay()
            end.record()
            torch.cuda.synchronize()
            gpu.append(start.elapsed_time(end))
        print(
            f"{args.shape} batch {batch}: step {host_ms[False]:.3f} ms on the host clock "
            f"({host_ms[True]:.3f} ms with overlapped decode), graph replay {statistics.median(gpu):.3f} "
            "ms on the GPU clock",
            flush=True,
        )
        del engine, runner
        torch.cuda.empty_cache()
        engine = decoding_engine(args.shape, batch, eager=True)
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(5):
                engine.step()
            torch.cuda.synchronize()
        print(
            prof.key_averages().table(sort_by="cuda_time_total", row_limit=14, max_name_column_width=60),
            flush=True,
        )
        del engine
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
