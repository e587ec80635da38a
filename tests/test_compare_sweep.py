"""`compare run --sweep --capacity`: the rules on synthetic points, and a real sweep against the scripted
server with a known capacity (`--max-streams`): the sweep must not stop before it, and the capacity found
under the SLO must lie within the stated precision of the one computed from the scripted timings."""

from __future__ import annotations

import dataclasses
import itertools
import math

import numpy as np
import pytest
from checkpoints import make_tokenizer

from compare.analysis import capacity, sweep
from compare.analysis.load_search import MAX_BISECTIONS, Sweep, next_rate, sweep_rates
from compare.analysis.sweep import PointFacts, first_saturated, knee, saturation
from compare.measure.watcher import Watcher
from compare.plan.build import build_plan
from compare.runner import run_plan
from instruments.scripted_server import ScriptedSchedule, scripted_server


def point(
    rate: float | None,
    ttft_ms: float,
    completed: float | None = None,
    *,
    concurrency: int | None = None,
    rising: bool = False,
    failed: float = 0.0,
    n: int = 200,
    sent: float | None = None,
    values: dict | None = None,
) -> PointFacts:
    """A synthetic point of `n` requests sent at `sent` (default: the offered rate) on schedule, completed at
    `completed` requests/s (default: as sent)."""
    sent = (rate or 10.0) if sent is None else sent
    completed = sent if completed is None else completed
    ttft = ttft_ms / 1e3
    return PointFacts(
        label=f"r={rate:g}" if rate else f"c={concurrency}",
        concurrency=concurrency,
        offered_rps=rate,
        throughput_rps=completed or 10.0,
        ttft_p50_s=ttft,
        ttft_early_s=ttft * (0.5 if rising else 1.0),
        ttft_late_s=ttft * (1.5 if rising else 1.0),
        failed_share=failed,
        sent=n,
        send_span_s=(n - 1) / sent,
        intended_span_s=(n - 1) / sent if rate else math.nan,
        completed=n,
        end_span_s=(n - 1) / (completed or 10.0),
        ttft_rise_p=1e-6 if rising else 0.5,
        values=values or {},
    )


SYNC = point(None, 20.0, concurrency=1)


def test_saturation_rules_on_synthetic_points():
    assert saturation(point(10, 22), SYNC) == ""
    assert "completed 6 " in saturation(point(10, 22, completed=6.0), SYNC)  # 60 % of the sends, n=200
    # 75 %: the test of two Poisson counts (conservative: a point's sends and ends are not independent) leaves
    # it to the TTFT rule, which a queue growing this fast meets
    assert saturation(point(10, 22, completed=7.5), SYNC) == ""
    assert saturation(point(10, 22, completed=9.5), SYNC) == ""  # 95 %: within the tolerance
    # compared with what was sent, not the offered rate: a draw that sent at 0.7 x the rate is not saturation
    assert saturation(point(10, 22, sent=7.0), SYNC) == ""
    # a few requests cannot show a shortfall that chance explains: 80 % of 16 sends
    assert saturation(point(10, 22, completed=8.0, n=16), SYNC) == ""
    # latency: 5 x the synchronous TTFT, rising within the point; high but flat is not unbounded growth
    assert "rising" in saturation(point(10, 100, rising=True), SYNC)
    assert saturation(point(10, 100), SYNC) == ""
    assert saturation(point(10, 70, rising=True), SYNC) == ""  # 3.5 x: below TTFT_GROWTH
    assert "failed" in saturation(point(10, 20, failed=0.2), SYNC)
    # the client behind its own schedule: sends spread over 1 / 0.8 of their intended span
    slow_client = dataclasses.replace(point(10, 20), send_span_s=point(10, 20).send_span_s / 0.8)
    assert "client sent" in saturation(slow_client, SYNC)


def test_knee_and_saturation_point_on_synthetic_sweep():
    points = [
        SYNC,
        point(5, 21),
        point(8, 35),
        point(11, 45),
        point(14, 200, completed=11, rising=True),
        point(20, 300, completed=11, rising=True),
    ]
    assert knee(points, SYNC).offered_rps == 8  # 35 ms <= 2 x 20; 45 ms is past it
    found = first_saturated(points, SYNC)
    assert found is not None and found[0].offered_rps == 14
    # nothing past the first saturated point is a knee, even where its TTFT looks fine again
    assert knee([SYNC, point(5, 60), point(9, 30, completed=5), point(12, 21)], SYNC) is None
    # the most served is the point that served the most, open loops included
    assert sweep.most_served(points).label == "r=11"


