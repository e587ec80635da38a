"""The backends' own counters over each load point: read from their `/metrics` before and after the point
(best effort), their growth stored in the point's entry in runs.jsonl, and read back as warnings where a
backend preempted sequences or its prefix cache answered prompts that were all new."""

from __future__ import annotations

import json

import pytest
from compare_cli import run_compare
from servers import free_port
from test_compare_report import requests_for
from test_duration_cut_warning import summary_of

from adapters import get_adapter
from compare.analysis.caveats import server_counter_qualifiers
from compare.analysis.results import analyze
from compare.measure.run_dir import RunDir
from compare.measure.server_metrics import ServerCounters, counter_deltas, scrape
from compare.report.render import to_markdown
from compare.report.sections import build_blocks
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
        # the server counts a request once its stream is written, a moment after the client has read it: the
        # read after the point may miss the last few (at most the point's concurrency), never count more
        counted, window = e["server_metrics"], int(e["load_point"].removeprefix("c="))
        assert set(counted) == {"requests_finished_total", "generation_tokens_total"}
        assert len(point) - window <= counted["requests_finished_total"] <= len(point), counted
        tokens = sum(r.output_tokens for r in point)
        assert tokens - 6 * window <= counted["generation_tokens_total"] <= tokens, counted


def _counters_run(
    tmp_path, counters: dict[str, float], prompts: str = "per_request", dataset: str = "random"
):
    config = {
        "model": "m",
        "slo_s": {},
        "num_requests": 8,
        "repeats": 1,
        "workloads": [{"dataset": dataset, "label": "wl"}],
    }
    run = RunDir.create(tmp_path / "run", config, ["compare", "run"])
    run.add_point("p1", "vllm", "", "wl", "c=4", {"kind": "closed", "concurrency": 4})
    run.manifest["points"][-1]["prompts"] = {"kind": prompts, "prompts": 8}
    with run.requests_path.open("w") as f:
        f.writelines(r.model_dump_json() + "\n" for r in requests_for("vllm", "", "p1", "c=4", 8, 0.01))
    summary = summary_of("p1", "c=4", 8, 2.0).model_copy(
        update={"backend": "vllm", "variant": "", "server_metrics": counters}
    )
    run.runs_path.write_text(summary.model_dump_json() + "\n")
    run.manifest["status"] = "complete"
    run.save()
    return RunDir.open(run.path)


HIT = {"prefix_cache_hits_total": 300.0, "prefix_cache_queries_total": 1000.0}


@pytest.mark.parametrize(
    "counters, prompts, dataset, kinds",
    [
        (
            {"preemptions_total": 3.0, "requests_finished_total": 9.0},
            "per_request",
            "random",
            ["preemptions"],
        ),
        ({"preemptions_total": 0.0, "requests_finished_total": 9.0}, "per_request", "random", []),
        (HIT, "per_request", "random", ["prefix-cache hits"]),
        (
            {"prefix_cache_hits_total": 32.0, "prefix_cache_queries_total": 1000.0},
            "per_request",
            "random",
            [],
        ),
        (HIT, "pool", "random", []),  # a pool repeats its prompts (the repeated-prompt warning says so)
        (HIT, "per_request", "prefix", []),  # a dataset of shared prefixes is meant to hit
        (HIT | {"preemptions_total": 1.0}, "per_request", "random", ["preemptions", "prefix-cache hits"]),
        ({}, "per_request", "random", []),  # the server's /metrics was not read
    ],
    ids=["preempted", "none", "hits", "few hits", "pool", "prefix dataset", "both", "unread"],
)
def test_server_counters_warn_of_preemptions_and_prefix_cache_hits(
    tmp_path, counters, prompts, dataset, kinds
):
    run = _counters_run(tmp_path, counters, prompts, dataset)
    assert [q.kind for q in server_counter_qualifiers(run)] == kinds


def test_the_reports_warnings_name_the_servers_counter(tmp_path):
    run = _counters_run(tmp_path, HIT | {"preemptions_total": 3.0})
    warnings = to_markdown(build_blocks(analyze(run, n_boot=50))).split("## Warnings", 1)[1]
    assert "c=4 on vllm (wl): the server preempted 3 sequences during the point" in warnings
    assert "vllm:num_preemptions_total grew by 3" in warnings
    assert "its prefix cache answered 30% of the prompt tokens it looked up" in warnings
    assert "vllm:prefix_cache_hits_total 300 of vllm:prefix_cache_queries_total 1000" in warnings
