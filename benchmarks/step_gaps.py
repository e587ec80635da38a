"""A served run's engine steps as its clients saw them: from the token events of every stream of one load
point, where the server's step time went, without access to the server.

    python benchmarks/step_gaps.py RUN_DIR/requests.jsonl[.xz]

Each engine step emits a token to every running stream at (nearly) one moment, so the arrival times of all
streams' token events, merged and clustered (events within 0.5 ms are one step), give the step boundaries;
the interval between two boundaries is one step's duration as the clients saw it. A step in which some stream
got its first token carried a prefill (a "first-token step"); the rest are decode steps (or prefill chunks
that finished no prompt). Per backend and load point it prints the number of steps, the decode steps' median,
the first-token steps' count, mean duration, total time and prompts per step, and the per-token ITL
percentiles, tokens per event and gaps over 50 and 250 ms (the metric definitions of docs/design.md).
Clustering undercounts steps where a front end delivers several steps' tokens in one read (tokens per event
above 1, or ITL p50 of 0): there the decode median reads high.
"""

from __future__ import annotations

import argparse
import collections
import lzma
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from workloads import timing
from workloads.records import RequestRecord

SAME_STEP_S = 0.0005


def read(path: Path) -> list[RequestRecord]:
    opener = lzma.open if path.suffix == ".xz" else open
    with opener(path, "rt") as f:
        return [RequestRecord.model_validate_json(line) for line in f if line.strip()]


def point_line(records: list[RequestRecord]) -> str:
    arrivals, firsts, itl, per_event = [], [], [], []
    for r in records:
        events = [e for e in r.events if e[1] > 0]
        if not events:
            continue
        arrivals += [e[0] for e in events]
        firsts.append(events[0][0])
        itl += [gap * 1000 for gap in timing.itl(r)]
        per_event += [k for _, k, _ in events[1:]]
    times = np.sort(np.array(arrivals))
    starts = times[np.r_[True, np.diff(times) > SAME_STEP_S]]
    steps = np.diff(starts) * 1000  # steps[i - 1]: the step that ended at starts[i]
    first_steps = set((np.searchsorted(starts, np.array(firsts), side="right") - 1).tolist()) - {0}
    prefill = np.array([steps[i - 1] for i in sorted(first_steps)])
    decode = np.array([steps[i - 1] for i in range(1, len(starts)) if i not in first_steps])
    itl_ms = np.array(itl)
    p = np.percentile(itl_ms, [50, 90, 99, 99.5])
    return (
        f"steps {len(starts):5d}  decode p50 {np.median(decode):6.2f} ms | first-token steps"
        f" {len(prefill):4d} mean {prefill.mean():6.1f} ms, {prefill.sum() / 1000:5.2f} s,"
        f" {len(firsts) / len(prefill):4.1f} prompts each | ITL p50 {p[0]:6.2f} p90 {p[1]:6.2f}"
        f" p99 {p[2]:6.2f} p99.5 {p[3]:6.2f} max {itl_ms.max():6.1f} | tokens/event"
        f" {np.mean(per_event):4.2f} | gaps >50 ms {(itl_ms > 50).sum()}, >250 ms {(itl_ms > 250).sum()}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("requests", type=Path, help="a run directory's requests.jsonl or requests.jsonl.xz")
    args = parser.parse_args()
    points: dict[tuple[str, str], list[RequestRecord]] = collections.defaultdict(list)
    for r in read(args.requests):
        if not r.warmup and r.error_kind is None:
            points[(f"{r.backend}:{r.variant}" if r.variant else r.backend, r.load_point)].append(r)
    for (backend, load_point), records in points.items():
        print(f"{backend:18s} {load_point:6s} {point_line(records)}")


if __name__ == "__main__":
    main()
