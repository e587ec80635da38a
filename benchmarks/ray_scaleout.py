"""Stream events per second sustained with 1, 2 and 4 Ray load generators, against the scripted server.

Each run is one closed-loop load point: `--streams` concurrent requests, each streaming `--tokens` tokens,
one per event, `--gap` apart (offered events/s = streams / gap). It is sent once by `run_load` in this
process (no Ray: the baseline), then by `RayLoad` (what `compare run --ray` uses) over 1, 2 and 4 actors on
a local Ray instance. Achieved events/s are counted over the steady middle half of the run on the merged
timeline; the ITL error against the scripted gap says whether the clients still measured honestly; the CPU
time of the server, the actors and the driver over the run says who was the bottleneck.

    python benchmarks/ray_scaleout.py [--streams 400] [--gaps 0.02,0.005] [--out benchmarks/results]

On a machine with fewer cores than actors + server + driver, more actors cannot help: they share the
same cores, and the table says so rather than hiding it.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).parents[1]))

from adapters import get_adapter
from adapters.request_spec import RequestSpec
from instruments.scripted_server import ScriptedSchedule, scripted_server
from workloads import timing
from workloads.loadgen import PointJob, run_load_sync
from workloads.records import RequestRecord
from workloads.schedule import ClosedLoop


def process_cpu_s(pid: int) -> float:
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return float("nan")
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def self_cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def cpu_pressure_total_us() -> int | None:
    try:
        return int(Path("/proc/pressure/cpu").read_text().split("total=")[1].split()[0])
    except (OSError, IndexError, ValueError):
        return None


def specs(n: int, tokens: int, prefix: str) -> list[RequestSpec]:
    return [RequestSpec(f"{prefix}-{i}", (1, 2, 3, 4), "w w w w", tokens) for i in range(n)]


def steady_rate(records: list[RequestRecord]) -> tuple[float, float, float]:
    """(events/s over the middle half of the run, its window in s, events per second of the whole run)."""
    times = np.sort(
        np.concatenate([[r.t0_monotonic + t for t, n, _ in r.events if n > 0] for r in records if r.events])
    )
    lo, hi = times[0], times[-1]
    a, b = lo + (hi - lo) / 4, hi - (hi - lo) / 4
    middle = np.count_nonzero((times >= a) & (times <= b))
    return middle / (b - a), hi - lo, times.size / (hi - lo)


def itl_error_ms(records: list[RequestRecord], gap: float) -> tuple[float, float]:
    gaps = np.concatenate([timing.itl_per_event(r) for r in records if r.ok])
    err = np.abs(gaps - gap) * 1e3
    return float(np.percentile(err, 50)), float(np.percentile(err, 99))


def one_run(load, server, gap: float, args, label: str, pids: list[int]) -> dict:
    n = args.streams * args.laps
    cpu = {pid: process_cpu_s(pid) for pid in pids}
    server_cpu, own, pressure = process_cpu_s(server.process.pid), self_cpu_s(), cpu_pressure_total_us()
    started = time.perf_counter()
    records = load(
        PointJob(
            server.url,
            get_adapter("vllm", model="scripted-model"),
            specs(n, args.tokens, f"{label}-{gap}"),
            ClosedLoop(args.streams),
            warmup_specs=specs(args.streams, 4, f"w{label}-{gap}"),
            max_requests=n,
        )
    )
    wall = time.perf_counter() - started
    measured = [r for r in records if not r.warmup]
    rate, span, whole = steady_rate(measured)
    p50, p99 = itl_error_ms(measured, gap)
    after = cpu_pressure_total_us()
    return {
        "config": label,
        "gap_ms": gap * 1e3,
        "offered_events_s": args.streams / gap,
        "events_s": rate,
        "events_s_whole_run": whole,
        "span_s": span,
        "wall_s": wall,
        "requests": len(measured),
        "failed": sum(not r.ok for r in measured),
        "itl_err_p50_ms": p50,
        "itl_err_p99_ms": p99,
        "server_cpu": (process_cpu_s(server.process.pid) - server_cpu) / wall,
        "actors_cpu": sum(process_cpu_s(p) - cpu[p] for p in pids) / wall if pids else None,
        "driver_cpu": (self_cpu_s() - own) / wall,
        "cpu_pressure": (after - pressure) / 1e6 / wall
        if after is not None and pressure is not None
        else None,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--streams", type=int, default=400)
    parser.add_argument("--tokens", type=int, default=200)
    parser.add_argument("--laps", type=int, default=3, help="requests per stream")
    parser.add_argument("--gaps", default="0.02,0.005", help="inter-token gaps in s")
    parser.add_argument("--actors", default="1,2,4")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    gaps = [float(g) for g in args.gaps.split(",")]
    actor_counts = [int(a) for a in args.actors.split(",")]

    import ray

    from workloads.distributed import LoadGenerators, RayLoad

    rows = []
    ray.init(
        num_cpus=max(actor_counts),
        include_dashboard=False,
        _node_ip_address="127.0.0.1",
        object_store_memory=128 * 2**20,
        logging_level="WARNING",
    )
    try:
        for gap in gaps:
            schedule = ScriptedSchedule(ttft_s=0.0, itl_s=gap)
            with scripted_server(default_schedule=schedule) as server:
                rows.append(one_run(run_load_sync, server, gap, args, "no ray", []))
                print(rows[-1], flush=True)
                for k in actor_counts:
                    generators = LoadGenerators(k)
                    try:
                        pids = [g["pid"] for g in generators.placement()]
                        rows.append(one_run(RayLoad(generators), server, gap, args, f"ray, {k} actors", pids))
                        print(rows[-1], flush=True)
                    finally:
                        generators.shutdown()
    finally:
        ray.shutdown()
    if args.out:
        write(args, rows)


def write(args, rows: list[dict]) -> None:
    import aiohttp
    import ray

    args.out.mkdir(parents=True, exist_ok=True)
    cpu = next(
        (line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
         if line.startswith("model name")),
        platform.processor(),
    )  # fmt: skip
    command = "python benchmarks/ray_scaleout.py " + " ".join(sys.argv[1:])
    machine = (
        f"{time.strftime('%Y-%m-%d %H:%M:%S UTC', time.gmtime())}, {os.cpu_count()} CPUs ({cpu}), "
        f"kernel {platform.release()}, Python {platform.python_version()}, ray {ray.__version__}, "
        f"aiohttp {aiohttp.__version__}; nothing pinned: server, actors, driver and Ray's own processes "
        "share the CPUs"
    )
    (args.out / "ray_scaleout.json").write_text(
        json.dumps({"command": command, "machine": machine, "rows": rows}, indent=1) + "\n"
    )
    lines = [
        "# Ray scale-out: stream events per second",
        "",
        f"`{command}`  ",
        machine + ".",
        "",
        f"Closed loop, {args.streams} streams, {args.tokens} tokens per request one per event, "
        f"{args.laps} requests per stream; events/s over the steady middle half of the run (merged "
        "timeline). CPU columns: CPU-seconds per second of wall time (1.0 = one core busy); the actors' "
        "column sums all actors. ITL error: measured per-event gap minus the scripted gap.",
        "",
        "| config | gap ms | offered ev/s | achieved ev/s | ITL err p50 ms | ITL err p99 ms | server CPU | "
        "actors CPU | driver CPU | cpu pressure | failed |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in rows:
        actors = "–" if r["actors_cpu"] is None else f"{r['actors_cpu']:.2f}"
        pressure = "–" if r["cpu_pressure"] is None else f"{r['cpu_pressure']:.2f}"
        lines.append(
            f"| {r['config']} | {r['gap_ms']:g} | {r['offered_events_s']:.0f} | {r['events_s']:.0f} | "
            f"{r['itl_err_p50_ms']:.3f} | {r['itl_err_p99_ms']:.2f} | {r['server_cpu']:.2f} | {actors} | "
            f"{r['driver_cpu']:.2f} | {pressure} | {r['failed']} |"
        )
    (args.out / "ray_scaleout.md").write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
