"""The engine alone under served-like load: a closed loop of `add_request`/`step` at a fixed concurrency, no
HTTP, round after round, with every step's cost and what it paid for on first sight.

    python benchmarks/engine_closed_loop.py --shape llama-3.2-1b --concurrency 64 --requests 192 --rounds 3 \\
        --out results.jsonl

Each round keeps `--concurrency` requests in the engine (a finished one is replaced at once) until
`--requests` have finished: `--input-len` random-token prompts (fresh each round, so the prefix cache never
answers), exactly `--output-len` new tokens each (ignore_eos). Per step it records the host's wall time of
`step()` (with overlapped decode a step returns the previous model step's tokens, so this is the served
cadence), the step's composition (decode rows, prefill tokens), Triton kernels compiled during it and the CUDA
caching allocator's new device allocations and allocation retries (a retry frees every cached block and
synchronises). One JSON line per round: output tokens/s, step percentiles, and the steps that paid a first-use
cost, which is what an engine that says it is ready must already have paid.
"""

from __future__ import annotations

import argparse
import gc
import json
import platform
import random
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from knobs import add_set_option, set_knobs  # benchmarks/knobs.py, beside this script

from reference_engine.config import EngineConfig, SamplingParams
from reference_engine.engine import Engine

COMPILES: list[str] = []  # each compilation's kernel and specialisation, in order


def count_triton_compiles() -> None:
    """Record each Triton compilation's end time (a JIT cache miss in this process)."""
    try:
        from triton import knobs
    except ImportError:
        return

    def hook(*_args, **kwargs) -> None:
        COMPILES.append(str(kwargs.get("repr", "?")))

    knobs.runtime.jit_post_compile_hook = hook


def allocator_counts(device: torch.device) -> tuple[int, int, int]:
    """Device allocations, allocation retries (each frees the cache and synchronises), pinned host
    allocations."""
    if device.type != "cuda":
        return 0, 0, 0
    stats = torch.cuda.memory_stats(device)
    host = torch.cuda.host_memory_stats()
    return (
        stats.get("num_device_alloc", 0),
        stats.get("num_alloc_retries", 0),
        host.get("num_host_alloc", host.get("allocations.allocated", 0)),
    )


