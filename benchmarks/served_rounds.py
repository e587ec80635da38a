"""Our server under closed-loop load, round after round on one launch: what the first round after "ready" pays
that later rounds do not, and where the serving layer's time goes.

    python benchmarks/served_rounds.py --model random:llama-3.2-1b --concurrency 64 --requests 192 \\
        --rounds 3 --out results.jsonl [--py-spy-round 2 --py-spy-out profile.txt] \\
        [--server-args "--no-engine-process"]

It launches `python -m reference_engine.server` on 127.0.0.1 (or drives `--url`), sends token-id prompts of
`--input-len` random tokens (fresh each round: no prefix-cache hits) for exactly `--output-len` tokens, with
the project's load generator, and prints one JSON line per round: output tokens/s, TTFT, TPOT and ITL
percentiles, the number of inter-token gaps over 50 and 250 ms. With `--py-spy-round`, py-spy samples the
server process (every thread of it and of its engine-core child, idle included, GIL holder marked) during that
round and writes collapsed stacks, the input of a flame graph, so the served step's host time can be
attributed.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shlex
import statistics
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from adapters import get_adapter
from adapters.request_spec import RequestSpec
from workloads import timing
from workloads.loadgen import PointJob, run_load_sync
from workloads.schedule import ClosedLoop


def wait_ready(url: str, proc: subprocess.Popen | None, timeout_s: float) -> float:
    start = time.perf_counter()
    while time.perf_counter() - start < timeout_s:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"the server exited with {proc.returncode} before it was ready")
        try:
            with urllib.request.urlopen(f"{url}/health", timeout=2) as resp:
                if resp.status == 200:
                    return time.perf_counter() - start
        except OSError:
            pass
        time.sleep(0.2)
    raise TimeoutError(f"{url} not ready after {timeout_s} s")


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else float("nan")


def summarise(records: list, wall_s: float) -> dict:
    ok = [r for r in records if r.error_kind is None and not r.warmup]
    tokens = sum(r.event_tokens for r in ok)
    ttfts = [t for r in ok if (t := timing.ttft(r)) is not None]
    tpots = [t for r in ok if (t := timing.tpot(r)) is not None]
    gaps = [g for r in ok for g in timing.itl(r)]
    return {
        "requests_ok": len(ok),
        "requests_failed": len(records) - len(ok),
        "output_tokens": tokens,
        "output_tokens_per_s": tokens / wall_s,
        "wall_s": wall_s,
        "ttft_ms_p50": 1e3 * statistics.median(ttfts),
        "ttft_ms_p99": 1e3 * percentile(ttfts, 0.99),
        "tpot_ms_p50": 1e3 * statistics.median(tpots),
        "tpot_ms_p99": 1e3 * percentile(tpots, 0.99),
        "itl_ms_p50": 1e3 * statistics.median(gaps),
        "itl_ms_p99": 1e3 * percentile(gaps, 0.99),
        "itl_ms_max": 1e3 * max(gaps),
        "gaps_over_50ms": sum(g > 0.05 for g in gaps),
        "gaps_over_250ms": sum(g > 0.25 for g in gaps),
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", default="random:llama-3.2-1b")
    p.add_argument("--url", default=None, help="drive a running server instead of launching one")
    p.add_argument("--port", type=int, default=8011)
    p.add_argument("--server-args", default="")
    p.add_argument("--concurrency", type=int, nargs="+", default=[64])
    p.add_argument("--requests", type=int, default=192)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--input-len", type=int, default=512)
    p.add_argument("--output-len", type=int, default=128)
    p.add_argument(
        "--vocab", type=int, default=None, help="token ids are drawn below this (default: /v1/models)"
    )
    p.add_argument("--py-spy-round", type=int, default=None)
    p.add_argument("--py-spy-out", default="py-spy.txt")
    p.add_argument("--server-log", default="server.log")
    p.add_argument("--label", default="")
    p.add_argument("--out", default=None)
    args = p.parse_args()
    proc = None
    url = args.url or f"http://127.0.0.1:{args.port}"
    launched = time.perf_counter()
    if args.url is None:
        cmd = [
            sys.executable,
            "-m",
            "reference_engine.server",
            "--model",
            args.model,
            "--port",
            str(args.port),
            "--max-num-seqs",
            str(max(64, *args.concurrency)),
            *shlex.split(args.server_args),
        ]
        log = open(args.server_log, "w", encoding="utf-8")  # noqa: SIM115 (open for the server's life)
        proc = subprocess.Popen(
            cmd,
            stdout=log,
            stderr=subprocess.STDOUT,
            env={
                **os.environ,
                "PYTHONPATH": os.pathsep.join(
                    filter(None, [str(Path(__file__).resolve().parents[1]), os.environ.get("PYTHONPATH")])
                ),
            },
        )
    try:
        ready_s = wait_ready(url, proc, 600)
        print(
            json.dumps({"ready_s": round(time.perf_counter() - launched, 2), "polled_s": round(ready_s, 2)}),
            flush=True,
        )
        vocab = args.vocab or 32000
        adapter = get_adapter("reference", prompt_as_token_ids=True, force_output_length=True)
        rng = random.Random(0)
        for concurrency in args.concurrency:
            for r in range(1, args.rounds + 1):
                specs = [
                    RequestSpec(
                        f"c{concurrency}-r{r}-{i}",
                        tuple(rng.randrange(3, vocab) for _ in range(args.input_len)),
                        "",
                        args.output_len,
                    )
                    for i in range(args.requests)
                ]
                spy = None
                if args.py_spy_round == r and proc is not None:
                    spy = subprocess.Popen(
                        [
                            "py-spy",
                            "record",
                            "--pid",
                            str(proc.pid),
                            "--format",
                            "raw",
                            "--idle",
                            "--threads",
                            "--gil",
                            "--subprocesses",
                            "--rate",
                            "200",
                            "--nonblocking",
                            "-o",
                            args.py_spy_out,
                        ],
                        stdout=subprocess.DEVNULL,
                        stderr=subprocess.DEVNULL,
                    )
                    time.sleep(1.0)
                t0 = time.perf_counter()
                records = run_load_sync(PointJob(url, adapter, specs, ClosedLoop(concurrency)))
                wall = time.perf_counter() - t0
                if spy is not None:
                    spy.send_signal(2)
                    spy.wait(timeout=60)
                line = {
                    "label": args.label,
                    "model": args.model,
                    "concurrency": concurrency,
                    "round": r,
                    **{
                        k: round(v, 2) if isinstance(v, float) else v
                        for k, v in summarise(records, wall).items()
                    },
                }
                print(json.dumps(line), flush=True)
                if args.out:
                    with open(args.out, "a", encoding="utf-8") as f:
                        f.write(json.dumps(line) + "\n")
    finally:
        if proc is not None:
            proc.terminate()
            proc.wait(timeout=60)


if __name__ == "__main__":
    main()
