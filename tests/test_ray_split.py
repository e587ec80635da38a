"""Splitting a load point over several load generators, and putting their records on one clock: pure
functions, no Ray needed."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from adapters.request_spec import RequestSpec
from compare.plan.build import build_plan
from compare.plan.run_options import PlanError
from workloads import timing
from workloads.clocks import ClockSample, estimate_offset, to_driver_clock
from workloads.records import RequestRecord
from workloads.schedule import ClosedLoop, OpenLoop, TraceReplay
from workloads.split import expand_specs, split_point

ROOT = Path(__file__).resolve().parents[1]


def specs(prefix: str, n: int) -> list[RequestSpec]:
    return [RequestSpec(f"{prefix}-{i}", (1, 2, 3), "a b c", 4) for i in range(n)]


def test_closed_loop_shares_sum_to_the_concurrency_and_the_count():
    shares = split_point(
        specs("m", 10), specs("w", 4), ClosedLoop(4), 3, max_requests=16, max_duration_s=None
    )
    assert [s.schedule.concurrency for s in shares] == [2, 1, 1]
    sent = [spec.request_id for s in shares for spec in s.specs]
    assert sorted(sent) == sorted(s.request_id for s in expand_specs(specs("m", 10), 16))
    assert [len(s.specs) for s in shares] == [8, 4, 4]  # in proportion to the concurrency
    assert [s.max_requests for s in shares] == [8, 4, 4]
    assert [len(s.warmup_specs) for s in shares] == [2, 1, 1]  # one warm-up per stream, as on one host
    # more generators than streams: only as many as there are streams
    assert len(split_point(specs("m", 8), [], ClosedLoop(2), 5, max_requests=8, max_duration_s=None)) == 2
    # bounded by time only: each generator cycles its own share, and their ids never collide
    timed = split_point(specs("m", 9), [], ClosedLoop(3), 3, max_requests=None, max_duration_s=5.0)
    assert [s.max_requests for s in timed] == [None] * 3 and all(s.max_duration_s == 5.0 for s in timed)
    ids = [spec.request_id for s in timed for spec in s.specs]
    assert len(ids) == len(set(ids)) == 9


@pytest.mark.parametrize(
    "schedule",
    [OpenLoop(20, "poisson", seed=3), OpenLoop(20, "gamma", 0.3, seed=4), OpenLoop(20, "constant")],
    ids=["poisson", "gamma", "constant"],
)
def test_open_loop_shares_are_the_single_host_arrivals_dealt_out(schedule):
    """The union of the generators' send times is exactly the sequence one host would send, each with the
    request one host would pair with it, for every arrival process."""
    n = 50
    shares = split_point(specs("m", 20), specs("w", 2), schedule, 3, max_requests=n, max_duration_s=None)
    sends = {}
    for s in shares:
        assert isinstance(s.schedule, TraceReplay)
        times = s.start_offset_s + s.schedule.offsets(len(s.schedule.times))
        assert len(times) == len(s.specs) == s.max_requests
        sends |= {spec.request_id: t for spec, t in zip(s.specs, times, strict=True)}
        assert s.warmup_specs  # every generator warms up, with a renamed copy when there are too few
    one_host = dict(
        zip([x.request_id for x in expand_specs(specs("m", 20), n)], schedule.offsets(n), strict=True)
    )
    assert sends.keys() == one_host.keys()
    assert max(abs(sends[k] - one_host[k]) for k in one_host) < 1e-9
    # a duration cuts the same sequence at the same place
    cut = split_point(specs("m", 20), [], schedule, 3, max_requests=None, max_duration_s=1.0)
    assert sum(len(s.specs) for s in cut) == int(np.sum(schedule.offsets(200) < 1.0))


def test_clock_offset_takes_the_shortest_round_trip():
    # the host's clock is 1000 s ahead; the second exchange was quick and symmetric
    samples = [
        ClockSample(10.0, 10.010, 1010.002, 0, 0),
        ClockSample(11.0, 11.001, 1011.0005, 5_000_000_000, 5_000_000_000 + 2_000_000),
        ClockSample(12.0, 12.030, 1012.001, 0, 0),
    ]
    offset = estimate_offset(samples)
    assert offset.offset_s == pytest.approx(-1000.0, abs=1e-9)
    assert offset.uncertainty_s == pytest.approx(0.0005) and offset.samples == 3
    assert offset.wall_offset_s == pytest.approx(0.002)


def test_moving_a_record_to_the_driver_clock_keeps_every_interval():
    skew = 1000.0  # the measuring host's monotonic clock is 1000 s ahead of the driver's
    record = RequestRecord(
        run_id="r",
        request_id="q",
        backend="vllm",
        t0_monotonic=5000.0 + skew,
        prompt_tokens=3,
        wanted_output_tokens=4,
        output_length_forced=True,
        scheduled_s=1.0,
        start_s=1.0001,
        send_s=1.002,
        headers_s=1.01,
        end_s=1.2,
        events=[(1.05, 0, 0), (1.07, 1, 2), (1.09, 2, 4), (1.15, 1, 2)],
        output_tokens=4,
        event_tokens=4,
    )
    moved = to_driver_clock(record, t0=4990.0, offset_s=-skew, host="actor-1@10.0.0.7")
    assert moved.t0_monotonic == 4990.0 and moved.host == "actor-1@10.0.0.7"
    assert moved.send_s == pytest.approx(11.002, abs=1e-9)  # 10 s later on the driver's timeline
    for fn in (timing.ttft, timing.e2e, timing.tpot, timing.client_lag):
        assert fn(moved) == pytest.approx(fn(record), abs=1e-9)
    assert timing.itl(moved) == pytest.approx(timing.itl(record), abs=1e-9)
    # back on the measuring host's own clock
    assert moved.t0_monotonic + moved.send_s - moved.clock_offset_s == pytest.approx(6001.002, abs=1e-9)
    assert RequestRecord.model_validate_json(moved.model_dump_json()) == moved


def test_plan_takes_ray_options_from_the_command_line_and_the_run_file(tmp_path):
    plan = build_plan({"ray": "127.0.0.2:6379", "ray_actors": 3, "ray_cell_resources": "GPU=1,accel=0.5"})
    assert (plan.ray, plan.ray_actors, plan.ray_cells) == ("127.0.0.2:6379", 3, False)
    assert plan.ray_cell_resources == {"GPU": 1.0, "accel": 0.5}
    assert plan.describe()["ray"]["actors"] == 3
    assert "ray" not in build_plan({}).describe()
    run_file = tmp_path / "run.yaml"
    run_file.write_text("ray: true\nray_cells: true\nray_cell_resources: {GPU: 2}\n")
    plan = build_plan({}, run_file)
    assert (plan.ray, plan.ray_cells, plan.ray_cell_resources) == ("local", True, {"GPU": 2.0})
    with pytest.raises(PlanError, match="GPU=1"):
        build_plan({"ray": "local", "ray_cell_resources": "GPU=lots"})
    with pytest.raises(PlanError, match="ray_actors"):
        build_plan({"ray": "local", "ray_actors": 0})


def test_without_ray_nothing_imports_it():
    code = (
        "import sys\n"
        "from typer.testing import CliRunner\n"
        "from compare.cli import app\n"
        "import compare.report.write, compare.measure.run_dir, workloads.loadgen\n"
        "result = CliRunner().invoke(app, ['run', '--help'])\n"
        "assert result.exit_code == 0 and '--ray' in result.output, result.output\n"
        "assert 'ray' not in sys.modules, 'ray was imported'\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT, timeout=120)