def test_sweep_rates_span_synchronous_to_beyond_saturating():
    geo = sweep_rates(10.0, 40.0, 4, "geometric")
    assert geo[-1] == pytest.approx(50.0) and geo[0] > 10.0
    assert geo[1] / geo[0] == pytest.approx(geo[2] / geo[1])
    lin = sweep_rates(10.0, 40.0, 4, "linear")
    assert lin == pytest.approx([20.0, 30.0, 40.0, 50.0])
    flat = sweep_rates(10.0, 10.0, 2, "linear")  # no batching: from half the throughput up
    assert flat == pytest.approx([9.375, 12.5])


def test_sweep_runs_upwards_and_stops_at_the_first_saturated_point():
    """A backend serving 30 requests/s at most, 10 one at a time: the driver must go up from the
    synchronous throughput, stop at the first saturated rate and measure nothing after it. Each open-loop
    point draws its arrivals with a seed of its own, derived from the run's."""
    from workloads.schedule import ClosedLoop, OpenLoop, point_seed

    asked = []

    def measure(schedule):
        asked.append(schedule)
        if isinstance(schedule, ClosedLoop):
            return point(
                None, 20.0, 10.0 if schedule.concurrency == 1 else 30.0, concurrency=schedule.concurrency
            )
        over = schedule.rate > 30
        return point(schedule.rate, 200.0 if over else 22.0, min(schedule.rate, 30.0), rising=over)

    driver = Sweep(4, "linear", 16, OpenLoop(1.0, "constant", seed=7))
    points = driver.run(measure)
    rates = [p.offered_rps for p in points[2:]]
    assert asked[:2] == [ClosedLoop(1), ClosedLoop(16)]
    assert rates == pytest.approx([16.88, 23.75, 30.62], abs=0.01)  # 10 .. 37.5 in 4 steps; 30.62 saturates
    assert all(s.arrival == "constant" for s in asked[2:])
    seeds = [s.seed for s in asked[2:]]
    assert len(set(seeds)) == len(seeds) and 7 not in seeds
    assert seeds == [point_seed(7, k) for k in range(2, 2 + len(seeds))]  # the place in the sweep's order
    failed = Sweep(4, "linear", 16, OpenLoop(1.0)).run(
        lambda s: point(None, math.nan, math.nan, concurrency=getattr(s, "concurrency", 0), failed=1.0)
    )
    assert len(failed) == 2  # nothing was served: no rate to sweep


H, M, U = capacity.HOLDS, capacity.MISSES, capacity.UNDETERMINED


def test_capacity_bracket_and_bisection():
    verdicts = [(10.0, H), (20.0, H), (30.0, M), (25.0, H), (40.0, M)]
    assert capacity.bracket(verdicts) == (25.0, 30.0)
    assert next_rate(verdicts, 0.1) == pytest.approx(27.5)
    assert next_rate(verdicts, 0.2) is None  # 5 <= 0.2 x 30
    assert capacity.bracket([(10.0, H), (20.0, H)]) == (20.0, None)
    assert next_rate([(10.0, M)], 0.1) == 5.0  # nothing met it yet: towards 0
    # a rate that met the SLO above the lowest miss (noise) does not widen the bracket upwards
    assert capacity.bracket([(10.0, H), (20.0, M), (30.0, H)]) == (10.0, 20.0)
    # an undetermined rate is neither end: the bracket stays, and the search splits the widest gap around it
    assert capacity.bracket([(10.0, H), (20.0, U), (40.0, M)]) == (10.0, 40.0)
    assert next_rate([(10.0, H), (20.0, U), (40.0, M)], 0.1) == pytest.approx(30.0)
    assert next_rate([(10.0, H), (25.0, U), (40.0, M)], 0.1) == pytest.approx(32.5)  # a tie: higher
    assert next_rate([(10.0, H), (12.0, U), (13.0, M)], 0.2) is None  # gaps of 2 and 1 <= 2.6


