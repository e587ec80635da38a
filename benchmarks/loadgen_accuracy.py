"""How exact and how fast is the load generator? Both measured against the scripted server.

Accuracy: N concurrent streams (closed loop, each request with a random TTFT and output length, a fixed
inter-token gap that keeps the total event rate moderate) against the scripted server, which logs the
monotonic time of every write. Errors are client arrival minus server write per event, and the TTFT, ITL
and TPOT errors that follow (see `instruments/accuracy.py`). A second variant ("aligned") makes every stream
emit on a shared decode-step clock, as a batching engine does, so N events arrive at once.

Rate: many streams with short gaps, at rising offered event rates; the client's achieved event rate and
its CPU use (one process, one event loop: at most one core) show the rate one core sustains.

    python benchmarks/loadgen_accuracy.py [--streams 1,64,256,1000] [--no-rate] [--out benchmarks/results]

The client and the server run pinned to two different CPUs (by default the last two): left to the kernel,
a server that wakes the client tends to pull it onto its own CPU, and the client then waits for the server's
burst to end before it reads. The machine is shared: CPU pressure (/proc/pressure/cpu, share of time some
task waited for a CPU) is recorded for every run, and a point is rerun while it is high.

The goal: at the 99th percentile, the event, TTFT, ITL and TPOT errors within 1 ms (GOAL_P99_MS) at every
point; the table says which points meet it. Under CPU contention single events can come out early (negative
errors of several ms): segments that arrive while the client holds its socket are merged and keep the first
one's stamp, so an event read together with earlier data carries that data's time.
tests/test_loadgen_accuracy.py checks what holds on any machine (every event matched, each read stamped no
earlier than its oldest data was written); this script measures how close the timings are.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import resource
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).parents[1]))

from adapters import get_adapter
from adapters.request_spec import RequestSpec
from instruments.accuracy import compare
from instruments.scripted_server import read_event_log, scripted_server
from workloads.kernel_stamps import stamped_loop_factory
from workloads.loadgen import PointJob, new_runner, run_load_sync
from workloads.schedule import ClosedLoop

# streams -> (inter-token gap s, requests per stream): ~3-10k events/s in total, 10k+ events per point
ACCURACY = {1: (0.01, 20), 64: (0.02, 3), 256: (0.05, 2), 1000: (0.1, 2)}
GOAL_P99_MS = 1.0  # every error's 99th percentile, at every point


def meets_goal(point: dict) -> bool:
    return all(
        point.get(f"{name}_p99_ms", float("inf")) <= GOAL_P99_MS for name in ("event", "ttft", "itl", "tpot")
    )


def cpu_pressure_total_us() -> int | None:
    try:
        return int(Path("/proc/pressure/cpu").read_text().split("total=")[1].split()[0])
    except (OSError, IndexError, ValueError):
        return None


def process_cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def self_cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


class Pinning:
    """Pins this process (the client) and the scripted server to given CPUs for the duration of a run."""

    def __init__(self, client: int | None, server: int | None) -> None:
        self.client, self.server = client, server
        self.saved: set[int] | None = None

    def apply(self, server_pid: int) -> None:
        if self.client is None or not hasattr(os, "sched_setaffinity"):
            return
        self.saved = os.sched_getaffinity(0)
        os.sched_setaffinity(server_pid, {self.server})
        os.sched_setaffinity(0, {self.client})

    def restore(self) -> None:
        if self.saved is not None:
            os.sched_setaffinity(0, self.saved)
            self.saved = None


def make_specs(
    prefix: str,
    n: int,
    itl: float,
    rng: random.Random,
    out: tuple[int, int] = (20, 120),
    step: float | None = None,
) -> list[RequestSpec]:
    specs = []
    for i in range(n):
        schedule = {"ttft_s": rng.uniform(0.005, 0.05), "itl_s": itl}
        if step:
            schedule["step_s"] = step
        specs.append(
            RequestSpec(
                f"{prefix}-{i}",
                (1, 2, 3),
                "a b c",
                rng.randint(*out),
                extra_headers={"X-Scripted-Schedule": json.dumps(schedule)},
            )
        )
    return specs


def measure(
    pin: Pinning, streams: int, itl: float, per_stream: int, workdir: Path, seed: int, aligned: bool = False
) -> dict:
    rng = random.Random(seed)
    log = workdir / f"events-{streams}-{'aligned' if aligned else 'free'}.jsonl"
    log.unlink(missing_ok=True)
    step = itl if aligned else None
    with scripted_server(event_log=log) as server:
        specs = make_specs("m", streams * per_stream, itl, rng, step=step)
        warm = make_specs("w", streams, itl, rng, out=(4, 8), step=step)
        pin.apply(server.process.pid)
        try:
            pressure0, cpu0, server0, t0 = (
                cpu_pressure_total_us(),
                self_cpu_s(),
                process_cpu_s(server.process.pid),
                time.perf_counter(),
            )
            records = run_load_sync(
                PointJob(server.url, get_adapter("vllm"), specs, ClosedLoop(streams), warmup_specs=warm)
            )
            wall = time.perf_counter() - t0
            client_cpu, server_cpu = self_cpu_s() - cpu0, process_cpu_s(server.process.pid) - server0
            pressure1 = cpu_pressure_total_us()
        finally:
            pin.restore()
    measured = [r for r in records if not r.warmup]
    errors = compare(measured, read_event_log(log, expect=[r.request_id for r in records]))
    events = sum(len(r.events) for r in records)
    return {
        "streams": streams,
        "aligned_steps": aligned,
        "itl_s": itl,
        "requests": len(measured),
        "failed": sum(not r.ok for r in records),
        "events": events,
        "wall_s": round(wall, 2),
        "events_per_s": round(events / wall),
        "client_cpu_share": round(client_cpu / wall, 3),
        "server_cpu_share": round(server_cpu / wall, 3),
        "cpu_pressure": None if pressure0 is None else round((pressure1 - pressure0) / 1e6 / wall, 3),
        **{k: (round(v, 4) if isinstance(v, float) else v) for k, v in errors.summary().items()},
    }


def rate_point(pin: Pinning, streams: int, itl: float, seconds: float = 8.0) -> dict:
    """Streams that last the whole run; rate and client CPU are taken over its steady middle half."""
    rng = random.Random(7)
    tokens = int(seconds / itl) + 20
    samples: list[tuple[float, float]] = []  # (monotonic time, this process's CPU time), every 0.1 s

    def sample(_records: list) -> None:
        samples.append((time.perf_counter(), time.process_time()))

    with scripted_server() as server:
        specs = [
            RequestSpec(
                f"rate-{i}",
                (1,),
                "x",
                tokens,
                extra_headers={
                    "X-Scripted-Schedule": json.dumps({"ttft_s": rng.uniform(0, itl), "itl_s": itl})
                },
            )
            for i in range(streams)
        ]
        pin.apply(server.process.pid)
        try:
            pressure0, server0 = cpu_pressure_total_us(), process_cpu_s(server.process.pid)
            t0 = time.perf_counter()
            records = run_load_sync(
                PointJob(
                    server.url,
                    get_adapter("vllm"),
                    specs,
                    ClosedLoop(streams),
                    progress=sample,
                    progress_interval_s=0.1,
                )
            )
            wall = time.perf_counter() - t0
            server_cpu = process_cpu_s(server.process.pid) - server0
            pressure1 = cpu_pressure_total_us()
        finally:
            pin.restore()
    times = np.sort(np.concatenate([[r.t0_monotonic + t for t, _, _ in r.events] for r in records]))
    reads = sum(len({t for t, _, _ in r.events}) for r in records)  # events of one read share its time
    first, last = times[0], times[-1]
    (ta, ca), (tb, cb) = (
        min(samples, key=lambda s: abs(s[0] - (first + q * (last - first)))) for q in (0.25, 0.75)
    )
    in_window = int(((times >= ta) & (times < tb)).sum())
    return {
        "streams": streams,
        "itl_s": itl,
        "offered_events_per_s": round(streams / itl),
        "achieved_events_per_s": round(in_window / (tb - ta)),
        "events": int(times.size),
        "wall_s": round(wall, 2),
        "client_cpu_share": round((cb - ca) / (tb - ta), 3),
        "server_cpu_share": round(server_cpu / wall, 3),
        "events_per_client_cpu_s": round(in_window / (cb - ca)),
        "events_per_read": round(times.size / reads, 2),
        "failed": sum(not r.ok for r in records),
        "cpu_pressure": None if pressure0 is None else round((pressure1 - pressure0) / 1e6 / wall, 3),
    }


def machine() -> dict:
    import aiohttp

    with new_runner() as runner:  # the loop the load generator runs on
        loop = type(runner.get_loop()).__module__.split(".")[0]
    if loop == "asyncio" and stamped_loop_factory() is not None:
        loop = "asyncio, kernel receive stamps"
    model = next(
        (
            line.split(":", 1)[1].strip()
            for line in Path("/proc/cpuinfo").read_text().splitlines()
            if line.startswith("model name")
        ),
        platform.processor(),
    )
    return {
        "cpus": os.cpu_count(),
        "cpu_model": model,
        "kernel": platform.release(),
        "python": platform.python_version(),
        "aiohttp": aiohttp.__version__,
        "event_loop": loop,
        "load_average_at_start": os.getloadavg(),
    }


def markdown(result: dict) -> str:
    lines = [
        f"# Load generator accuracy and rate\n\n`{result['command']}`  \n{result['date']}, "
        f"{result['machine']['cpus']} CPUs ({result['machine']['cpu_model']}), kernel "
        f"{result['machine']['kernel']}, Python {result['machine']['python']}, aiohttp "
        f"{result['machine']['aiohttp']}, {result['machine']['event_loop']}; client on CPU "
        f"{result['client_cpu']}, scripted server on CPU {result['server_cpu']}.\n",
        "Errors in ms against the scripted server's write times (client arrival minus server write per "
        "event; TTFT/ITL/TPOT errors derived). `aligned`: every stream emits on one decode-step clock. "
        "cpu pressure: share of the run during which some task waited for a CPU (other tenants); a "
        "point is run again (up to `--tries`) while it exceeds `--max-pressure`, and the quietest try "
        f"is kept. Goal: every p99 within {GOAL_P99_MS:g} ms.\n",
        "| streams | aligned | events/s | event p50 | event p99 | TTFT p99 | ITL p99 | TPOT p99 | event "
        "max | p99 goal met | client CPU | server CPU | cpu pressure | failed |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in result["accuracy"]:
        lines.append(
            f"| {r['streams']} | {'yes' if r['aligned_steps'] else 'no'} | {r['events_per_s']} | "
            f"{r['event_p50_ms']:.3f} | {r['event_p99_ms']:.3f} | {r['ttft_p99_ms']:.3f} | "
            f"{r['itl_p99_ms']:.3f} | {r['tpot_p99_ms']:.3f} | {r['event_max_ms']:.3f} | "
            f"{'yes' if meets_goal(r) else 'no'} | {r['client_cpu_share']:.0%} | "
            f"{r['server_cpu_share']:.0%} | {r['cpu_pressure']} | {r['failed']} |"
        )
    if result.get("rate"):
        lines += [
            "",
            "Event rate over the steady middle half of each run: offered vs achieved, the client's CPU "
            "(one process, one event loop: 100% is one core), and events handled per second of client "
            "CPU (at saturation, the rate one core sustains).\n",
            "| streams | gap ms | offered ev/s | achieved ev/s | client CPU | server CPU | events per "
            "client CPU-second | events per read | cpu pressure |",
            "| --- | --- | --- | --- | --- | --- | --- | --- | --- |",
        ]
        for r in result["rate"]:
            lines.append(
                f"| {r['streams']} | {r['itl_s'] * 1e3:g} | {r['offered_events_per_s']} | "
                f"{r['achieved_events_per_s']} | {r['client_cpu_share']:.0%} | "
                f"{r['server_cpu_share']:.0%} | {r['events_per_client_cpu_s']} | "
                f"{r['events_per_read']} | {r['cpu_pressure']} |"
            )
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--streams", default="1,64,256,1000", help="comma-separated stream counts")
    parser.add_argument("--aligned", default="256,1000", help="stream counts also run on a shared step clock")
    parser.add_argument("--no-rate", action="store_true", help="skip the event-rate part")
    parser.add_argument("--rate-gaps-ms", default="20,10,5,3", help="inter-token gaps for the rate part")
    parser.add_argument("--rate-streams", type=int, default=400)
    parser.add_argument("--out", type=Path, help="folder for loadgen_accuracy.json and .md")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument(
        "--tries",
        type=int,
        default=3,
        help="run a point again (up to this many times) while CPU pressure exceeds "
        "--max-pressure; the quietest try is kept",
    )
    parser.add_argument("--max-pressure", type=float, default=0.05)
    cpus = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []
    parser.add_argument(
        "--client-cpu",
        default=str(cpus[-1]) if len(cpus) >= 2 else "none",
        help="CPU for the client (this process), or 'none' to leave placement to the kernel",
    )
    parser.add_argument("--server-cpu", default=str(cpus[-2]) if len(cpus) >= 2 else "none")
    args = parser.parse_args()
    pinned = args.client_cpu != "none" and args.server_cpu != "none"
    pin = Pinning(int(args.client_cpu), int(args.server_cpu)) if pinned else Pinning(None, None)
    workdir = Path(os.environ.get("TMPDIR", "/tmp")) / f"loadgen-accuracy-{os.getpid()}"
    workdir.mkdir(parents=True, exist_ok=True)
    result = {
        "command": "python " + " ".join(sys.argv),
        "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
        "machine": machine(),
        "client_cpu": args.client_cpu,
        "server_cpu": args.server_cpu,
        "accuracy": [],
        "rate": [],
    }
    runs = [(int(n), False) for n in args.streams.split(",") if n]
    runs += [(int(n), True) for n in args.aligned.split(",") if n]

    def quietest(run, *run_args) -> dict:
        tries = []
        for _ in range(args.tries):
            tries.append(run(*run_args))
            print(json.dumps(tries[-1]), flush=True)
            if tries[-1]["cpu_pressure"] is None or tries[-1]["cpu_pressure"] <= args.max_pressure:
                break
            time.sleep(5)
        best = min(tries, key=lambda r: r["cpu_pressure"] or 0.0)
        return {**best, "tries": len(tries)}

    for streams, aligned in runs:
        itl, per_stream = ACCURACY.get(streams, (0.05, 2))
        result["accuracy"].append(
            quietest(measure, pin, streams, itl, per_stream, workdir, args.seed, aligned)
        )
    if not args.no_rate:
        for gap in (float(g) / 1e3 for g in args.rate_gaps_ms.split(",")):
            result["rate"].append(quietest(rate_point, pin, args.rate_streams, gap))
    text = markdown(result)
    print(text)
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "loadgen_accuracy.json").write_text(json.dumps(result, indent=1) + "\n")
        (args.out / "loadgen_accuracy.md").write_text(text)
    missed = [
        f"{r['streams']}{' aligned' if r['aligned_steps'] else ''}"
        for r in result["accuracy"]
        if not meets_goal(r)
    ]
    if missed:
        sys.exit(f"p99 goal ({GOAL_P99_MS:g} ms) missed at: {', '.join(missed)}")


if __name__ == "__main__":
    main()
