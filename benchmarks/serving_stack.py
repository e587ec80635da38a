"""The reference server's serving stack alone: HTTP front end, engine loop and streaming, with a model whose
step's arithmetic is small (`random:tiny` on the CPU), so what limits throughput is host code.

    python benchmarks/serving_stack.py --label before-inprocess
    python benchmarks/serving_stack.py --label after-engine-process --server-arg=--engine-process

A real `python -m reference_engine.server` runs on 127.0.0.1; the project's load generator drives it in a
closed loop at each concurrency with fixed-length prompts and outputs (`ignore_eos` + `min_tokens`, so every
request runs its full length). Per load point it reports output tok/s over the point's wall time, ITL p50/p99,
engine steps per second and seconds inside a step (the server's /metrics counters), and the server's CPU
time per streamed token (all its processes, and split into the front end's process and its children's).
Results: benchmarks/results/serving_stack/<label>.json, and every result's table in table.md.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import statistics
import sys
import tempfile
import time
from pathlib import Path

import psutil
import requests
from prometheus_client.parser import text_string_to_metric_families

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from servers import reference_server

from adapters import get_adapter
from reference_engine.model_config import named_shape
from reference_engine.tokenizer import synthetic_tokenizer
from workloads import timing
from workloads.datasets import random_dataset
from workloads.loadgen import PointJob, run_load_sync
from workloads.schedule import ClosedLoop

MODEL = "random:tiny"
STEP_COUNTERS = ("reference:engine_steps_total", "reference:engine_step_seconds_total")


def scrape(url: str) -> dict[str, float]:
    """The engine-step counters from /metrics."""
    text = requests.get(url + "/metrics", timeout=10).text
    found = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name in STEP_COUNTERS:
                found[sample.name] = sample.value
    return found


def server_cpu_seconds(pid: int) -> tuple[float, float]:
    """User + system CPU seconds of the server's own process, and of every process it started (the engine
    core, when it runs in one)."""
    root = psutil.Process(pid)
    own, children = 0.0, 0.0
    for proc in [root, *root.children(recursive=True)]:
        try:
            times = proc.cpu_times()
        except psutil.NoSuchProcess:
            continue
        if proc.pid == pid:
            own += times.user + times.system
        else:
            children += times.user + times.system
    return own, children


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def measure(url: str, pid: int, specs, concurrency: int, tokenizer) -> dict:
    adapter = get_adapter("reference", model=MODEL)
    before, cpu_before = scrape(url), server_cpu_seconds(pid)
    start = time.perf_counter()
    records = run_load_sync(PointJob(url, adapter, specs, ClosedLoop(concurrency), tokenizer=tokenizer))
    wall = time.perf_counter() - start
    after, cpu_after = scrape(url), server_cpu_seconds(pid)
    front_cpu, child_cpu = (cpu_after[i] - cpu_before[i] for i in range(2))
    ok = [r for r in records if r.error_kind is None]
    out_tokens = sum(r.output_tokens or 0 for r in ok)
    itls = [gap for r in ok for gap in timing.itl(r)]
    steps = after[STEP_COUNTERS[0]] - before[STEP_COUNTERS[0]]
    step_seconds = after[STEP_COUNTERS[1]] - before[STEP_COUNTERS[1]]
    return dict(
        concurrency=concurrency,
        requests=len(records),
        ok=len(ok),
        output_tokens=out_tokens,
        wall_s=round(wall, 3),
        output_tok_s=round(out_tokens / wall, 1),
        itl_p50_ms=round(1e3 * statistics.median(itls), 3),
        itl_p99_ms=round(1e3 * percentile(itls, 0.99), 3),
        steps=int(steps),
        steps_per_s=round(steps / wall, 1),
        step_us=round(1e6 * step_seconds / max(1, steps), 1),
        server_cpu_s=round(front_cpu + child_cpu, 3),
        server_cpu_us_per_token=round(1e6 * (front_cpu + child_cpu) / max(1, out_tokens), 1),
        front_cpu_us_per_token=round(1e6 * front_cpu / max(1, out_tokens), 1),
        child_cpu_us_per_token=round(1e6 * child_cpu / max(1, out_tokens), 1),
    )


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--label", required=True)
    p.add_argument("--out", default="benchmarks/results/serving_stack")
    p.add_argument("--concurrency", default="64,256")
    p.add_argument(
        "--requests-per-stream", type=int, default=2, help="requests per load point = this x concurrency"
    )
    p.add_argument("--input-len", type=int, default=32)
    p.add_argument("--output-len", type=int, default=256)
    p.add_argument("--server-arg", action="append", default=[], help="extra server flag (repeatable)")
    args = p.parse_args()
    tokenizer = synthetic_tokenizer(named_shape("tiny"))
    concurrencies = [int(x) for x in args.concurrency.split(",")]
    server_flags = [
        "--device",
        "cpu",
        "--dtype",
        "float32",
        "--max-num-seqs",
        str(max(concurrencies)),
        "--max-num-batched-tokens",
        str(max(2048, args.input_len * max(concurrencies))),
        "--max-model-len",
        str(args.input_len + args.output_len + 16),
        *args.server_arg,
    ]
    rows = []
    work = Path(tempfile.mkdtemp(prefix="serving-stack-"))
    load_before = os.getloadavg()
    with reference_server(MODEL, work, *server_flags) as server:
        warmup = random_dataset(tokenizer, 8, args.input_len, 16, seed=99, id_prefix="warmup")
        run_load_sync(PointJob(server.url, get_adapter("reference", model=MODEL), warmup, ClosedLoop(8)))
        for i, c in enumerate(concurrencies):
            # Fresh prompts per point, so no point is served from the prefix cache the previous one filled.
            specs = random_dataset(
                tokenizer,
                args.requests_per_stream * c,
                args.input_len,
                args.output_len,
                seed=i,
                id_prefix=f"c{c}",
            )
            row = measure(server.url, server.proc.pid, specs, c, tokenizer)
            rows.append(row)
            print(json.dumps(row), flush=True)
    meta = dict(
        label=args.label,
        machine=platform.platform(),
        cpus=os.cpu_count(),
        python=platform.python_version(),
        command=" ".join([Path(sys.argv[0]).as_posix(), *sys.argv[1:]]),
        date=time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        model=MODEL,
        input_len=args.input_len,
        output_len=args.output_len,
        server_flags=server_flags,
        load_average_before=[round(x, 2) for x in load_before],
        load_average_after=[round(x, 2) for x in os.getloadavg()],
    )
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{args.label}.json").write_text(json.dumps(dict(meta=meta, rows=rows), indent=1) + "\n")
    write_table(out)


def write_table(out: Path) -> None:
    """The table of every result in `out` (table.md), for the README to quote."""
    lines = [
        "| label | streams | output tok/s | ITL p50 ms | ITL p99 ms | steps/s | us in a step | server "
        "CPU us/token | of which front end / core | load avg (1 min) before |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for path in sorted(out.glob("*.json")):
        result = json.loads(path.read_text())
        meta = result["meta"]
        for r in result["rows"]:
            split = (
                f"{r['front_cpu_us_per_token']:.1f} / {r['child_cpu_us_per_token']:.1f}"
                if "front_cpu_us_per_token" in r
                else "-"
            )
            lines.append(
                f"| {meta['label']} | {r['concurrency']} | {r['output_tok_s']:.0f} | "
                f"{r['itl_p50_ms']:.2f} | {r['itl_p99_ms']:.2f} | {r['steps_per_s']:.1f} | "
                f"{r['step_us']:.0f} | {r['server_cpu_us_per_token']:.1f} | {split} | "
                f"{meta['load_average_before'][0]} |"
            )
    lines += ["", *median_table(out)]
    (out / "table.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


def median_table(out: Path) -> list[str]:
    """Medians over the rounds of each setup (labels that differ only in a `-r<k>` suffix)."""
    groups: dict[tuple[str, int], list[dict]] = {}
    for path in sorted(out.glob("*.json")):
        result = json.loads(path.read_text())
        label = re.sub(r"-r\d+$", "", result["meta"]["label"])
        for r in result["rows"]:
            groups.setdefault((label, r["concurrency"]), []).append(r)
    lines = [
        "| setup | streams | rounds | output tok/s (median) | ITL p50 ms | ITL p99 ms | steps/s | "
        "server CPU us/token |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for (label, streams), rows in groups.items():

        def med(key: str, rows=rows) -> float:
            return statistics.median(r[key] for r in rows)

        lines.append(
            f"| {label} | {streams} | {len(rows)} | {med('output_tok_s'):.0f} | "
            f"{med('itl_p50_ms'):.2f} | {med('itl_p99_ms'):.2f} | {med('steps_per_s'):.1f} | "
            f"{med('server_cpu_us_per_token'):.1f} |"
        )
    return lines


if __name__ == "__main__":
    main()
