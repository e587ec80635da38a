"""The load generator's schedules, bounds, warm-up, progress reports and cancellation, against the
scripted server (its log tells when each request really arrived and ended)."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

from adapters import get_adapter
from adapters.request_spec import RequestSpec
from instruments.scripted_server import ScriptedSchedule, read_event_log, scripted_server
from workloads import timing
from workloads.loadgen import PointJob, new_runner, run_load, run_load_sync
from workloads.records import ErrorKind, read_records, read_run_summaries
from workloads.schedule import ClosedLoop, OpenLoop, TraceReplay

pytestmark = pytest.mark.timing  # run again beside CPU burners in CI (.ci/under_load.sh)

DATA = Path(__file__).parent / "data"
REPO = Path(__file__).parents[1]


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    log = tmp_path_factory.mktemp("schedules") / "events.jsonl"
    schedule = ScriptedSchedule(ttft_s=0.005, itl_s=0.004)
    with scripted_server(event_log=log, default_schedule=schedule) as handle:
        yield handle


def make_specs(prefix: str, n: int, out: int = 6, schedule: dict | None = None) -> list[RequestSpec]:
    headers = {"X-Scripted-Schedule": json.dumps(schedule)} if schedule else {}
    return [RequestSpec(f"{prefix}-{i}", (5, 6, 7), "a b c", out, extra_headers=headers) for i in range(n)]


def max_overlap(intervals: list[tuple[float, float]]) -> int:
    edges = sorted([(a, 1) for a, _ in intervals] + [(b, -1) for _, b in intervals])
    level = peak = 0
    for _, step in edges:
        level += step
        peak = max(peak, level)
    return peak


def test_closed_loop_keeps_exactly_n_in_flight(server):
    specs = make_specs("closed", 30, out=10, schedule={"itl_s": [0.002, 0.011, 0.005]})
    records = run_load_sync(PointJob(server.url, get_adapter("vllm"), specs, ClosedLoop(5)))
    assert len(records) == 30 and all(r.ok for r in records)
    log = read_event_log(server.event_log, expect=[r.request_id for r in records])
    spans = [(log[r.request_id]["received_s"], log[r.request_id]["events"][-1][0]) for r in records]
    assert max_overlap(spans) == 5
    assert all(r.load_point == "c=5" for r in records)


def test_open_loop_sends_on_schedule_and_reports_lag(server, tmp_path):
    schedule = OpenLoop(rate=50.0, arrival="poisson", seed=4)
    out = tmp_path / "requests.jsonl"
    records = run_load_sync(
        PointJob(server.url, get_adapter("vllm"), make_specs("open", 40), schedule, output_path=out)
    )
    records.sort(key=lambda r: r.scheduled_s)
    start = records[0].scheduled_s
    assert [r.scheduled_s - start for r in records] == pytest.approx(schedule.offsets(40).tolist(), abs=1e-9)
    lags = [timing.client_lag(r) for r in records]
    assert min(lags) >= 0  # never sent before its time
    [summary] = read_run_summaries(tmp_path / "runs.jsonl")
    assert summary.offered_rate == 50.0 and summary.n_measured == 40 and summary.n_ok == 40
    sends = sorted(r.send_s for r in records)
    assert summary.achieved_rate == pytest.approx(39 / (sends[-1] - sends[0]))
    assert summary.lag_p50_s == pytest.approx(float(np.percentile(lags, 50)))
    assert summary.schedule["kind"] == "open" and summary.schedule["adapter"]["adapter"] == "vllm"


def test_open_loop_concurrency_cap_shows_as_lag(server):
    slow = {"ttft_s": 0.05, "itl_s": 0.01}
    records = run_load_sync(
        PointJob(
            server.url,
            get_adapter("vllm"),
            make_specs("capped", 6, 5, slow),
            OpenLoop(rate=1000.0, arrival="constant", max_concurrency=2),
        )
    )
    lags = sorted(timing.client_lag(r) for r in records)
    assert lags[-1] > 0.15  # the last ones waited for two earlier pairs of ~90 ms requests


def test_trace_replay(server):
    trace = TraceReplay.from_file(DATA / "trace.txt", time_scale=0.05)
    records = run_load_sync(PointJob(server.url, get_adapter("tgi"), make_specs("trace", 6), trace))
    records.sort(key=lambda r: r.scheduled_s)
    offsets = [r.scheduled_s - records[0].scheduled_s for r in records]
    assert offsets == pytest.approx([0.0, 0.0125, 0.025, 0.075, 0.075, 0.15], abs=1e-9)
    assert all(r.send_s >= r.scheduled_s for r in records) and records[0].load_point == "trace=trace.txt"


@pytest.mark.parametrize("schedule", [ClosedLoop(3), OpenLoop(100.0)], ids=["closed", "open"])
def test_warmup_is_recorded_and_flagged(server, tmp_path, schedule):
    out = tmp_path / "requests.jsonl"
    records = run_load_sync(
        PointJob(
            server.url,
            get_adapter("vllm"),
            make_specs("measured", 6),
            schedule,
            output_path=out,
            warmup_specs=make_specs("warm", 3),
        )
    )
    assert sorted(r.request_id for r in records if r.warmup) == ["warm-0", "warm-1", "warm-2"]
    assert len(read_records(out, include_warmup=False)) == 6
    [summary] = read_run_summaries(tmp_path / "runs.jsonl")
    assert (summary.n_warmup, summary.n_measured) == (3, 6)
    first_measured = min(r.scheduled_s for r in records if not r.warmup)
    assert summary.measured_start_s == pytest.approx(first_measured)


def test_bounds_by_count_and_by_duration(server):
    records = run_load_sync(
        PointJob(server.url, get_adapter("vllm"), make_specs("b", 3), ClosedLoop(2), max_requests=7)
    )
    assert sorted(r.request_id for r in records) == sorted(
        ["b-0", "b-1", "b-2", "b-0~1", "b-1~1", "b-2~1", "b-0~2"]
    )
    # Two streams of requests that last >= 50 ms (the server waits that long for the first token) for 1 s: at
    # most 2 * (1 / 0.05 + 1) requests, and at least three, so a spec is reused, however slow the machine.
    timed = run_load_sync(
        PointJob(
            server.url,
            get_adapter("vllm"),
            make_specs("d", 2, 4, {"ttft_s": 0.05}),
            ClosedLoop(2),
            max_duration_s=1.0,
        )
    )
    starts = sorted(r.start_s for r in timed)
    assert 3 <= len(timed) <= 42 and starts[-1] - starts[0] < 1.0  # none started after the bound
    assert len({r.request_id for r in timed}) == len(timed)  # cycled specs get fresh ids


def test_progress_reports(server):
    seen: list[int] = []
    records = run_load_sync(
        PointJob(
            server.url,
            get_adapter("vllm"),
            make_specs("p", 8, 5, {"ttft_s": 0.05}),
            ClosedLoop(2),
            progress=lambda rs: seen.append(len(rs)),
            progress_interval_s=0.05,
        )
    )
    assert seen == sorted(seen) and seen[-1] == len(records) == 8 and len(seen) >= 3


def test_bad_input_fails_before_sending(server, tmp_path):
    with pytest.raises(ValueError, match="no request specs"):
        run_load_sync(PointJob(server.url, get_adapter("vllm"), [], ClosedLoop(1)))
    with pytest.raises(ValueError, match="appears twice"):
        run_load_sync(PointJob(server.url, get_adapter("vllm"), make_specs("x", 1) * 2, ClosedLoop(1)))
    with pytest.raises(ValueError, match="rejects unknown request fields"):
        bad = [RequestSpec("x", (1,), "x", 2, extra_body={"not_a_field": 1})]
        run_load_sync(
            PointJob(
                server.url,
                get_adapter("trtllm", model="m"),
                bad,
                ClosedLoop(1),
                output_path=tmp_path / "r.jsonl",
            )
        )
    with pytest.raises(ValueError, match="absolute"):
        run_load_sync(PointJob("127.0.0.1:80", get_adapter("vllm"), make_specs("x", 1), ClosedLoop(1)))
    assert not (tmp_path / "r.jsonl").exists() or not (tmp_path / "r.jsonl").read_text()


def test_cancelling_the_run_records_in_flight_requests(server, tmp_path):
    out = tmp_path / "requests.jsonl"
    long = {"ttft_s": 0.01, "itl_s": 0.05}  # 200 tokens: 10 s a stream, far longer than the wait
    server.wait_idle()  # no stream left over from an earlier test counts as one of ours

    async def scenario():
        task = asyncio.create_task(
            run_load(
                PointJob(
                    server.url,
                    get_adapter("vllm"),
                    make_specs("c", 6, 200, long),
                    ClosedLoop(3),
                    output_path=out,
                )
            )
        )
        # every stream has had 10 tokens written (half a second of them) before the cancel
        await asyncio.to_thread(server.wait_streaming, 3, 60.0, 10)
        task.cancel()
        return await task  # returns normally: cancellation is recorded, not raised

    with new_runner() as runner:
        records = runner.run(scenario())
    assert [r.error_kind for r in records] == [ErrorKind.CANCELLED] * 3
    # what each had read is kept; written is not read, so a client starved that long may have none yet
    assert all(0 <= r.event_tokens < 200 for r in records) and sum(r.event_tokens for r in records) > 0
    assert all(r.event_tokens == sum(e[1] for e in r.events) for r in records)
    assert read_records(out) == records
    assert read_run_summaries(tmp_path / "runs.jsonl")[0].interrupted


def test_ctrl_c_stops_cleanly(server, tmp_path):
    out = tmp_path / "requests.jsonl"
    script = textwrap.dedent(f"""
        import json, signal, sys
        # Ctrl-C as a terminal delivers it, also when this test runs as a background job (which starts with
        # SIGINT ignored, and asyncio then leaves it so)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        from adapters import get_adapter
        from workloads.loadgen import PointJob, run_load_sync
        from workloads.schedule import ClosedLoop
        from adapters.request_spec import RequestSpec
        header = {{"X-Scripted-Schedule": json.dumps({{"itl_s": 0.05}})}}
        specs = [RequestSpec(f"sig-{{i}}", (1,), "x", 200, extra_headers=header) for i in range(8)]
        print("started", flush=True)
        records = run_load_sync(PointJob({server.url!r}, get_adapter("vllm"), specs, ClosedLoop(4),
                                         output_path={str(out)!r}))
        print(json.dumps(sorted(str(r.error_kind) for r in records)), flush=True)
    """)
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    server.wait_idle()  # streams the previous test cancelled must not count as these four
    proc = subprocess.Popen(
        [sys.executable, "-c", script], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env
    )
    assert proc.stdout.readline().strip() == "started"
    server.wait_streaming(4)  # the four streams are under way (10 s each), however slow the machine
    proc.send_signal(signal.SIGINT)
    stdout, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 0, stderr
    kinds = json.loads(stdout.strip().splitlines()[-1])
    assert kinds == ["cancelled"] * 4
    assert len(read_records(out)) == 4