def test_capacity_verdicts_from_distribution_free_bounds():
    """p90 of a TTFT SLO of 50 ms: 100 requests at 20 ms hold it; 100 at 80 ms miss it; 10 requests at 20 ms
    cannot show it holds (29 needed), and the capacity is then undetermined, never 'holds'."""
    slo = {"ttft": 0.05}
    rng = np.random.default_rng(3)

    def at(rate: float, ms: float, n: int = 100, failed: int = 0) -> PointFacts:
        facts = point(rate, ms, n=n, values={"ttft": rng.uniform(0.9, 1.1, n) * ms / 1e3})
        return dataclasses.replace(facts, failed=failed)

    sync = dataclasses.replace(at(None, 20.0), concurrency=1, label="c=1")  # type: ignore[arg-type]
    assert capacity.point_verdict(at(10, 20), sync, slo, 90) == H
    assert capacity.point_verdict(at(10, 80), sync, slo, 90) == M
    assert capacity.point_verdict(at(10, 20, n=10), sync, slo, 90) == U
    assert capacity.point_verdict(at(10, 20, failed=30), sync, slo, 90) == M  # failures miss any limit
    # a saturated point misses the SLO whatever its percentiles say
    assert capacity.point_verdict(dataclasses.replace(at(10, 20), end_span_s=99 / 5), sync, slo, 90) == M
    result = capacity.capacity_of([sync, at(10, 20), at(20, 80)], slo, 90)
    assert (result.lo, result.hi, result.width, result.decided) == (10, 20, 10, True)
    estimate, lo, hi, n = result.intervals["lo"]["ttft"]
    assert lo <= estimate <= hi and n == 100 and hi < 50
    few = capacity.capacity_of([sync, at(10, 20, n=10), at(20, 80, n=10)], slo, 90)
    assert not few.decided and few.lo == 0 and few.hi == 20 and few.undetermined == [10]
    noisy = capacity.capacity_of([sync, at(10, 20), at(20, 80), at(30, 20)], slo, 90)
    assert noisy.met_above == [30]


MAX_STREAMS, TTFT_S, ITL_S, OUTPUT = 4, 0.04, 0.02, 4
SERVICE_S = TTFT_S + (OUTPUT - 1) * ITL_S  # one request holds its slot this long
TRUE_CAPACITY = MAX_STREAMS / SERVICE_S  # 40 requests/s: beyond it the queue, and TTFT, grow


@pytest.mark.live
@pytest.mark.timing
def test_sweep_and_capacity_against_a_server_of_known_capacity(tmp_path):
    """Four streams at a time, 100 ms each: 40 requests/s at most. Constant arrivals below that never queue
    (TTFT 40 ms); above it the queue grows through the point, so an 80 ms TTFT SLO holds up to 40/s. The SLO
    is read at p90, and leaves 40 ms for the machine's own delays, so a few requests slowed by a busy machine
    (one in forty sets a p99) do not decide a verdict that the server's queue should."""
    make_tokenizer(tmp_path / "tok")
    schedule = ScriptedSchedule(ttft_s=TTFT_S, itl_s=ITL_S, output_tokens=OUTPUT)
    with scripted_server(default_schedule=schedule, max_streams=MAX_STREAMS) as server:
        plan = build_plan(
            {
                "backends": "vllm",
                "endpoints": [f"vllm={server.url}"],
                "model": "scripted-model",
                "tokenizer": str(tmp_path / "tok"),
                "input_len": "8",
                "output_len": str(OUTPUT),
                "num_requests": 40,
                "arrival": "constant",
                "capacity": True,
                "slo": "ttft=80ms",
                "capacity_percentile": 90,
                "sweep_points": 3,
                "sweep_concurrency": 2 * MAX_STREAMS,
                "capacity_precision": 0.1,
            }
        )
        outcome = run_plan(plan, tmp_path / "run", ["compare", "run"], n_boot=200, watcher=Watcher())
    assert outcome.code == 0
    summary = outcome.results.summary
    order = [p["load_point"] for p in outcome.run_dir.manifest["points"]]
    assert order[:2] == ["c=1", f"c={2 * MAX_STREAMS}"]
    rows = summary.set_index("load_point")
    assert rows.loc[f"c={2 * MAX_STREAMS}", "request_rps"] == pytest.approx(TRUE_CAPACITY, rel=0.25)
    rates = [float(label[2:]) for label in order[2:]]
    found = sweep.sweep_of(summary, outcome.results.requests)[("vllm", "", summary["workload"].iloc[0])]
    sync = found[0]
    saturated = first_saturated(found, sync)
    assert saturated is not None
    sat_rate = saturated[0].offered_rps
    assert sat_rate >= 0.9 * TRUE_CAPACITY  # it did not stop before the true saturation ...
    # ... swept upwards to the first saturated point it ran, then only bisected below it (a bisected rate may
    # itself lie above the capacity, and be saturated)
    saturated_rates = {p.offered_rps for p in found if saturation(p, sync)}
    stop = next(i for i, r in enumerate(rates) if r in saturated_rates)
    assert rates[: stop + 1] == sorted(rates[: stop + 1])
    assert all(r < rates[stop] for r in rates[stop + 1 :])

    result = capacity.capacity_of(found, {"ttft": 0.08}, 90)
    assert result.hi is not None
    # the stated precision: each gap between the bracket's ends and the rates inside it left undetermined
    # (which no bisection can decide) is at most a tenth of the upper end, unless the search ran out of points
    inside = sorted({result.lo, result.hi, *(r for r in result.undetermined if result.lo < r < result.hi)})
    widest = max(b - a for a, b in itertools.pairwise(inside))
    assert widest <= 0.1 * result.hi or len(rates) - (stop + 1) >= MAX_BISECTIONS, (result, rates)
    # the truth lies in the bracket, widened by the precision (and the machine's own overhead per request,
    # which only lowers the capacity)
    assert result.lo - result.width <= TRUE_CAPACITY <= result.hi + result.width
    assert result.lo >= 0.75 * TRUE_CAPACITY
    report = (outcome.run_dir.path / "report.md").read_text()
    section = report.split("## Sweep and capacity", 1)[1].split("\n## ", 1)[0]
    assert "knee" in section and "saturat" in section and f"{result.lo:.4g}" in section
    assert f"capacity under the SLO {result.lo:.4g} requests/s" in section
    decision = report.split("## Decision", 1)[1].split("\n## ", 1)[0]
    assert decision.index("Capacity under the SLO") < decision.index("Interactive")  # it leads the decision
    html = (outcome.run_dir.path / "report.html").read_text()
    assert ">knee</text>" in html and ">saturated</text>" in html  # ringed on the latency-throughput plots
    assert not math.isnan(rows.loc["c=1", "ttft_p50_ms"])


