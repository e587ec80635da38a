"""Latency from the intended send, through a real open-loop run against the scripted server: a client held
back by its concurrency cap sends late, and the report must show the wait that lateness stands for."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from adapters import get_adapter
from adapters.request_spec import RequestSpec
from compare.analysis.diff import diff_runs
from compare.analysis.results import analyze
from compare.measure.run_dir import RunDir
from compare.report.write import write_reports
from instruments.scripted_server import ScriptedSchedule, scripted_server
from workloads import timing
from workloads.loadgen import PointJob, run_load_sync
from workloads.schedule import ClosedLoop, OpenLoop

pytestmark = pytest.mark.timing


def specs(prefix: str, n: int) -> list[RequestSpec]:
    return [RequestSpec(f"{prefix}-{i}", (5, 6, 7), "a b c", 6) for i in range(n)]


def measure(run: RunDir, url: str, run_id: str, schedule: OpenLoop | ClosedLoop) -> None:
    run.add_point(run_id, "vllm", "", "wl", schedule.label, schedule.describe())
    job = PointJob(
        url, get_adapter("vllm"), specs(run_id, 24), schedule, output_path=run.requests_path, run_id=run_id
    )
    run_load_sync(job)


def test_open_loop_run_reports_latency_from_the_intended_send(tmp_path):
    # each request takes >= 25 ms; two at a time serve at most 80 requests/s of the 200 offered: the cap
    # holds requests back, so they go out later and later
    with scripted_server(default_schedule=ScriptedSchedule(ttft_s=0.005, itl_s=0.004)) as server:
        run = RunDir.create(tmp_path / "run", {"model": "scripted"}, ["compare", "run"])
        measure(run, server.url, "open", OpenLoop(rate=200.0, arrival="constant", max_concurrency=2))
        measure(run, server.url, "closed", ClosedLoop(2))
    run.manifest["status"] = "complete"
    run.save()
    write_reports(analyze(run, n_boot=100))

    records = [r for r in run.records() if not r.warmup]
    opened = [r for r in records if r.run_id == "open"]
    assert len(opened) == 24 and all(r.ok for r in opened)
    for r in opened:  # the intended send is never after the real one
        assert timing.ttft_intended(r) >= timing.ttft(r) and timing.e2e_intended(r) >= timing.e2e(r)
    assert max(timing.client_lag(r) for r in opened) > 0.05  # the cap made the client late

    summary = pd.read_csv(run.path / "summary.csv").set_index("load_point")
    row = summary.loc["r=200"]
    assert row["ttft_intended_n"] == 24 and row["e2e_intended_n"] == 24
    for q in (50, 90, 99):
        want = np.percentile([timing.ttft_intended(r) for r in opened], q) * 1e3
        assert row[f"ttft_intended_p{q}_ms"] == pytest.approx(want, rel=1e-4)
        assert row[f"ttft_intended_p{q}_ms"] >= row[f"ttft_p{q}_ms"]
        assert row[f"e2e_intended_p{q}_ms"] >= row[f"e2e_p{q}_ms"]
    assert row["e2e_intended_p99_ms"] > row["e2e_p99_ms"] + 50  # the lag is in it
    closed = summary.loc["c=2"]  # a closed loop has no intended send time: left empty
    assert closed["ttft_intended_n"] == 0 and np.isnan(closed["ttft_intended_p50_ms"])

    report = (run.path / "report.md").read_text()
    section = report.split("## Latency from the intended send", 1)[1].split("\n## ", 1)[0]
    assert "r=200" in section and "c=2" not in section
    assert "the latencies from the intended send count the wait" in report.split("## Warnings", 1)[1]
    definitions = report.split("## Definitions", 1)[1]
    assert "TTFT from intended send: " in definitions and "time the schedule meant" in definitions
    assert "TTFT: first event carrying a generated token minus the time the client sent" in definitions

    # `compare diff` compares them where they exist: at the open-loop point, not at the closed-loop one
    table = diff_runs(run, run)
    intended = table[table["metric"].str.contains("intended")]
    assert set(intended["metric"]) == {"ttft_intended p50 (ms)", "e2e_intended p50 (ms)"}
    assert all("r=200" in point for point in intended["point"])
    assert (intended["n_a"] == 24).all()
