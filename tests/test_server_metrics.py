"""The backends' own counters over each load point: read from their `/metrics` before and after the point
(best effort), their growth stored in the point's entry in runs.jsonl."""

from __future__ import annotations

import json

import pytest
from compare_cli import run_compare
from servers import free_port
from test_duration_cut_warning import summary_of

from adapters import get_adapter
from compare.measure.server_metrics import ServerCounters, counter_deltas, scrape
from instruments.scripted_server import ScriptedSchedule, scripted_server
from workloads.loadgen import PointJob, with_server_metrics
from workloads.records import read_records
from workloads.schedule import ClosedLoop


def test_counter_deltas_leave_out_what_went_back_or_one_read_lacks():
    before = {"preemptions_total": 2.0, "requests_finished_total": 10.0, "prompt_tokens_total": 5.0}
    after = {"preemptions_total": 5.0, "requests_finished_total": 3.0, "e2e_seconds_count": 4.0}
    assert counter_deltas(before, after) == {"preemptions_total": 3.0}


def test_a_server_without_metrics_records_nothing():
    """An adapter that maps no metric is not read; a server that does not answer gives None, quickly."""
    assert scrape("http://127.0.0.1:9", get_adapter("openai")) is None
    url = f"http://127.0.0.1:{free_port()}"
    assert ServerCounters.read(url, get_adapter("vllm"), timeout=0.5) is None
    assert ServerCounters(url, get_adapter("vllm"), {"preemptions_total": 1.0}, timeout=0.5)() is None


def test_a_failing_counter_read_costs_the_point_nothing():
    def broken() -> dict[str, float]:
        raise RuntimeError("boom")

    summary = summary_of("p1", "c=1", 3, 1.0)
    job = PointJob("http://127.0.0.1:9", get_adapter("vllm"), [], ClosedLoop(1), server_metrics=broken)
    assert with_server_metrics(summary, job) == summary
    found = PointJob(
        "http://x", get_adapter("vllm"), [], ClosedLoop(1), server_metrics=lambda: {"a_total": 1}
    )
    assert with_server_metrics(summary, found).server_metrics == {"a_total": 1}


@pytest.mark.live
def test_each_points_entry_carries_the_servers_counter_growth(llama_dir, tmp_path):
    """Two points against the scripted server (vLLM's metric names): each entry in runs.jsonl says how many
    requests the server finished and how many tokens it generated during that point, and no more."""
    out = tmp_path / "run"
    fast = ScriptedSchedule(ttft_s=0.005, itl_s=0.001)
    with scripted_server(flavor="vllm", default_schedule=fast) as server:
        run_compare(
            "run", "--backends", "vllm", "--endpoint", f"vllm={server.url}", "--model", "scripted-model",
            "--tokenizer", str(llama_dir), "--concurrency", "1,2", "--num-requests", "5", "--warmup", "1",
            "--input-len", "16", "--output-len", "6", "--n-boot", "20", "--out", str(out),
        )  # fmt: skip
    entries = [json.loads(line) for line in (out / "runs.jsonl").read_text().splitlines()]
    assert [e["load_point"] for e in entries] == ["c=1", "c=2"]
    records = list(read_records(out / "requests.jsonl"))
    for e in entries:
        point = [r for r in records if r.run_id == e["run_id"]]  # the warm-up requests fall inside the point
        assert len(point) == e["n_warmup"] + e["n_measured"] == 6
        assert e["server_metrics"] == {
            "requests_finished_total": len(point),
            "generation_tokens_total": sum(r.output_tokens for r in point),
        }
