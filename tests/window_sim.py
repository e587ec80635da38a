"""Request records from a simulated server of known capacity: `slots` requests served at once in arrival order
(FIFO), each for a service time, so the true capacity is slots / mean service time. The load generator's
closed loop (warm-up requests first, taken by each worker until none is left, then measured ones) and open
loop (a closed-loop warm-up that ends before the schedule starts) are reproduced as `workloads.loadgen`
runs them, so the throughput window's rules can be checked against an exact answer."""

from __future__ import annotations

import heapq
from collections.abc import Callable

import numpy as np

from workloads.records import RequestRecord

TOKENS = 8  # output tokens of every simulated request


class FifoServer:
    """`slots` requests at once, the others wait in arrival order; `service()` draws a service time."""

    def __init__(self, slots: int, service: Callable[[], float]) -> None:
        self.free = [0.0] * slots
        self.service = service

    def serve(self, arrival: float) -> tuple[float, float]:
        """When a request arriving at `arrival` starts being served and when it ends (arrivals must come in
        time order)."""
        start = max(arrival, heapq.heappop(self.free))
        end = start + self.service()
        heapq.heappush(self.free, end)
        return start, end


def record(
    i: int, send: float, served: tuple[float, float], warmup: bool, label: str, run_id: str = "run"
) -> RequestRecord:
    """One ok request served from `served[0]` to `served[1]`, its tokens arriving evenly over its service."""
    start, end = served
    times = np.linspace(start + (end - start) / TOKENS, end, TOKENS)
    return RequestRecord(
        run_id=run_id,
        request_id=f"{'w' if warmup else 'm'}{i}",
        backend="sim",
        load_point=label,
        warmup=warmup,
        t0_monotonic=0.0,
        prompt_tokens=5,
        wanted_output_tokens=TOKENS,
        output_length_forced=True,
        scheduled_s=send,
        start_s=send,
        send_s=send,
        end_s=end,
        events=[(float(t), 1, 1) for t in times],
        http_status=200,
        output_tokens=TOKENS,
        event_tokens=TOKENS,
    )


def closed_loop(
    concurrency: int,
    warmup: int,
    measured: int,
    server: FifoServer,
    ramp_s: float = 1e-3,
    run_id: str = "run",
) -> list[RequestRecord]:
    """`concurrency` workers started `ramp_s / concurrency` apart, each sending its next request when its
    last one ends: the `warmup` requests first, then the `measured` ones."""
    sends = [(k * ramp_s / concurrency, k) for k in range(concurrency)]
    heapq.heapify(sends)
    out, taken = [], 0
    while sends and taken < warmup + measured:
        t, worker = heapq.heappop(sends)
        served = server.serve(t)
        out.append(record(taken, t, served, taken < warmup, f"c={concurrency}", run_id))
        taken += 1
        heapq.heappush(sends, (served[1], worker))
    return out


def open_loop(
    offsets: np.ndarray, warmup: int, server: FifoServer, run_id: str = "run"
) -> list[RequestRecord]:
    """A closed-loop warm-up of `warmup` requests at concurrency min(8, warmup), then measured requests
    sent at `offsets` after it has ended."""
    out = closed_loop(min(8, warmup), warmup, 0, server, run_id=run_id) if warmup else []
    start = max((r.end_s for r in out), default=0.0) + 0.01
    for i, offset in enumerate(np.sort(offsets)):
        out.append(record(i, start + offset, server.serve(start + offset), False, "r=1", run_id))
    return out