@pytest.mark.live
@pytest.mark.timing
def test_scripted_server_max_streams_queues_beyond_its_capacity(tmp_path):
    """Twice as many at a time as there are slots: half the requests wait about a service time for a slot,
    so their TTFT is about that plus the scripted TTFT; the server never completes more than 4 / 100 ms."""
    from adapters import get_adapter
    from adapters.request_spec import RequestSpec
    from workloads import timing
    from workloads.loadgen import PointJob, run_load_sync
    from workloads.records import read_records
    from workloads.schedule import ClosedLoop

    schedule = ScriptedSchedule(ttft_s=TTFT_S, itl_s=ITL_S, output_tokens=OUTPUT)
    specs = [RequestSpec(f"q-{i}", (5, 6, 7), "a b c", OUTPUT) for i in range(24)]
    with scripted_server(default_schedule=schedule, max_streams=MAX_STREAMS) as server:
        run_load_sync(
            PointJob(
                server.url,
                get_adapter("vllm"),
                specs,
                ClosedLoop(2 * MAX_STREAMS),
                output_path=tmp_path / "r.jsonl",
                run_id="q",
            )
        )
    records = [r for r in read_records(tmp_path / "r.jsonl") if not r.warmup]
    assert len(records) == 24 and all(r.ok for r in records)
    ttfts = sorted(timing.ttft(r) for r in records)
    # half waited for a slot: in the steady state a request waits for the slot that was taken just before it
    # was sent, so about one service time (a little less: the client learns of a completion after the server
    # frees its slot); a request that did not wait has a TTFT of TTFT_S
    assert ttfts[0] >= TTFT_S and ttfts[len(ttfts) // 2] >= TTFT_S + 0.8 * SERVICE_S
    span = max(r.t0_monotonic + r.end_s for r in records) - min(r.t0_monotonic + r.send_s for r in records)
    assert len(records) / span <= TRUE_CAPACITY * 1.05


def test_capacity_sentences_never_claim_more_than_the_points_show():
    """Too few requests a point for a p99: the capacity is undetermined (and says how many it takes), never
    'holds'; a decided one states its bracket and the rates left undetermined above it."""
    from compare.report.sweep_section import capacity_row, capacity_sentence

    slo = {"ttft": 0.05}
    few = capacity.Capacity(0.0, 20.0, 99, smallest_n=16, undetermined=[10.0])
    text = capacity_sentence(few, slo)
    assert "undetermined" in text and "16 requests" in text and "299" in text and "holds" in text
    assert capacity_row("a", "w", few, slo)[2] == "undetermined"
    found = capacity.Capacity(10.0, 20.0, 99, smallest_n=400, undetermined=[15.0])
    text = capacity_sentence(found, slo)
    assert text.startswith("capacity under the SLO 10 requests/s") and "undetermined at 15" in text
