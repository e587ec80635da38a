"""Where the engine core's start-up goes: its imports, CUDA's start and the building of the `Engine`.

    python benchmarks/engine_startup_profile.py --model /tmp/ckpt-llama-2-7b --device cuda --dtype auto \
      --label h200-7b

One fresh process does what the server's engine core does before it reports ready (import torch, import the
engine, build `Engine(config)`), timing each, with the build under cProfile. Writes
benchmarks/results/server_startup/<label>-profile.json (the times, the engine's own phases, and the profile's
functions by cumulative and by own time) and prints the same. `--cuda-first` starts CUDA before the engine is
built, to see what the start of CUDA itself costs; without it, CUDA starts inside the build as in the server.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import platform
import pstats
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def top_functions(profile: cProfile.Profile, key: str, count: int) -> list[str]:
    text = io.StringIO()
    pstats.Stats(profile, stream=text).strip_dirs().sort_stats(key).print_stats(count)
    return [line for line in text.getvalue().splitlines() if line.strip()]


def callers(profile: cProfile.Profile, names: list[str]) -> list[str]:
    """Who calls the functions whose names match `names` (regular expressions), with their counts."""
    text = io.StringIO()
    stats = pstats.Stats(profile, stream=text).strip_dirs().sort_stats("cumulative")
    for name in names:
        stats.print_callers(name)
    return [line for line in text.getvalue().splitlines() if line.strip()]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--label", required=True)
    p.add_argument("--model", default="random:tiny")
    p.add_argument("--device", default="cpu")
    p.add_argument("--dtype", default="float32")
    p.add_argument("--cuda-first", action="store_true", help="start CUDA before building the engine")
    p.add_argument("--top", type=int, default=45, help="functions listed per ordering")
    p.add_argument(
        "--callers",
        nargs="*",
        default=["is_available", "_cuda_synchronize", "triton_key"],
        help="functions (regular expressions) whose callers are listed",
    )
    p.add_argument("--out", default=str(ROOT / "benchmarks/results/server_startup"))
    args = p.parse_args()

    times: dict[str, float] = {}
    t = time.perf_counter()
    import torch

    times["import_torch"] = time.perf_counter() - t
    t = time.perf_counter()
    from reference_engine.config import EngineConfig
    from reference_engine.engine import Engine

    times["import_engine"] = time.perf_counter() - t
    if args.cuda_first and args.device == "cuda":
        t = time.perf_counter()
        torch.empty(1, device="cuda")
        torch.cuda.synchronize()
        times["cuda_start"] = time.perf_counter() - t
    config = EngineConfig(model=args.model, device=args.device, dtype=args.dtype)
    profile = cProfile.Profile()
    t = time.perf_counter()
    profile.enable()
    engine = Engine(config)
    profile.disable()
    times["build_engine"] = time.perf_counter() - t
    result = dict(
        meta=dict(
            label=args.label,
            machine=platform.platform(),
            python=platform.python_version(),
            torch=torch.__version__,
            command=" ".join(["benchmarks/engine_startup_profile.py", *sys.argv[1:]]),
            date=time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        ),
        seconds={name: round(value, 3) for name, value in times.items()},
        engine_phases={name: round(value, 3) for name, value in engine.setup.phases.items()},
        by_cumulative=top_functions(profile, "cumulative", args.top),
        by_own_time=top_functions(profile, "tottime", args.top),
        callers=callers(profile, args.callers),
    )
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{args.label}-profile.json").write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps(result["seconds"]), json.dumps(result["engine_phases"]))
    print("\n".join(result["by_cumulative"]))
    print("\n".join(result["by_own_time"]))
    print("\n".join(result["callers"]))


if __name__ == "__main__":
    main()
