"""When the reference server's start-up milestones happen, counted from the spawn of its process.

    python benchmarks/server_startup.py --label after-lazy-package --launches 5
    python benchmarks/server_startup.py --label h200-7b --model /tmp/ckpt-llama-2-7b --device cuda \
      --dtype auto

Each launch spawns `python -m reference_engine.server` on 127.0.0.1 and reads its log as it is written: the
front end's first line, the engine core's first line (the model resolved), weights loaded, and ready (the
server's own "server ready" line), each in seconds after the spawn, from the log's clock. The server is
stopped at ready. Medians over the launches; results in benchmarks/results/server_startup/<label>.json.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import socket
import statistics
import subprocess
import sys
import time
from datetime import datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MILESTONES = {  # name -> a phrase of the log line that marks it
    "front_end_first_line": "starting llm-compare reference server",
    "core_first_line": "resolved in",
    "weights_loaded": "weights loaded",
    "ready": "server ready",
}
CLOCK = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d),(\d{3}) ")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch_once(server_args: list[str], timeout_s: float) -> tuple[dict[str, float], list[str]]:
    """Seconds from the spawn to each milestone of one launch, and the log's lines up to ready, each led by
    its seconds after the spawn (the engine's own phase times are in them)."""
    spawned = time.time()
    command = [sys.executable, "-m", "reference_engine.server", "--port", str(free_port()), *server_args]
    proc = subprocess.Popen(command, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    seen: dict[str, float] = {}
    lines: list[str] = []
    try:
        assert proc.stdout is not None
        for line in proc.stdout:
            clock = CLOCK.match(line)
            if clock is None:
                continue
            second = datetime.strptime(clock.group(1), "%Y-%m-%d %H:%M:%S").timestamp()
            when = second + int(clock.group(2)) / 1e3
            lines.append(f"{when - spawned:7.3f} {line[clock.end() :].rstrip()}")
            for name, phrase in MILESTONES.items():
                if phrase in line and name not in seen:
                    seen[name] = round(when - spawned, 3)
            if "ready" in seen or time.time() - spawned > timeout_s:
                break
    finally:
        proc.terminate()
        proc.wait(60)
    return seen, lines


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--label", required=True)
    p.add_argument("--launches", type=int, default=5)
    p.add_argument("--model", default="random:tiny")
    p.add_argument("--device", default="cpu")
    p.add_argument("--dtype", default="float32")
    p.add_argument("--timeout", type=float, default=300.0, help="seconds a launch may take to be ready")
    p.add_argument("--out", default=str(ROOT / "benchmarks/results/server_startup"))
    args, extra = p.parse_known_args()  # anything else goes to the server as given
    server_args = ["--model", args.model, "--device", args.device, "--dtype", args.dtype, *extra]
    load_before = os.getloadavg()
    runs, logs = [], []
    for _ in range(args.launches):
        seen, lines = launch_once(server_args, args.timeout)
        runs.append(seen)
        logs.append(lines)
        print(json.dumps(seen), flush=True)
    medians = {
        name: statistics.median(r[name] for r in runs if name in r)
        for name in MILESTONES
        if any(name in r for r in runs)
    }
    meta = dict(
        label=args.label,
        machine=platform.platform(),
        cpus=os.cpu_count(),
        python=platform.python_version(),
        command=" ".join(["benchmarks/server_startup.py", *sys.argv[1:]]),
        date=time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        server_args=server_args,
        load_average_before=[round(x, 2) for x in load_before],
        load_average_after=[round(x, 2) for x in os.getloadavg()],
    )
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    result = dict(meta=meta, medians=medians, runs=runs, logs=logs)
    (out / f"{args.label}.json").write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps(medians))


if __name__ == "__main__":
    main()
