"""Calibration of `compare run --sweep` and `--capacity` against servers of known capacity
(`known_servers.py`: N FIFO slots, seeded service times, written apart from the scripted server).

Fast part (simulated points, many seeds):
- saturation never fires at a third of the capacity (not once in 100 points a case), and the rate rule fires
  in at least 95 of 100 points at twice the capacity, for several slot counts, service-time distributions,
  both arrival kinds;
- the late-client warning fires neither when more was achieved than offered nor at a few ms of lag, and fires
  when the client fell behind.

Live part (each case about 20 s; bounded points of 60 requests; the server a subprocess on loopback):
- the sweep calls nothing saturated below 0.9 x the capacity N / mean service time, and its most served rate
  lies within [0.75, 1.1] x the capacity (short windows; the client's own delays only lower it);
- the capacity search's bracket [lo, hi) for a TTFT p50 SLO of 1.4 x the mean service time agrees with the
  server: simulating it (`known_servers.simulate_ttft`) at a rate, with points of the same size, each its own
  draw of arrivals and service times, gives the share of points whose verdict (`slo_verdict`) is holds or
  misses; lo must be a rate at which at least `RARE` (1 %) of simulated points hold, and hi one at which at
  least 1 % miss, less MACHINE = 0.25 of it for the delays of a busy machine, which add to every TTFT and
  can only lower the rates measured. The SLO is read at p50 so that a handful of requests slowed by the
  machine cannot decide a verdict that the server's queue should. (Simulation shows the verdict is not as
  sure as its 95 % suggests: the TTFTs of one point share its queue, so they are not independent, and at
  the rate where the pooled p50 crosses the limit a point "holds" about a third of the time.)
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd
import pytest
from checkpoints import make_tokenizer
from known_servers import TTFT_SHARE, known_server, service_times, simulate_ttft

from compare.analysis import capacity, sweep
from compare.analysis.caveats import late_client
from compare.analysis.statistics import slo_verdict
from compare.analysis.sweep import PointFacts, saturation
from workloads.schedule import OpenLoop, point_seed

N_REQUESTS = 60
MACHINE = 0.25
RARE = 0.01  # a verdict a simulated point of the server gives less often than this is not one it gives
SLO_FACTOR = 1.4  # the TTFT limit, in mean service times


def simulated_point(
    rate: float, slots: int, service_s: float, distribution: str, arrival: str, n: int, seed: int
) -> PointFacts:
    """The facts of an open-loop point of `n` requests (its own draw of arrivals) against the known server,
    simulated: sends on schedule, ends when the service does."""
    rng = np.random.default_rng(seed)
    sends = OpenLoop(rate, arrival, seed=point_seed(seed, 2)).offsets(n)  # type: ignore[arg-type]
    services = service_times(distribution, service_s, n, rng)
    ttft = simulate_ttft(sends, services, slots)
    ends = sends + ttft + (1 - TTFT_SHARE) * services
    requests = pd.DataFrame(
        {
            "status": "ok",
            "send_s": sends,
            "scheduled_s": sends,
            "end_s": ends,
            "ttft_s": ttft,
            "ttft_intended_s": ttft,
            "e2e_s": ends - sends,
            "e2e_intended_s": ends - sends,
            "tpot_s": np.nan,
        }
    )
    row = {
        "load_point": f"r={rate:g}",
        "concurrency": None,
        "rate": rate,
        "requests": n,
        "requests_failed": 0,
        "request_rps": n / (ends.max() - sends[0]),
    }
    return sweep.point_facts(row, requests)


def sync_point(service_s: float, n: int = 40) -> PointFacts:
    """Concurrency 1 against the known server: TTFT the first share of each service."""
    return PointFacts(
        "c=1",
        1,
        None,
        1 / service_s,
        TTFT_SHARE * service_s,
        TTFT_SHARE * service_s,
        TTFT_SHARE * service_s,
        0.0,
        sent=n,
        completed=n,
    )


CASES = [(1, 0.1, "constant"), (2, 0.05, "exponential"), (4, 0.2, "lognormal")]


@pytest.mark.parametrize("arrival", ["poisson", "constant"])
@pytest.mark.parametrize(("slots", "service_s", "distribution"), CASES)
def test_saturation_never_fires_far_below_capacity_and_fires_far_above(
    slots: int, service_s: float, distribution: str, arrival: str
) -> None:
    capacity_rps = slots / service_s
    sync = sync_point(service_s)
    below = [
        simulated_point(capacity_rps / 3, slots, service_s, distribution, arrival, 40, seed)
        for seed in range(100)
    ]
    fired = [saturation(p, sync) for p in below if saturation(p, sync)]
    assert not fired, f"at a third of the capacity: {fired[:3]}"
    above = [
        simulated_point(2 * capacity_rps, slots, service_s, distribution, arrival, N_REQUESTS, seed)
        for seed in range(100)
    ]
    assert sum(1 for p in above if saturation(p, sync)) >= 95


def _row(achieved: float, offered: float, lag_ms: float, n: int = 16, arrival: str = "poisson") -> dict:
    return {
        "mode": "open",
        "achieved_rps": achieved,
        "offered_rps": offered,
        "lag_p99_ms": lag_ms,
        "requests": n,
        "runs": 1,
        "arrival": arrival,
    }


def test_late_client_warning_reads_the_lag_and_the_sampling_error_of_the_arrivals():
    assert late_client(_row(1.98, 1.29, 6.0, n=8)) == ""  # more achieved than offered: a draw's noise
    assert late_client(_row(10.0, 10.0, 5.0)) == ""  # achieved as offered, a few ms of lag
    assert late_client(_row(7.2, 10.0, 3.0)) == ""  # 0.72 x from 16 Poisson arrivals: within chance
    assert late_client({**_row(10.0, 10.0, 5.0), "mode": "closed"}) == ""
    assert "lag p99 250.0 ms" in late_client(_row(10.0, 10.0, 250.0))  # far behind its own schedule
    assert "fewer than chance" in late_client(_row(5.0, 10.0, 3.0, n=200))  # 200 sends at half the rate
    assert "fewer than chance" in late_client(_row(8.0, 10.0, 3.0, arrival="constant"))
    # the same shortfall with no lag at all is the draw, not the client
    assert late_client(_row(5.0, 10.0, 0.5, n=200)) == ""
    # Poisson draws of 16 arrivals on schedule: the warning fires in at most a few percent of many seeds
    rates = [15 / OpenLoop(10.0, seed=point_seed(s, 0)).offsets(16)[-1] for s in range(400)]
    assert sum(1 for r in rates if late_client(_row(r, 10.0, 2.0))) <= 0.03 * len(rates)


def verdict_share(
    rate: float,
    verdict: str,
    slots: int,
    service_s: float,
    distribution: str,
    arrival: str,
    limit_s: float,
    reps: int = 100,
) -> float:
    """The share of `reps` simulated points of `N_REQUESTS` at `rate` (each its own draw of arrivals and
    service times, from an empty server, like a measured point) whose p50 TTFT verdict is `verdict`."""
    rng = np.random.default_rng(12345)
    hits = 0
    for r in range(reps):
        sends = OpenLoop(rate, arrival, seed=1000 + r).offsets(N_REQUESTS)  # type: ignore[arg-type]
        ttft = simulate_ttft(sends, service_times(distribution, service_s, N_REQUESTS, rng), slots)
        hits += slo_verdict(ttft, 0.5, limit_s) == verdict
    return hits / reps


def rate_where(share: float, verdict: str, *server: Any) -> float:
    """The rate at which `verdict_share` of `verdict` crosses `share`, by bisection: for "holds" the highest
    rate that still holds that often, for "misses" the lowest that already misses that often."""
    slots, service_s = server[0], server[1]
    lo, hi = 0.1 * slots / service_s, 4 * slots / service_s
    for _ in range(8):
        mid = (lo + hi) / 2
        often = verdict_share(mid, verdict, *server) >= share
        higher = often if verdict == capacity.HOLDS else not often  # the rate sought lies above mid
        lo, hi = (mid, hi) if higher else (lo, mid)
    return (lo + hi) / 2


LIVE = [  # slots, mean service time, its distribution, arrivals, seed
    (2, 0.05, "constant", "poisson", 1),
    (3, 0.06, "lognormal", "constant", 2),
    (4, 0.1, "exponential", "poisson", 3),
]


@pytest.mark.live
@pytest.mark.timing
@pytest.mark.parametrize(("slots", "service_s", "distribution", "arrival", "seed"), LIVE)
def test_sweep_and_capacity_bracket_the_known_capacity(
    tmp_path, slots: int, service_s: float, distribution: str, arrival: str, seed: int
) -> None:
    from compare.measure.watcher import Watcher
    from compare.plan.build import build_plan
    from compare.runner import run_plan

    make_tokenizer(tmp_path / "tok")
    limit_s = SLO_FACTOR * service_s
    with known_server(slots, service_s, distribution, seed, lifetime_s=300) as server:
        plan = build_plan(
            {
                "backends": "vllm",
                "endpoints": [f"vllm={server.url}"],
                "model": "known-model",
                "tokenizer": str(tmp_path / "tok"),
                "input_len": "8",
                "output_len": "4",
                "num_requests": N_REQUESTS,
                "arrival": arrival,
                "seed": seed,
                "capacity": True,
                "slo": f"ttft={limit_s * 1e3:g}ms",
                "capacity_percentile": 50,
                "sweep_points": 3,
                "sweep_concurrency": 2 * slots,
                "capacity_precision": 0.1,
            }
        )
        outcome = run_plan(plan, tmp_path / "run", ["compare", "run"], n_boot=0, watcher=Watcher())
    assert outcome.code == 0
    # every open-loop point drew its own arrivals, and its seed is recorded in the manifest and runs.jsonl
    schedules = [p["schedule"] for p in outcome.run_dir.manifest["points"]]
    seeds = [s["seed"] for s in schedules if s["kind"] == "open"]
    assert len(seeds) >= 3 and len(set(seeds)) == len(seeds)
    recorded = [r.schedule["seed"] for r in outcome.run_dir.run_summaries() if r.schedule["kind"] == "open"]
    assert sorted(recorded) == sorted(seeds)
    known = server.capacity_rps
    points = next(iter(sweep.sweep_of(outcome.results.summary, outcome.results.requests).values()))
    sync = points[0]
    called = [(p.offered_rps, saturation(p, sync)) for p in points if p.offered_rps and saturation(p, sync)]
    assert called, "the sweep never saturated the server"
    assert all(rate >= 0.9 * known for rate, _ in called), f"saturated below capacity {known}: {called}"
    most = sweep.most_served(points).throughput_rps
    assert 0.75 * known <= most <= 1.1 * known, f"most served {most:.3g} of {known:.3g}"

    found = capacity.capacity_of(points, {"ttft": limit_s}, 50)
    assert found is not None and found.decided and found.hi is not None
    server_args = (slots, service_s, distribution, arrival, limit_s)
    holds_up_to = rate_where(RARE, capacity.HOLDS, *server_args)
    misses_from = rate_where(RARE, capacity.MISSES, *server_args)
    bracket = f"[{found.lo:.4g}, {found.hi:.4g}) against {misses_from:.4g}..{holds_up_to:.4g}"
    assert found.lo <= holds_up_to, bracket
    assert found.hi >= misses_from * (1 - MACHINE), bracket
    report = (outcome.run_dir.path / "report.md").read_text()
    section = report.split("## Sweep and capacity", 1)[1].split("\n## ", 1)[0]
    assert f"capacity under the SLO {found.lo:.4g} requests/s" in section
    decision = report.split("## Decision", 1)[1].split("\n## ", 1)[0]
    assert "within the SLOs at" not in decision  # no goodput claim set beside the capacity
    print(
        f"slots={slots} service={service_s} {distribution} {arrival} seed={seed}: capacity {known:.4g}, "
        f"most served {most:.4g}, saturated from {min(r for r, _ in called):.4g}; "
        f"the simulated server holds the SLO up to {holds_up_to:.4g} and misses it from {misses_from:.4g} "
        f"(each in {RARE:.0%} of points); bracket [{found.lo:.4g}, {found.hi:.4g})"
    )


@pytest.mark.live
@pytest.mark.timing
def test_capacity_points_are_sized_so_that_their_percentile_can_be_decided(tmp_path) -> None:
    """With 8 requests a point a p90 could never be shown to hold (29 are needed): every open-loop point of
    the search is raised to that many, with its prompts, and the manifest records the raised bounds; the
    closed loops keep the asked size."""
    from compare.analysis.statistics import min_n_for_bound
    from compare.measure.watcher import Watcher
    from compare.plan.build import build_plan
    from compare.runner import run_plan

    make_tokenizer(tmp_path / "tok")
    needed = min_n_for_bound(0.9)
    with known_server(2, 0.05, "constant", 5, lifetime_s=200) as server:
        plan = build_plan(
            {
                "backends": "vllm",
                "endpoints": [f"vllm={server.url}"],
                "model": "known-model",
                "tokenizer": str(tmp_path / "tok"),
                "input_len": "8",
                "output_len": "4",
                "num_requests": 8,
                "seed": 5,
                "capacity": True,
                "slo": "ttft=70ms",
                "capacity_percentile": 90,
                "sweep_points": 2,
                "sweep_concurrency": 4,
            }
        )
        outcome = run_plan(plan, tmp_path / "run", ["compare", "run"], n_boot=0, watcher=Watcher())
    assert outcome.code == 0
    entries = outcome.run_dir.manifest["points"]
    open_points = [p for p in entries if p["schedule"]["kind"] == "open"]
    assert open_points and all(p["num_requests"] == needed for p in open_points)
    measured = outcome.results.requests
    for p in entries:
        ids = measured.loc[measured["load_point"] == p["load_point"], "request_id"]
        want = needed if p["schedule"]["kind"] == "open" else 8
        assert len(ids) == want and ids.is_unique and not ids.str.contains("~").any(), p["load_point"]