def run_round(
    engine: Engine,
    concurrency: int,
    total: int,
    input_len: int,
    output_len: int,
    rng: random.Random,
    profile_steps: range | None = None,
    profile_out: str | None = None,
) -> dict:
    vocab = engine.spec.vocab_size
    params = SamplingParams(max_tokens=output_len, temperature=0.0, ignore_eos=True)
    started = finished = tokens = 0
    live: set[str] = set()
    steps: list[dict] = []
    t_start = time.perf_counter()
    while finished < total:
        while len(live) < concurrency and started < total:
            prompt = [rng.randrange(3, vocab) for _ in range(input_len)]
            live.add(engine.add_request(prompt, params))
            started += 1
        batch_running = len(engine.scheduler.running)
        waiting = len(engine.scheduler.waiting)
        compiles_before = len(COMPILES)
        allocs_before, retries_before, host_before = allocator_counts(engine.device)
        if profile_steps is not None and len(steps) == profile_steps.start:
            activities = [torch.profiler.ProfilerActivity.CPU]
            if torch.cuda.is_available():
                activities.append(torch.profiler.ProfilerActivity.CUDA)
            prof = torch.profiler.profile(activities=activities)
            prof.__enter__()
        t0 = time.perf_counter()
        outputs = engine.step()
        dt = time.perf_counter() - t0
        if profile_steps is not None and len(steps) + 1 == profile_steps.stop:
            if torch.cuda.is_available():
                torch.cuda.synchronize()
            prof.__exit__(None, None, None)
            with open(profile_out, "w", encoding="utf-8") as f:
                prof.export_chrome_trace(f"{profile_out}.trace.json")
                keys = ("self_cuda_time_total", "self_cpu_time_total")
                for key in keys[0 if torch.cuda.is_available() else 1 :]:
                    table = prof.key_averages().table(sort_by=key, row_limit=40, max_name_column_width=70)
                    f.write(table + "\n")
        allocs, retries, host = allocator_counts(engine.device)
        for out in outputs:
            tokens += len(out.new_token_ids)
            if out.finished:
                live.discard(out.request_id)
                finished += 1
        steps.append(
            {
                "ms": dt * 1e3,
                "running": batch_running,
                "waiting": waiting,
                "out": len(outputs),
                "compiles": len(COMPILES) - compiles_before,
                "device_allocs": allocs - allocs_before,
                "alloc_retries": retries - retries_before,
                "host_allocs": host - host_before,
                "kernels": COMPILES[compiles_before:],
            }
        )
    wall = time.perf_counter() - t_start
    ms = sorted(s["ms"] for s in steps)
    slow = sorted(steps, key=lambda s: -s["ms"])[:8]
    return {
        "output_tokens_per_s": tokens / wall,
        "wall_s": wall,
        "steps": len(steps),
        "output_tokens": tokens,
        "step_ms_p50": statistics.median(ms),
        "step_ms_p90": ms[int(0.9 * (len(ms) - 1))],
        "step_ms_max": ms[-1],
        "step_ms_sum_with_compiles": sum(s["ms"] for s in steps if s["compiles"]),
        "steps_with_compiles": sum(1 for s in steps if s["compiles"]),
        "triton_compiles": sum(s["compiles"] for s in steps),
        "device_allocs": sum(s["device_allocs"] for s in steps),
        "alloc_retries": sum(s["alloc_retries"] for s in steps),
        "host_allocs": sum(s["host_allocs"] for s in steps),
        "steps_with_host_allocs": sum(1 for s in steps if s["host_allocs"]),
        "slowest_steps": slow,
        "timeline": [[round(s["ms"], 2), s["running"], s["waiting"], s["out"]] for s in steps],
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--shape", default="llama-3.2-1b")
    p.add_argument("--concurrency", type=int, nargs="+", default=[64])
    p.add_argument("--requests", type=int, default=192)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--input-len", type=int, default=512)
    p.add_argument("--output-len", type=int, default=128)
    p.add_argument("--max-num-seqs", type=int, default=None)
    p.add_argument("--max-num-batched-tokens", type=int, default=None)
    p.add_argument("--device", default="auto")
    p.add_argument(
        "--warm-up",
        choices=("auto", "on", "off"),
        default="auto",
        help="the engine's pre-serving warm-up of every eager step shape (auto: on for CUDA)",
    )
    p.add_argument(
        "--profile",
        default=None,
        metavar="ROUNDS:FIRST:LAST",
        help="torch.profiler over steps FIRST..LAST-1 of each round in ROUNDS (e.g. 1,2:20:120), "
        "first concurrency only",
    )
    p.add_argument("--profile-out", default="profile.txt")
    p.add_argument("--no-prefix-caching", action="store_true")
    p.add_argument(
        "--mixed-cudagraph-sizes",
        type=int,
        nargs="*",
        default=None,
        metavar="TOKENS",
        help="token buckets of the piecewise graphs for steps with prompt tokens (default: the "
        "engine's; given with no value: none, such steps run eagerly)",
    )
    p.add_argument("--gc-freeze", action="store_true", help="gc.freeze() after the engine is built")
    add_set_option(p)
    p.add_argument("--label", default="")
    p.add_argument("--out", default=None, help="JSON lines to append to")
    args = p.parse_args()
    knobs = set_knobs(args.set)
    count_triton_compiles()
    warm_up = {"auto": None, "on": True, "off": False}[args.warm_up]
    overrides_extra = {"enable_prefix_caching": False} if args.no_prefix_caching else {}
    overrides_extra["mixed_cuda_graph_sizes"] = args.mixed_cudagraph_sizes
    overrides = {
        k: v
        for k, v in (
            ("max_num_seqs", args.max_num_seqs),
            ("max_num_batched_tokens", args.max_num_batched_tokens),
        )
        if v is not None
    }
    t0 = time.perf_counter()
    engine = Engine(
        EngineConfig(
            model=f"random:{args.shape}", device=args.device, warm_up=warm_up, **overrides, **overrides_extra
        )
    )
    setup = {
        "compiled_at_setup": list(COMPILES),
        "engine_s": time.perf_counter() - t0,
        "phases": engine.setup.phases,
        "compiles_at_setup": len(COMPILES),
    }
    print(json.dumps(setup), flush=True)
    if args.gc_freeze:
        gc.collect()
        gc.freeze()
    rng = random.Random(0)
    lines = []
    for concurrency in args.concurrency:
        for r in range(args.rounds):
            window = None
            if args.profile and concurrency == args.concurrency[0]:
                rounds, first, last = args.profile.split(":")
                profiled = {int(x) for x in rounds.split(",")}
                window = range(int(first), int(last)) if r + 1 in profiled else None
            result = run_round(
                engine,
                concurrency,
                args.requests,
                args.input_len,
                args.output_len,
                rng,
                window,
                f"{args.profile_out}.round{r + 1}",
            )
            line = {
                "label": args.label,
                "knobs": knobs,
                "shape": args.shape,
                "concurrency": concurrency,
                "round": r + 1,
                "device": (
                    torch.cuda.get_device_name() if engine.device.type == "cuda" else platform.processor()
                ),
                "max_num_seqs": engine.config.max_num_seqs,
                "mixed_graph_sizes": engine.setup.mixed_graph_sizes,
                "max_num_batched_tokens": engine.config.max_num_batched_tokens,
                "setup": setup,
                **result,
            }
            summary = {
                k: (round(v, 2) if isinstance(v, float) else v)
                for k, v in line.items()
                if k not in ("slowest_steps", "setup", "timeline")
            }
            print(json.dumps(summary), flush=True)
            lines.append(line)
    if args.out:
        with open(args.out, "a", encoding="utf-8") as f:
            for line in lines:
                f.write(json.dumps(line) + "\n")


if __name__ == "__main__":
    main()
